"""Model import: ONNX → Graph (static shapes, folded constants, normalised attributes)."""

from stages.extract.errors import ModelError, UnsupportedOpsError
from stages.extract.onnx_import import SUPPORTED, load_model, parse_input_shapes

__all__ = ["SUPPORTED", "ModelError", "UnsupportedOpsError", "load_model", "parse_input_shapes"]

"""Model import: ONNX → Graph (static shapes, folded constants, normalised attributes)."""

from schemas.errors import ModelError, UnsupportedOpsError
from stages.extract.budget import DEFAULT_TENSOR_MB, MIN_CONSTANT_MB
from stages.extract.onnx_import import SUPPORTED, load_model, parse_input_shapes

__all__ = ["DEFAULT_TENSOR_MB", "MIN_CONSTANT_MB", "SUPPORTED", "ModelError", "UnsupportedOpsError", "load_model",
           "parse_input_shapes"]

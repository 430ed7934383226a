"""Element types of normalised nodes' outputs, and which types a tensor may have at run time.

Libraries compute in float32; integer and boolean tensors exist at run time too (token ids, attention
masks, the masks comparisons make), stored as numpy stores them (bool is one byte holding 0 or 1).
Float constants of any width become float32 at import, as the float tensors they meet are.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from schemas.errors import ModelError
from stages.extract.quant_infer import DTYPES as QUANT_DTYPES

RUNTIME_DTYPES = ("float32", "int64", "int32", "bool", "uint8", "int8")
BOOL_RESULT = frozenset({"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Not",
                         "IsNaN", "IsInf"})


def onnx_dtype(elem_type: int) -> str:
    """The numpy name of an ONNX element type (`element type 16` when numpy has none)."""
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except (KeyError, TypeError):
        return f"element type {elem_type}"


def stored(dtype: np.dtype | str) -> str:
    """The type a tensor of `dtype` is kept in: every float type as float32, the rest as it is."""
    d = np.dtype(dtype)
    return "float32" if d.kind == "f" else d.name


def out_dtypes(op: str, ins: list[str], attrs: dict, outputs: int) -> list[str]:
    """Output types of a normalised node from its inputs' types."""
    if op in BOOL_RESULT:
        return ["bool"]
    if op in QUANT_DTYPES:
        return QUANT_DTYPES[op](ins, attrs)
    if op == "Cast":
        return [attrs["to"]]
    if op == "Where":
        return [ins[1]]
    return [ins[0] if ins else "float32"] * outputs


def check_runtime(dtype: str, what: str) -> None:
    """A run-time tensor must have a type the kernels handle; `what` names it in the error."""
    if dtype not in RUNTIME_DTYPES:
        raise ModelError(f"{what} is {dtype} at run time; tunaflow's kernels take {', '.join(RUNTIME_DTYPES)}")

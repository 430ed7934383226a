"""Reading an .onnx file and the external data files it references, each failure one ModelError naming the file.

onnx.load raises a different exception per problem (checker.ValidationError for a missing file or
a location outside the model's directory, ValueError for a short file, OSError for an unreadable
one, RuntimeError for a name too long), and none says which model referenced it; loading tensor
by tensor lets the error say both.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx.external_data_helper import ExternalDataInfo, load_external_data_for_tensor, uses_external_data

from schemas.errors import ModelError


def read_model(path: Path) -> onnx.ModelProto:
    """The model at `path` with every external tensor's data read in from beside it."""
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except DecodeError as exc:
        raise ModelError(f"{path}: not a readable ONNX model ({exc})") from None
    except OSError as exc:
        raise ModelError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    for tensor in _tensors(proto.graph):
        if uses_external_data(tensor):
            _load(tensor, path)
    return proto


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors


def _load(tensor: onnx.TensorProto, model: Path) -> None:
    try:
        location = ExternalDataInfo(tensor).location
    except (ValueError, TypeError) as exc:
        raise ModelError(f"{model}: tensor {tensor.name!r} has malformed external data fields ({exc})") from None
    try:
        load_external_data_for_tensor(tensor, str(model.parent))
    except (OSError, ValueError, RuntimeError, onnx.checker.ValidationError) as exc:
        raise ModelError(f"{model}: cannot read the external data of tensor {tensor.name!r} from {location!r}: "
                         f"{_reason(exc, model.parent, location)}") from None


def _reason(exc: Exception, base: Path, location: str) -> str:
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc)
    rel = Path(location)
    plain = "\x00" not in location and not rel.is_absolute() and ".." not in rel.parts
    return f"{base / rel} does not exist" if plain and not os.path.lexists(base / rel) else str(exc)

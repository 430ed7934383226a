"""Derive the Arrow schema of a pydantic model, field by field, so the log is never described twice.

Mapping: int → int64, float → float64, str → string, bool → bool, IntEnum → int32,
datetime → timestamp[us, UTC], tuple/list → list, nested model → struct. Free-form dicts (knob
values, task attributes) become JSON strings; their fields carry `json` metadata so reading
decodes them back.
"""

from __future__ import annotations

import json
import types
import typing
from datetime import datetime
from enum import IntEnum
from typing import Any

import pyarrow as pa
from pydantic import BaseModel

JSON_META = {b"json": b"1"}


def arrow_schema(model: type[BaseModel], metadata: dict[str, str] | None = None) -> pa.Schema:
    fields = [_field(name, info.annotation) for name, info in model.model_fields.items()]
    return pa.schema(fields, metadata=metadata)


def _field(name: str, annotation: Any) -> pa.Field:
    arrow_type, is_json = _arrow_type(annotation)
    return pa.field(name, arrow_type, nullable=_optional(annotation), metadata=JSON_META if is_json else None)


def _optional(annotation: Any) -> bool:
    return type(None) in typing.get_args(annotation)


def _arrow_type(annotation: Any) -> tuple[pa.DataType, bool]:
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin in (typing.Union, types.UnionType):
        if len(args) == 1:
            return _arrow_type(args[0])
        return pa.string(), True
    if origin is typing.Literal:
        return pa.string(), False
    if origin is dict:
        return pa.string(), True
    if origin in (tuple, list):
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return pa.string(), True
        inner, inner_json = _arrow_type(args[0] if args else str)
        return (pa.string(), True) if inner_json else (pa.list_(inner), False)
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return pa.struct([_field(n, i.annotation) for n, i in annotation.model_fields.items()]), False
        if issubclass(annotation, IntEnum):
            return pa.int32(), False
        if issubclass(annotation, bool):
            return pa.bool_(), False
        if issubclass(annotation, int):
            return pa.int64(), False
        if issubclass(annotation, float):
            return pa.float64(), False
        if issubclass(annotation, str):
            return pa.string(), False
        if issubclass(annotation, datetime):
            return pa.timestamp("us", tz="UTC"), False
    raise TypeError(f"no Arrow type for annotation {annotation!r}")


def to_row(value: Any, field_type: pa.DataType, is_json: bool) -> Any:
    """Python (model_dump(mode='python')) value → what pa.Table.from_pylist expects."""
    if value is None:
        return None
    if is_json:
        return json.dumps(value, default=_json_default)
    if pa.types.is_struct(field_type):
        return {
            f.name: to_row(value[f.name], f.type, f.metadata == JSON_META)
            for f in field_type
        }
    if pa.types.is_list(field_type):
        vf = field_type.value_field
        return [to_row(v, vf.type, vf.metadata == JSON_META) for v in value]
    if isinstance(value, IntEnum):
        return int(value)
    return value


def from_row(value: Any, field_type: pa.DataType, is_json: bool) -> Any:
    if value is None:
        return None
    if is_json:
        return json.loads(value)
    if pa.types.is_struct(field_type):
        return {f.name: from_row(value[f.name], f.type, f.metadata == JSON_META) for f in field_type}
    if pa.types.is_list(field_type):
        vf = field_type.value_field
        return [from_row(v, vf.type, vf.metadata == JSON_META) for v in value]
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")

"""Every text field of a model must be text: protobuf hands a string field whose bytes are not UTF-8 back as
`bytes` instead of failing the parse, and a name or op type of the wrong type then breaks code far from the
file (a sort of op types, a dict of value names). One walk at import turns it into a ModelError naming the field.
"""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from schemas.errors import ModelError

_WALKED = (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE)


def check_text_fields(proto: Message, source: str) -> None:
    """Raise a ModelError naming `source` and the first string field (e.g. `graph.node[1].op_type`) that is
    not UTF-8."""
    if (bad := _first_bytes(proto, "")) is not None:
        at, value = bad
        raise ModelError(f"{source}: {at} is not valid UTF-8 text ({value[:40]!r}); the file is damaged")


def _first_bytes(proto: Message, where: str) -> tuple[str, bytes] | None:
    for field, value in proto.ListFields():
        if field.type not in _WALKED:
            continue
        path = f"{where}.{field.name}" if where else field.name
        for i, item in enumerate(value) if field.is_repeated else [(None, value)]:
            at = path if i is None else f"{path}[{i}]"
            if isinstance(item, bytes):
                return at, item
            if field.type == FieldDescriptor.TYPE_MESSAGE and (bad := _first_bytes(item, at)) is not None:
                return bad
    return None

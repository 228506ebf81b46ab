"""Structure-aware mutations of protobuf messages and message streams, for fuzzing.

Starting from a *valid* request (a signed enrolment, a signed update stream, a
peer's signed push), one mutation changes it the way a hostile or broken sender
would, most often leaving it valid protobuf so that it reaches the handler's
own checks rather than the parser:

- a field: an extreme value for its type (``int64`` bounds, NaN and infinities,
  empty, whitespace, control characters or 100,000-character strings, large
  bytes, unknown enum numbers), cleared, or sent twice with another value
  (protobuf keeps the last), or with the wrong wire type or an out-of-range
  varint (which no longer parses);
- a repeated field or map: thousands of elements (bounded by a byte budget);
- a oneof: both members at once, or neither;
- the message: unknown fields appended, or replaced by another message type;
- a stream: truncated, extended (another data chunk, a second header), chunks
  dropped, duplicated, swapped or reversed, or emptied;
- bytes: a flipped bit, a cut or a random insertion
  (:func:`fedplat.testing.peer.mutate_messages`).

Each mutation returns the serialized messages and the name of the operation, so
a fuzzer can count outcomes per operation.
"""

from __future__ import annotations

import copy
import math
import random
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from google.protobuf.descriptor import FieldDescriptor as FD
from google.protobuf.message import Message

from fedplat.testing.peer import mutate_messages

__all__ = ["Mutated", "mutate_message", "mutate_stream"]

#: Largest message a mutation builds on purpose (gRPC's default receive limit
#: is 4 MiB; some mutations go past it to exercise that limit too).
BYTE_BUDGET = 6 * 1024 * 1024

_INT_RANGES = {
    FD.TYPE_INT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FD.TYPE_INT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FD.TYPE_UINT32: (0, 2**32 - 1),
    FD.TYPE_FIXED32: (0, 2**32 - 1),
    FD.TYPE_UINT64: (0, 2**64 - 1),
    FD.TYPE_FIXED64: (0, 2**64 - 1),
}
_FLOATS = (math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324, -0.0, 3.4e38)
_STRINGS = (
    "",
    " ",
    "\t\n",
    "\x00nul",
    "\u202eevil",
    "é" * 40,
    "../../etc/passwd",
    "x" * 300,
    "y" * 100_000,
)


@dataclass(frozen=True)
class Mutated:
    """The messages to send (serialized) and what was done to them."""

    messages: list[bytes]
    op: str


# ------------------------------------------------------------ wire format


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative numbers as protobuf encodes them
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _raw_field(number: int, wire: int, payload: bytes | int) -> bytes:
    """One field on the wire: varint (0), 64-bit (1), length-delimited (2) or
    32-bit (5), whatever the field's declared type."""
    if wire == 0:
        assert isinstance(payload, int)
        return _key(number, 0) + _varint(payload)
    assert isinstance(payload, bytes)
    if wire == 2:
        return _key(number, 2) + _varint(len(payload)) + payload
    return _key(number, wire) + payload


# ------------------------------------------------------------ field values


def _extreme(fd: FD, rng: random.Random) -> object:
    if fd.type in _INT_RANGES:
        lo, hi = _INT_RANGES[fd.type]
        return rng.choice([lo, hi, 0, -1 if lo < 0 else 1, hi // 2, lo + 1])
    if fd.type in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
        v = rng.choice(_FLOATS)
        return v if fd.type == FD.TYPE_DOUBLE or not math.isfinite(v) else 3.4e38
    if fd.type == FD.TYPE_BOOL:
        return rng.random() < 0.5
    if fd.type == FD.TYPE_STRING:
        return rng.choice(_STRINGS)
    if fd.type == FD.TYPE_BYTES:
        n = rng.choice([0, 1, 31, 33, 64, 4096, 1 << 20])
        return rng.randbytes(n)
    if fd.type == FD.TYPE_ENUM:
        return rng.choice([-1, 99, 2**31 - 1])
    raise TypeError(f"no extreme value for field type {fd.type}")


def _is_map(fd: FD) -> bool:
    return fd.message_type is not None and fd.message_type.GetOptions().map_entry


def _fields(msg: Message, depth: int = 0) -> list[tuple[Message, FD]]:
    """Every (message, field) pair reachable from ``msg``: its own fields and
    those of set sub-messages and of the first few elements of repeated message
    fields (maps are fields of their parent, not messages to descend into)."""
    out = [(msg, fd) for fd in msg.DESCRIPTOR.fields]
    if depth >= 3:
        return out
    for fd in msg.DESCRIPTOR.fields:
        if fd.type != FD.TYPE_MESSAGE or _is_map(fd):
            continue
        if fd.is_repeated:
            for sub in list(getattr(msg, fd.name))[:3]:
                out += _fields(sub, depth + 1)
        elif msg.HasField(fd.name):
            out += _fields(getattr(msg, fd.name), depth + 1)
    return out


# ------------------------------------------------------------ message ops


def _op_extreme(msg: Message, rng: random.Random) -> str:
    parent, fd = rng.choice(_scalar_fields(msg))
    value = _extreme(fd, rng)
    if fd.is_repeated:
        getattr(parent, fd.name).append(value)
    else:
        setattr(parent, fd.name, value)
    return f"extreme:{fd.name}"


def _scalar_fields(msg: Message) -> list[tuple[Message, FD]]:
    found = [(m, fd) for m, fd in _fields(msg) if fd.type != FD.TYPE_MESSAGE]
    return found or [(msg, fd) for fd in msg.DESCRIPTOR.fields][:1]


def _op_clear(msg: Message, rng: random.Random) -> str:
    parent, fd = rng.choice(_fields(msg))
    parent.ClearField(fd.name)
    return f"clear:{fd.name}"


def _op_huge_repeated(msg: Message, rng: random.Random) -> str:
    """Thousands of elements in a repeated field or map, merged in from the
    wire format (fast even for 100,000 elements)."""
    repeated = [(m, fd) for m, fd in _fields(msg) if fd.is_repeated]
    if not repeated:
        return _op_extreme(msg, rng)
    parent, fd = rng.choice(repeated)
    n = rng.choice([1_000, 10_000, 100_000])
    if _is_map(fd):
        vt = fd.message_type.fields_by_name["value"]
        value = _raw_field(2, _WIRE_OF.get(vt.type, 0), _filler_wire(vt, rng))
        n = min(n, BYTE_BUDGET // (len(value) + 12))
        blob = b"".join(
            _raw_field(fd.number, 2, _raw_field(1, 2, b"k%d" % i) + value)
            for i in range(n)
        )
    else:
        field = getattr(parent, fd.name)
        if fd.type == FD.TYPE_MESSAGE:
            one: bytes | int = field[0].SerializeToString() if len(field) else b""
        else:
            one = _filler_wire(fd, rng)
        element = _raw_field(fd.number, _WIRE_OF.get(fd.type, 0), one)
        n = min(n, BYTE_BUDGET // len(element))
        blob = element * n
    parent.MergeFromString(blob)
    return f"huge_repeated:{fd.name}:{n}"


def _filler_wire(fd: FD, rng: random.Random) -> bytes | int:
    """An element's payload as it goes on the wire."""
    wire = _WIRE_OF.get(fd.type, 0)
    if wire == 0:
        return rng.choice([0, 1, 2**31 - 1])
    if wire == 1:
        return struct.pack("<d", rng.choice(_FLOATS))
    if wire == 5:
        return struct.pack("<f", 1.0)
    return rng.choice([b"", b"s", b"x" * 100])


def _op_wrong_oneof(msg: Message, rng: random.Random) -> bytes | None:
    """Both members of a oneof on the wire (parsing keeps the last), or none."""
    oneofs = msg.DESCRIPTOR.oneofs
    if not oneofs:
        return None
    members = list(rng.choice(oneofs).fields)
    if rng.random() < 0.3:
        return b""  # neither member
    parts = []
    for fd in rng.sample(members, len(members)):
        single = type(msg)()
        if fd.type == FD.TYPE_MESSAGE:
            src = getattr(msg, fd.name) if msg.HasField(fd.name) else None
            target = getattr(single, fd.name)
            if src is not None:
                target.CopyFrom(src)
            else:
                target.SetInParent()
        else:
            setattr(single, fd.name, _extreme(fd, rng))
        parts.append(single.SerializeToString())
    return b"".join(parts)


_WIRE_OF = {
    FD.TYPE_DOUBLE: 1,
    FD.TYPE_FIXED64: 1,
    FD.TYPE_SFIXED64: 1,
    FD.TYPE_FLOAT: 5,
    FD.TYPE_FIXED32: 5,
    FD.TYPE_SFIXED32: 5,
    FD.TYPE_STRING: 2,
    FD.TYPE_BYTES: 2,
    FD.TYPE_MESSAGE: 2,
}


def _op_raw_field(msg: Message, rng: random.Random) -> tuple[bytes, str]:
    """Append one crafted field: a second value (last wins), the wrong wire
    type, a 10-byte varint, an unknown field number, or a length running past
    the end of the message."""
    base = msg.SerializeToString()
    fd = rng.choice(msg.DESCRIPTOR.fields)
    wire = _WIRE_OF.get(fd.type, 0)
    kind = rng.choice(["again", "wrong_wire", "big_varint", "unknown", "overrun"])
    if kind == "again":
        single = type(msg)()
        if fd.type == FD.TYPE_MESSAGE or fd.is_repeated:
            return base + base, "duplicate:message"
        setattr(single, fd.name, _extreme(fd, rng))
        return base + single.SerializeToString(), f"duplicate:{fd.name}"
    if kind == "wrong_wire":
        other = rng.choice([w for w in (0, 1, 2, 5) if w != wire])
        payload: bytes | int = (
            rng.getrandbits(64) if other == 0 else rng.randbytes(8 if other == 1 else 4)
        )
        if other == 2:
            payload = rng.randbytes(rng.randrange(0, 16))
        return base + _raw_field(fd.number, other, payload), f"wrong_wire:{fd.name}"
    if kind == "big_varint":
        return base + _key(fd.number, 0) + b"\xff" * 9 + b"\x01", "big_varint"
    if kind == "unknown":
        number = rng.choice([15, 99, 2**29 - 1])
        junk = _raw_field(number, 2, rng.randbytes(rng.randrange(1, 2048)))
        return base + junk, "unknown_field"
    return base + _key(fd.number, 2) + _varint(1 << 30) + b"abc", "length_overrun"


def mutate_message(
    msg: Message, rng: random.Random, others: Sequence[Message] = ()
) -> Mutated:
    """One structure-aware mutation of a valid message (see the module
    docstring); ``others`` are messages of other types for type confusion."""
    m = copy.deepcopy(msg)
    op = rng.choice(
        ["extreme"] * 4
        + ["clear"] * 2
        + ["huge_repeated", "wrong_oneof", "raw_field", "raw_field", "bytes"]
        + (["other_type"] if others else [])
    )
    if op == "wrong_oneof":
        raw = _op_wrong_oneof(m, rng)
        if raw is not None:
            return Mutated([raw], "wrong_oneof")
        op = "extreme"
    if op == "raw_field":
        raw, name = _op_raw_field(m, rng)
        return Mutated([raw], name)
    if op == "bytes":
        out = mutate_messages([m.SerializeToString()], rng)
        return Mutated(out or [b""], "bytes")
    if op == "other_type":
        return Mutated([rng.choice(list(others)).SerializeToString()], "other_type")
    ops: dict[str, Callable[[Message, random.Random], str]] = {
        "extreme": _op_extreme,
        "clear": _op_clear,
        "huge_repeated": _op_huge_repeated,
    }
    name = ops[op](m, rng)
    return Mutated([m.SerializeToString()], name)


# ------------------------------------------------------------ stream ops


def mutate_stream(
    stream: Sequence[Message], rng: random.Random, data_field: str = "data"
) -> Mutated:
    """One mutation of a valid stream of chunk messages (a header, then
    ``data`` chunks): of its structure, or of one message in it."""
    msgs = [m.SerializeToString() for m in stream]
    op = rng.choice(
        [
            "truncate",
            "extend",
            "second_header",
            "reorder",
            "reverse",
            "duplicate_chunk",
            "drop_header",
            "only_header",
            "empty",
            "resize_chunk",
            "message",
            "message",
            "message",
            "bytes",
        ]
    )
    if op == "truncate" and len(msgs) > 1:
        return Mutated(msgs[: rng.randrange(1, len(msgs))], op)
    if op == "extend":
        extra = type(stream[0])()
        setattr(extra, data_field, rng.randbytes(rng.choice([1, 4, 1024, 65536])))
        return Mutated([*msgs, extra.SerializeToString()], op)
    if op == "second_header":
        at = rng.randrange(1, len(msgs) + 1)
        return Mutated([*msgs[:at], msgs[0], *msgs[at:]], op)
    if op == "reorder" and len(msgs) > 2:
        i, j = rng.sample(range(1, len(msgs)), 2)
        msgs[i], msgs[j] = msgs[j], msgs[i]
        return Mutated(msgs, op)
    if op == "reverse":
        return Mutated(msgs[::-1], op)
    if op == "duplicate_chunk" and len(msgs) > 1:
        i = rng.randrange(1, len(msgs))
        return Mutated([*msgs[: i + 1], msgs[i], *msgs[i + 1 :]], op)
    if op == "drop_header":
        return Mutated(msgs[1:], op)
    if op == "only_header":
        return Mutated(msgs[:1], op)
    if op == "empty":
        return Mutated([], op)
    if op == "resize_chunk" and len(msgs) > 1:
        i = rng.randrange(1, len(msgs))
        chunk = type(stream[0])()
        data = getattr(stream[i], data_field)
        cut = data[: rng.randrange(len(data) + 1)] if rng.random() < 0.5 else data * 2
        setattr(chunk, data_field, cut)
        msgs[i] = chunk.SerializeToString()
        return Mutated(msgs, op)
    if op == "bytes":
        return Mutated(mutate_messages(msgs, rng), "stream_bytes")
    i = 0 if rng.random() < 0.7 else rng.randrange(len(msgs))
    inner = mutate_message(stream[i], rng)
    return Mutated([*msgs[:i], *inner.messages, *msgs[i + 1 :]], f"chunk:{inner.op}")

"""Streams of the coordinator protocol: model downloads and update uploads.

Downloads are serialized once per model version (:func:`model_messages`) and
received straight into the client's model vector (:func:`receive_model`); an
upload's data chunks reach the coordinator as views of the received bytes
(:func:`parse_update_chunk`, the servicer's request deserializer). Other bodies
(the gossip peers' models) land in a :class:`BodyBuffer`, preallocated to the
declared size and hashed as chunks arrive. Byte counts
(:func:`model_wire_bytes`, :func:`update_wire_bytes`) are every byte of the
messages, gRPC's 5-byte framing included.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
from google.protobuf.message import DecodeError, Message

from fedplat.proto import fedplat_pb2 as pb
from fedplat.proto.serde import (
    MAX_LAYOUT_TENSORS,
    check_bytes,
    check_examples,
    check_name,
    finite_metrics,
    layout_from_proto,
    layout_to_proto,
)
from fedplat.protocol.body import EncodedBody
from fedplat.protocol.errors import InvalidArgument
from fedplat.protocol.messages import DENSE_F32, PAYLOAD_V1, ModelPayload, UpdateHeader
from fedplat.vectors import Layout

# -- framing -------------------------------------------------------------------------

#: gRPC's length-prefixed message framing: 1 flag byte + 4 length bytes.
GRPC_FRAME_BYTES = 5


def _varint_len(n: int) -> int:
    out = 1
    while n >= 0x80:
        n >>= 7
        out += 1
    return out


def data_message_size(nbytes: int) -> int:
    """Serialized size of a ``ModelChunk``/``UpdateChunk`` carrying ``nbytes`` of
    data (field 2, length-delimited)."""
    return 1 + _varint_len(nbytes) + nbytes


def _chunk_sizes(total: int, chunk_bytes: int) -> Iterator[int]:
    for start in range(0, total, chunk_bytes):
        yield min(chunk_bytes, total - start)


# -- model download (server stream) -------------------------------------------------


def model_header_message(payload: ModelPayload) -> pb.ModelChunk:
    return pb.ModelChunk(
        header=pb.ModelHeader(
            model_version=payload.model_version,
            round=payload.round,
            layout=layout_to_proto(payload.layout),
            total_bytes=len(payload.data),
            sha256=payload.sha256,
            encoding=payload.encoding,
        )
    )


def model_messages(payload: ModelPayload, chunk_bytes: int) -> list[bytes]:
    """The serialized download stream, built once per model version and sent
    as-is to every client (the servicer's response serializer passes bytes)."""
    out = [model_header_message(payload).SerializeToString()]
    view = memoryview(payload.data).cast("B")
    for start in range(0, len(view), chunk_bytes):
        out.append(data_message(view[start : start + chunk_bytes]))
    return out


def model_wire_bytes(payload: ModelPayload, chunk_bytes: int) -> int:
    """Every byte of the download's messages, gRPC framing included."""
    header = model_header_message(payload).ByteSize() + GRPC_FRAME_BYTES
    return header + sum(
        data_message_size(n) + GRPC_FRAME_BYTES
        for n in _chunk_sizes(len(payload.data), chunk_bytes)
    )


def model_to_chunks(payload: ModelPayload, chunk_bytes: int) -> Iterator[pb.ModelChunk]:
    yield model_header_message(payload)
    view = memoryview(payload.data)
    for start in range(0, len(view), chunk_bytes):
        yield pb.ModelChunk(data=bytes(view[start : start + chunk_bytes]))


@dataclass(frozen=True)
class ModelInfo:
    model_version: int
    round: int
    layout: Layout
    encoding: str


def receive_model(
    chunks: Iterator[pb.ModelChunk | memoryview | Malformed],
    out: torch.Tensor,
    max_bytes: int,
) -> ModelInfo:
    """Stream a downloaded model straight into ``out`` (``[d]`` float32); checks
    the declared size against ``out``, the framing and the SHA-256. Data chunks
    may arrive parsed or as views (:func:`parse_model_chunk`)."""
    it = iter(chunks)
    first = next(it, None)
    if not isinstance(first, pb.ModelChunk) or first.WhichOneof("part") != "header":
        raise InvalidArgument("model stream must start with a header")
    h = first.header
    if h.encoding not in ("", DENSE_F32):
        raise InvalidArgument(f"unknown model encoding {h.encoding!r}")
    need = 4 * out.numel()
    if h.total_bytes != need or h.total_bytes > max_bytes:
        raise InvalidArgument(
            f"model of {h.total_bytes} bytes; this client's model needs {need}"
        )
    dest = out.view(torch.uint8).numpy()
    digest = hashlib.sha256()
    at = 0
    for c in it:
        if isinstance(c, pb.ModelChunk) and c.WhichOneof("part") == "data":
            data: bytes | memoryview = c.data
        elif isinstance(c, memoryview):
            data = c
        else:
            raise InvalidArgument("model stream has a second header or bad bytes")
        n = len(data)
        if at + n > need:
            raise InvalidArgument(f"model stream longer than its declared {need} bytes")
        dest[at : at + n] = np.frombuffer(data, dtype=np.uint8)
        digest.update(data)
        at += n
    if at != need:
        raise InvalidArgument(f"model stream truncated: {at} of {need} bytes")
    if digest.hexdigest() != h.sha256:
        raise InvalidArgument("model checksum mismatch (corrupted or truncated)")
    return ModelInfo(
        int(h.model_version),
        int(h.round),
        layout_from_proto(h.layout),
        h.encoding or DENSE_F32,
    )


class BodyBuffer:
    """Collects a stream's payload into a preallocated ``bytearray``.

    Parameters
    ----------
    declared : int
        Bytes the header announced (already bounded by the caller).
    sha256 : str
        Hex digest the header announced.
    what : str
        Names the stream in error messages (``"model"``, ``"update"``).
    """

    def __init__(self, declared: int, sha256: str, what: str) -> None:
        self.declared = declared
        self.sha256 = sha256
        self.what = what
        self.buf = bytearray(declared)
        self.pos = 0
        self._hash = hashlib.sha256()

    def add(self, data: bytes | memoryview) -> None:
        """Append one chunk; refuses a stream growing past its declared size."""
        end = self.pos + len(data)
        if end > self.declared:
            raise InvalidArgument(
                f"{self.what} stream longer than its declared {self.declared} bytes"
            )
        self.buf[self.pos : end] = data
        self._hash.update(data)
        self.pos = end

    def finish(self) -> bytearray:
        """The whole body, once its length and checksum match the header."""
        if self.pos != self.declared:
            raise InvalidArgument(
                f"{self.what} stream has {self.pos} bytes, header declared "
                f"{self.declared} (truncated)"
            )
        if self._hash.hexdigest() != self.sha256:
            raise InvalidArgument(
                f"{self.what} checksum mismatch (corrupted or truncated)"
            )
        return self.buf


def read_body(rest: Iterator[Any], declared: int, sha256: str, what: str) -> bytes:
    """Read the ``data`` parts that follow a stream's header into one body.

    ``rest`` yields the messages after the header (any message with a ``part``
    oneof of ``header``/``data``). Refuses a second header, more or fewer bytes
    than ``declared``, and a SHA-256 mismatch.
    """
    body = BodyBuffer(declared, sha256, what)
    for c in rest:
        if c.WhichOneof("part") != "data":
            raise InvalidArgument(f"{what} stream has a second header")
        body.add(c.data)
    return bytes(body.finish())


# -- update upload (client stream) --------------------------------------------------


def update_header_to_proto(h: UpdateHeader) -> pb.UpdateHeader:
    return pb.UpdateHeader(
        task_id=h.task_id,
        round=h.round,
        num_examples=h.num_examples,
        layout=layout_to_proto(h.layout),
        encoding=h.encoding,
        total_bytes=h.total_bytes,
        sha256=h.sha256,
        metrics=dict(h.metrics),
        signature=h.signature,
    )


def update_header_from_proto(
    msg: pb.UpdateHeader, max_tensors: int = MAX_LAYOUT_TENSORS
) -> UpdateHeader:
    if not msg.task_id:
        raise InvalidArgument("update header has no task id")
    if msg.total_bytes < 0:
        raise InvalidArgument("total_bytes must be >= 0")
    if msg.encoding_params:
        raise InvalidArgument("encoding parameters are not accepted")
    return UpdateHeader(
        task_id=check_name(msg.task_id, "task id"),
        round=int(msg.round),
        num_examples=check_examples(msg.num_examples),
        layout=layout_from_proto(msg.layout, max_tensors),
        total_bytes=int(msg.total_bytes),
        sha256=check_name(msg.sha256, "sha256"),
        encoding=check_name(msg.encoding or PAYLOAD_V1, "encoding"),
        metrics=finite_metrics(msg.metrics, "metrics"),
        signature=check_bytes(msg.signature, "signature", 128),
    )


def update_to_chunks(
    header: UpdateHeader, body: EncodedBody, chunk_bytes: int
) -> Iterator[pb.UpdateChunk]:
    yield pb.UpdateChunk(header=update_header_to_proto(header))
    for piece in body.chunks(chunk_bytes):
        yield pb.UpdateChunk(data=bytes(piece))


def data_message(piece: bytes | memoryview) -> bytes:
    """The serialized chunk message (``data = 2``) carrying ``piece``: the same
    bytes protobuf would write, made with one copy of the payload."""
    n = len(piece)
    prefix = bytearray([0x12])
    while n >= 0x80:
        prefix.append((n & 0x7F) | 0x80)
        n >>= 7
    prefix.append(n)
    return b"".join((prefix, piece))


def update_messages(
    header: UpdateHeader, body: EncodedBody, chunk_bytes: int
) -> Iterator[bytes]:
    """:func:`update_to_chunks`, serialized (for a bytes-passing request
    serializer): one copy of each payload piece instead of three."""
    yield pb.UpdateChunk(header=update_header_to_proto(header)).SerializeToString()
    for piece in body.chunks(chunk_bytes):
        yield data_message(piece)


def update_wire_bytes(header: UpdateHeader, nbytes: int, chunk_bytes: int) -> int:
    """Every byte of an upload's messages, gRPC framing included."""
    head = pb.UpdateChunk(header=update_header_to_proto(header)).ByteSize()
    return (
        head
        + GRPC_FRAME_BYTES
        + sum(
            data_message_size(n) + GRPC_FRAME_BYTES
            for n in _chunk_sizes(nbytes, chunk_bytes)
        )
    )


@dataclass(frozen=True)
class Malformed:
    """A message that did not parse (the servicer answers INVALID_ARGUMENT)."""

    reason: str
    size: int


def _data_view(raw: bytes) -> memoryview | None:
    """The payload of a chunk message that holds only field 2 (``data``,
    length-delimited), as a view of ``raw``; ``None`` for anything else."""
    n = len(raw)
    if n >= 2 and raw[0] == 0x12:
        length, shift, i = 0, 0, 1
        while i < n and i < 11:
            b = raw[i]
            length |= (b & 0x7F) << shift
            i += 1
            if b < 0x80:
                return memoryview(raw)[i:] if i + length == n else None
            shift += 7
    return None


def parse_chunk(
    cls: type[M], raw: bytes, header_limit: int | None = None
) -> M | memoryview | Malformed:
    """The request deserializer of a chunked stream (``oneof part {header = 1;
    data = 2}``: ``UpdateChunk``, the peers' ``ModelChunk``): a data chunk comes
    back as a view of the received bytes (no copy), a header as a parsed
    message, and anything unparsable (or, with ``header_limit``, a header larger
    than that, before parsing) as :class:`Malformed` instead of gRPC's logged
    traceback."""
    view = _data_view(raw)
    if view is not None:
        return view
    if header_limit is not None and len(raw) > header_limit:
        return Malformed(
            f"{cls.__name__} header of {len(raw)} bytes exceeds its "
            f"{header_limit}-byte bound",
            len(raw),
        )
    return parse_or_malformed(cls, raw)


def parse_update_chunk(raw: bytes) -> pb.UpdateChunk | memoryview | Malformed:
    """:func:`parse_chunk` for ``UploadUpdate``."""
    return parse_chunk(pb.UpdateChunk, raw)


def parse_model_chunk(raw: bytes) -> pb.ModelChunk | memoryview | Malformed:
    """:func:`parse_chunk` for ``DownloadModel`` (the client's response
    deserializer)."""
    return parse_chunk(pb.ModelChunk, raw)


M = TypeVar("M", bound=Message)


def parse_or_malformed(cls: type[M], raw: bytes) -> M | Malformed:
    try:
        return cls.FromString(raw)
    except DecodeError as exc:
        return Malformed(f"malformed {cls.__name__} message: {exc}", len(raw))

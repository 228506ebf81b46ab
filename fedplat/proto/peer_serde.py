"""Protobuf conversion of the gossip peer protocol (``peer.proto``).

Paired ``x_to_proto`` / ``x_from_proto`` functions. The ``*_from_proto`` ones face
the network: they check every field's shape and size and raise
:class:`~fedplat.protocol.errors.InvalidArgument` with a reason; whether a
message is *allowed* (membership, signature, freshness) is decided by
:mod:`fedplat.gossip.guard`. A model stream is refused from its header alone
when it declares more bytes than the receiver accepts, and while streaming as
soon as it grows past what it declared.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

from fedplat.proto import peer_pb2 as pb
from fedplat.proto.serde import layout_from_proto, layout_to_proto
from fedplat.proto.streams import BodyBuffer
from fedplat.protocol.errors import InvalidArgument, ResourceExhausted
from fedplat.protocol.peer import (
    NONCE_BYTES,
    CallAuth,
    Hello,
    HelloReply,
    ModelHeader,
    ModelMessage,
    NeighbourView,
    PeerAddress,
    PeerStatus,
    PingReply,
    PushReply,
)
from fedplat.security.identity import SIGNATURE_BYTES

MAX_NAME_LEN = 256
MAX_KNOWN_PEERS = 1024
MAX_STATUS_KINDS = 256


def _name(value: str, what: str, *, required: bool = True) -> str:
    if required and not value:
        raise InvalidArgument(f"{what} is empty")
    if len(value) > MAX_NAME_LEN:
        raise InvalidArgument(f"{what} longer than {MAX_NAME_LEN} characters")
    return value


def _nonneg(value: int, what: str) -> int:
    if value < 0:
        raise InvalidArgument(f"{what} must be >= 0, got {value}")
    return int(value)


def _nonce(value: bytes, what: str = "nonce") -> bytes:
    if len(value) != NONCE_BYTES:
        raise InvalidArgument(f"{what} must be {NONCE_BYTES} bytes, got {len(value)}")
    return bytes(value)


def _signature(value: bytes) -> bytes:
    # An empty or wrong signature is an authentication failure, decided later;
    # here only its size is bounded.
    if len(value) > SIGNATURE_BYTES:
        raise InvalidArgument(f"signature longer than {SIGNATURE_BYTES} bytes")
    return bytes(value)


# ------------------------------------------------------------------ peers


def peer_to_proto(p: PeerAddress) -> pb.PeerInfo:
    return pb.PeerInfo(node_id=p.node_id, address=p.address)


def peer_from_proto(msg: pb.PeerInfo) -> PeerAddress:
    return PeerAddress(_name(msg.node_id, "node id"), _name(msg.address, "address"))


def hello_to_proto(h: Hello) -> pb.HelloRequest:
    return pb.HelloRequest(
        sender=peer_to_proto(h.sender),
        round=h.round,
        layout_fingerprint=h.layout_fingerprint,
        want_link=h.want_link,
        receiver_id=h.receiver_id,
        timestamp_ms=h.timestamp_ms,
        nonce=h.nonce,
        signature=h.signature,
    )


def hello_from_proto(msg: pb.HelloRequest) -> Hello:
    return Hello(
        peer_from_proto(msg.sender),
        _nonneg(msg.round, "round"),
        _name(msg.layout_fingerprint, "layout fingerprint"),
        bool(msg.want_link),
        _name(msg.receiver_id, "receiver id", required=False),
        _nonneg(msg.timestamp_ms, "timestamp"),
        _nonce(msg.nonce),
        _signature(msg.signature),
    )


def hello_reply_to_proto(r: HelloReply) -> pb.HelloResponse:
    return pb.HelloResponse(
        responder=peer_to_proto(r.responder),
        round=r.round,
        layout_fingerprint=r.layout_fingerprint,
        linked=r.linked,
        known=[peer_to_proto(p) for p in r.known],
        request_nonce=r.request_nonce,
        signature=r.signature,
    )


def hello_reply_from_proto(msg: pb.HelloResponse) -> HelloReply:
    if len(msg.known) > MAX_KNOWN_PEERS:
        raise InvalidArgument(f"more than {MAX_KNOWN_PEERS} known peers")
    return HelloReply(
        peer_from_proto(msg.responder),
        _nonneg(msg.round, "round"),
        _name(msg.layout_fingerprint, "layout fingerprint"),
        bool(msg.linked),
        tuple(peer_from_proto(p) for p in msg.known),
        _nonce(msg.request_nonce, "request nonce"),
        _signature(msg.signature),
    )


def call_to_proto(c: CallAuth) -> pb.CallAuth:
    return pb.CallAuth(
        sender_id=c.sender_id,
        receiver_id=c.receiver_id,
        round=c.round,
        timestamp_ms=c.timestamp_ms,
        nonce=c.nonce,
        signature=c.signature,
    )


def call_from_proto(msg: pb.CallAuth) -> CallAuth:
    return CallAuth(
        _name(msg.sender_id, "sender id"),
        _name(msg.receiver_id, "receiver id", required=False),
        _nonneg(msg.round, "round"),
        _nonneg(msg.timestamp_ms, "timestamp"),
        _nonce(msg.nonce),
        _signature(msg.signature),
    )


def ping_reply_to_proto(r: PingReply) -> pb.PingResponse:
    return pb.PingResponse(node_id=r.node_id, round=r.round, degree=r.degree)


def ping_reply_from_proto(msg: pb.PingResponse) -> PingReply:
    return PingReply(
        _name(msg.node_id, "node id"),
        _nonneg(msg.round, "round"),
        _nonneg(msg.degree, "degree"),
    )


# ------------------------------------------------------------------ models


def model_header_to_proto(h: ModelHeader) -> pb.ModelHeader:
    return pb.ModelHeader(
        sender_id=h.sender_id,
        round=h.round,
        layout=layout_to_proto(h.layout),
        num_examples=h.num_examples,
        degree=h.degree,
        push_weight=h.push_weight,
        base_version=h.base_version,
        version=h.version,
        total_bytes=h.total_bytes,
        sha256=h.sha256,
        receiver_id=h.receiver_id,
        timestamp_ms=h.timestamp_ms,
        nonce=h.nonce,
        signature=h.signature,
    )


def model_header_from_proto(msg: pb.ModelHeader) -> ModelHeader:
    if not math.isfinite(msg.push_weight) or msg.push_weight < 0:
        raise InvalidArgument(
            f"push weight must be finite and >= 0, got {msg.push_weight}"
        )
    return ModelHeader(
        sender_id=_name(msg.sender_id, "sender id"),
        round=_nonneg(msg.round, "round"),
        layout=layout_from_proto(msg.layout),
        num_examples=_nonneg(msg.num_examples, "num_examples"),
        degree=_nonneg(msg.degree, "degree"),
        push_weight=float(msg.push_weight),
        base_version=_name(msg.base_version, "base version", required=False),
        version=_name(msg.version, "version", required=False),
        total_bytes=_nonneg(msg.total_bytes, "total_bytes"),
        sha256=_name(msg.sha256, "sha256"),
        receiver_id=_name(msg.receiver_id, "receiver id", required=False),
        timestamp_ms=_nonneg(msg.timestamp_ms, "timestamp"),
        nonce=_nonce(msg.nonce),
        signature=_signature(msg.signature),
    )


def check_model_size(header: ModelHeader, max_bytes: int) -> None:
    """Refuse a model declaring more bytes than ``max_bytes`` (before any body)."""
    if header.total_bytes > max_bytes:
        raise ResourceExhausted(
            f"oversize model: {header.total_bytes} bytes declared, limit is {max_bytes}"
        )


def model_to_chunks(msg: ModelMessage, chunk_bytes: int) -> Iterator[pb.ModelChunk]:
    """A header chunk, then the payload in pieces of at most ``chunk_bytes``."""
    yield pb.ModelChunk(header=model_header_to_proto(msg.header))
    view = memoryview(msg.data)
    for start in range(0, len(view), chunk_bytes):
        yield pb.ModelChunk(data=bytes(view[start : start + chunk_bytes]))


def first_model_header(chunk: pb.ModelChunk) -> ModelHeader:
    """The header a model stream must start with."""
    if chunk.WhichOneof("part") != "header":
        raise InvalidArgument("model stream must start with a header")
    return model_header_from_proto(chunk.header)


def model_data(chunk: pb.ModelChunk) -> bytes:
    """The payload bytes of a chunk after the header."""
    if chunk.WhichOneof("part") != "data":
        raise InvalidArgument("model stream has a second header")
    return chunk.data


def model_from_chunks(chunks: Iterable[pb.ModelChunk], max_bytes: int) -> ModelMessage:
    """Reassemble a model stream; refuses oversize, truncated or corrupted ones.

    Raises
    ------
    InvalidArgument
        No header first, a second header, more or fewer bytes than declared, or
        a checksum mismatch.
    ResourceExhausted
        More than ``max_bytes`` declared.
    """
    it = iter(chunks)
    first = next(it, None)
    if first is None:
        raise InvalidArgument("model stream must start with a header")
    header = first_model_header(first)
    check_model_size(header, max_bytes)
    body = BodyBuffer(header.total_bytes, header.sha256, "model")
    for c in it:
        body.add(model_data(c))
    return ModelMessage(header, body.finish())


def push_reply_to_proto(r: PushReply) -> pb.PushAck:
    return pb.PushAck(accepted=r.accepted, reason=r.reason, round=r.round)


def push_reply_from_proto(msg: pb.PushAck) -> PushReply:
    return PushReply(bool(msg.accepted), msg.reason, int(msg.round))


# ------------------------------------------------------------------ status


def status_to_proto(s: PeerStatus) -> pb.StatusResponse:
    return pb.StatusResponse(
        node_id=s.node_id,
        round=s.round,
        finished=s.finished,
        accuracy=-1.0 if s.accuracy is None else s.accuracy,
        num_examples=s.num_examples,
        model_sha256=s.model_sha256,
        rejected=s.rejected,
        last_rejection=s.last_rejection,
        bytes_sent=s.bytes_sent,
        bytes_received=s.bytes_received,
        consensus_gap=-1.0 if s.consensus_gap is None else s.consensus_gap,
        neighbours=[
            pb.NeighbourStatus(
                node_id=n.node_id,
                address=n.address,
                alive=n.alive,
                blocked=n.blocked,
                round=n.round,
                seconds_since_seen=n.seconds_since_seen,
                bytes_sent=n.bytes_sent,
                bytes_received=n.bytes_received,
            )
            for n in s.neighbours
        ],
        refused=dict(s.refused),
    )


def status_from_proto(msg: pb.StatusResponse) -> PeerStatus:
    if len(msg.neighbours) > MAX_KNOWN_PEERS or len(msg.refused) > MAX_STATUS_KINDS:
        raise InvalidArgument("status lists too many neighbours or refusal kinds")
    return PeerStatus(
        node_id=msg.node_id,
        round=int(msg.round),
        finished=bool(msg.finished),
        accuracy=None if msg.accuracy < 0 else float(msg.accuracy),
        num_examples=int(msg.num_examples),
        model_sha256=msg.model_sha256,
        rejected=int(msg.rejected),
        last_rejection=msg.last_rejection,
        bytes_sent=int(msg.bytes_sent),
        bytes_received=int(msg.bytes_received),
        consensus_gap=None if msg.consensus_gap < 0 else float(msg.consensus_gap),
        neighbours=tuple(
            NeighbourView(
                n.node_id,
                n.address,
                bool(n.alive),
                bool(n.blocked),
                int(n.round),
                float(n.seconds_since_seen),
                int(n.bytes_sent),
                int(n.bytes_received),
            )
            for n in msg.neighbours
        ),
        refused={str(k): int(v) for k, v in msg.refused.items()},
    )

"""Domain types of the gossip peer protocol, and what each signature covers
(no protobuf here; see :mod:`fedplat.proto.peer_serde`).

Every request carries its sender's Ed25519 ``signature`` over its fields, a
``timestamp_ms`` and a fresh :data:`NONCE_BYTES`-byte ``nonce``; an empty
signature means "not signed yet". A signature covers a domain-separated statement
(:func:`fedplat.security.identity.statement`) of:

* ``Hello`` (``PEER_HELLO``, :func:`hello_statement`): sender id and address,
  receiver id, round, layout fingerprint, link wish, timestamp, nonce;
* its answer (``PEER_HELLO``, marked ``"reply"``, :func:`hello_reply_statement`):
  responder id and address, round, layout fingerprint, whether it linked, the
  peers it lists, and the request's nonce;
* a model header (``PEER_MODEL``, :func:`model_statement`): sender, receiver,
  round, layout fingerprint, mixing inputs (examples, degree, push-sum weight),
  link reference versions, payload size and SHA-256, timestamp, nonce (a pull's
  answer repeats the request's nonce);
* a ping, pull or status call (``PEER_CALL``, :func:`call_statement`): the call's
  name, sender, receiver, round, timestamp, nonce.

Signing and checking them, and freshness, are the peer's
(:mod:`fedplat.gossip.signing`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from fedplat.security.identity import Field
from fedplat.vectors import Layout

__all__ = [
    "NONCE_BYTES",
    "CallAuth",
    "Hello",
    "HelloReply",
    "ModelHeader",
    "ModelMessage",
    "NeighbourView",
    "PeerAddress",
    "PeerStatus",
    "PingReply",
    "PushReply",
    "call_statement",
    "hello_reply_statement",
    "hello_statement",
    "model_statement",
]

#: Every signed request carries a fresh nonce of this many bytes.
NONCE_BYTES = 16


@dataclass(frozen=True)
class PeerAddress:
    """A peer's id and the ``host:port`` it serves on."""

    node_id: str
    address: str


@dataclass(frozen=True)
class Hello:
    """Bootstrap request: who I am, my round, my model layout, link with me?

    ``receiver_id`` is ``""`` when the sender knows only the receiver's address.
    """

    sender: PeerAddress
    round: int
    layout_fingerprint: str
    want_link: bool = True
    receiver_id: str = ""
    timestamp_ms: int = 0
    nonce: bytes = b""
    signature: bytes = b""


@dataclass(frozen=True)
class HelloReply:
    """Answer to :class:`Hello`, with the peers the responder knows.

    ``request_nonce`` repeats the request's nonce, so the signed answer is fresh.
    """

    responder: PeerAddress
    round: int
    layout_fingerprint: str
    linked: bool
    known: tuple[PeerAddress, ...] = ()
    request_nonce: bytes = b""
    signature: bytes = b""


@dataclass(frozen=True)
class CallAuth:
    """The signed part of a ``Ping``, ``PullModel`` or ``GetStatus`` request."""

    sender_id: str
    receiver_id: str
    round: int
    timestamp_ms: int
    nonce: bytes
    signature: bytes = b""


@dataclass(frozen=True)
class PingReply:
    node_id: str
    round: int
    degree: int


@dataclass(frozen=True)
class ModelHeader:
    """What a model message declares before its body.

    Attributes
    ----------
    sender_id : str
    round : int
        The round the model finished.
    layout : Layout
        Must equal the receiver's layout.
    num_examples : int
        Sender's local data size (DecAvg weight).
    degree : int
        Sender's live neighbours (Metropolis-Hastings weight).
    push_weight : float
        Push-sum weight share (0 for other rules).
    base_version, version : str
        Link reference versions (see :mod:`fedplat.gossip.links`).
    total_bytes : int
        Payload size.
    sha256 : str
        Hex digest of the payload.
    receiver_id : str
        The peer the message is for (a copy sent to another peer is refused).
    timestamp_ms, nonce : int, bytes
        Freshness; a pull's answer repeats the request's nonce.
    signature : bytes
        The sender's Ed25519 signature over all of the above.
    """

    sender_id: str
    round: int
    layout: Layout
    num_examples: int
    degree: int
    push_weight: float
    base_version: str
    version: str
    total_bytes: int
    sha256: str
    receiver_id: str = ""
    timestamp_ms: int = 0
    nonce: bytes = b""
    signature: bytes = b""


@dataclass(frozen=True)
class ModelMessage:
    """A header and its payload bytes (``Payload.to_bytes()`` of a compressor)."""

    header: ModelHeader
    data: bytes | bytearray


@dataclass(frozen=True)
class PushReply:
    accepted: bool
    reason: str
    round: int


@dataclass(frozen=True)
class NeighbourView:
    node_id: str
    address: str
    alive: bool
    blocked: bool
    round: int
    seconds_since_seen: float
    bytes_sent: int
    bytes_received: int


@dataclass(frozen=True)
class PeerStatus:
    """A peer's state as ``GetStatus`` reports it.

    ``refused`` counts refused calls by kind (``"hello:not a member"``, ...);
    ``rejected``/``last_rejection`` are about refused models.
    """

    node_id: str
    round: int
    finished: bool
    accuracy: float | None
    num_examples: int
    model_sha256: str
    rejected: int
    last_rejection: str
    bytes_sent: int
    bytes_received: int
    consensus_gap: float | None
    neighbours: tuple[NeighbourView, ...] = field(default_factory=tuple)
    refused: dict[str, int] = field(default_factory=dict)

    def neighbour(self, node_id: str) -> NeighbourView | None:
        return next((n for n in self.neighbours if n.node_id == node_id), None)


# -- what each signature covers ------------------------------------------------


def hello_statement(h: Hello) -> tuple[Field, ...]:
    """What a :class:`Hello`'s signature covers (domain ``PEER_HELLO``)."""
    return (
        "hello",
        h.sender.node_id,
        h.sender.address,
        h.receiver_id,
        h.round,
        h.layout_fingerprint,
        int(h.want_link),
        h.timestamp_ms,
        h.nonce,
    )


def hello_reply_statement(r: HelloReply) -> tuple[Field, ...]:
    """What a :class:`HelloReply`'s signature covers (domain ``PEER_HELLO``)."""
    known = tuple(f for p in r.known for f in (p.node_id, p.address))
    return (
        "reply",
        r.responder.node_id,
        r.responder.address,
        r.round,
        r.layout_fingerprint,
        int(r.linked),
        len(r.known),
        *known,
        r.request_nonce,
    )


def model_statement(h: ModelHeader, fingerprint: str) -> tuple[Field, ...]:
    """What a :class:`ModelHeader`'s signature covers (domain ``PEER_MODEL``);
    ``fingerprint`` is the layout's, which both sides compute."""
    return (
        h.sender_id,
        h.receiver_id,
        h.round,
        fingerprint,
        h.num_examples,
        h.degree,
        struct.pack("<d", h.push_weight),
        h.base_version,
        h.version,
        h.total_bytes,
        h.sha256,
        h.timestamp_ms,
        h.nonce,
    )


def call_statement(rpc: str, c: CallAuth) -> tuple[Field, ...]:
    """What a ``Ping``, ``PullModel`` or ``GetStatus`` call's :class:`CallAuth`
    signature covers (domain ``PEER_CALL``); ``rpc`` names the call."""
    return (rpc, c.sender_id, c.receiver_id, c.round, c.timestamp_ms, c.nonce)

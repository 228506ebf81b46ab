"""Domain types of the peer protocol (no protobuf here; see
:mod:`fedplat.proto.peer_serde`).

Every request carries its sender's Ed25519 ``signature`` over its fields, a
``timestamp_ms`` and a fresh 16-byte ``nonce`` (:mod:`fedplat.gossip.signing`);
an empty signature means "not signed yet".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fedplat.vectors import Layout

__all__ = [
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
]


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

"""Domain types of the peer protocol (no protobuf here; see :mod:`.serde`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fedplat.vectors import Layout

__all__ = [
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
    """Bootstrap request: who I am, my round, my model layout, link with me?"""

    sender: PeerAddress
    round: int
    layout_fingerprint: str
    want_link: bool = True


@dataclass(frozen=True)
class HelloReply:
    """Answer to :class:`Hello`, with the peers the responder knows."""

    responder: PeerAddress
    round: int
    layout_fingerprint: str
    linked: bool
    known: tuple[PeerAddress, ...] = ()


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


@dataclass(frozen=True)
class ModelMessage:
    """A header and its payload bytes (``Payload.to_bytes()`` of a compressor)."""

    header: ModelHeader
    data: bytes


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
    """A peer's state as ``GetStatus`` reports it."""

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

    def neighbour(self, node_id: str) -> NeighbourView | None:
        return next((n for n in self.neighbours if n.node_id == node_id), None)

"""A peer's neighbour table: who its neighbours are and whether they are alive.

A neighbour is *alive* while it was heard from (any successful call either way:
ping reply, accepted push, incoming push or hello) within ``dead_after`` seconds.
Nothing is declared dead on a single failed call - a busy peer may miss one - only
on silence, which is how a heartbeat failure detector works (Chandra & Toueg's
eventually-perfect detector, in its simplest timeout form). A *blocked* link is
one a scenario cut: the peer neither sends nor accepts on it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from fedplat.protocol.peer import NeighbourView, PeerAddress

__all__ = ["Neighbour", "NeighbourTable", "Transition"]


@dataclass
class Neighbour:
    node_id: str
    address: str
    last_seen: float | None = None
    round: int = 0
    degree: int = 1
    alive: bool = False
    blocked: bool = False
    bytes_sent: int = 0
    bytes_received: int = 0


@dataclass(frozen=True)
class Transition:
    """A neighbour changed state: ``"alive"`` (first contact or back) or ``"dead"``."""

    node_id: str
    state: str


class NeighbourTable:
    """Thread-safe neighbour table with timeout-based failure detection.

    Parameters
    ----------
    dead_after : float
        Seconds of silence after which a neighbour counts as dead.
    clock : callable
        Monotonic clock (injectable for tests).
    """

    def __init__(
        self, dead_after: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if dead_after <= 0:
            raise ValueError(f"dead_after must be > 0, got {dead_after}")
        self.dead_after = dead_after
        self._clock = clock
        self._lock = threading.Lock()
        self._rows: dict[str, Neighbour] = {}

    def __contains__(self, node_id: object) -> bool:
        with self._lock:
            return node_id in self._rows

    def __len__(self) -> int:
        with self._lock:
            return len(self._rows)

    def add(self, node_id: str, address: str) -> bool:
        """Add (or re-address) a neighbour; returns whether it is new."""
        with self._lock:
            row = self._rows.get(node_id)
            if row is None:
                self._rows[node_id] = Neighbour(node_id, address)
                return True
            row.address = address
            return False

    def get(self, node_id: str) -> Neighbour | None:
        with self._lock:
            row = self._rows.get(node_id)
            return None if row is None else Neighbour(**vars(row))

    def heard_from(
        self, node_id: str, round: int | None = None, degree: int | None = None
    ) -> Transition | None:
        """Record contact; returns a transition if the neighbour was not alive."""
        with self._lock:
            row = self._rows.get(node_id)
            if row is None:
                return None
            row.last_seen = self._clock()
            if round is not None:
                row.round = max(row.round, round)
            if degree is not None:
                row.degree = max(1, degree)
            if not row.alive:
                row.alive = True
                return Transition(node_id, "alive")
            return None

    def refresh(self) -> list[Transition]:
        """Mark neighbours silent for longer than ``dead_after`` as dead."""
        now = self._clock()
        out = []
        with self._lock:
            for row in self._rows.values():
                silent = row.last_seen is None or now - row.last_seen > self.dead_after
                if row.alive and silent:
                    row.alive = False
                    out.append(Transition(row.node_id, "dead"))
        return out

    def set_blocked(self, blocked: set[str]) -> None:
        with self._lock:
            for row in self._rows.values():
                row.blocked = row.node_id in blocked

    def is_blocked(self, node_id: str) -> bool:
        with self._lock:
            row = self._rows.get(node_id)
            return bool(row and row.blocked)

    def count_bytes(self, node_id: str, sent: int = 0, received: int = 0) -> None:
        with self._lock:
            row = self._rows.get(node_id)
            if row is not None:
                row.bytes_sent += sent
                row.bytes_received += received

    def live(self) -> list[Neighbour]:
        """Alive, unblocked neighbours (copies), sorted by id."""
        with self._lock:
            return [
                Neighbour(**vars(r))
                for _, r in sorted(self._rows.items())
                if r.alive and not r.blocked
            ]

    def all(self) -> list[Neighbour]:
        with self._lock:
            return [Neighbour(**vars(r)) for _, r in sorted(self._rows.items())]

    def addresses(self) -> list[PeerAddress]:
        with self._lock:
            return [
                PeerAddress(r.node_id, r.address) for _, r in sorted(self._rows.items())
            ]

    def views(self) -> list[NeighbourView]:
        now = self._clock()
        with self._lock:
            return [
                NeighbourView(
                    r.node_id,
                    r.address,
                    r.alive,
                    r.blocked,
                    r.round,
                    -1.0 if r.last_seen is None else now - r.last_seen,
                    r.bytes_sent,
                    r.bytes_received,
                )
                for _, r in sorted(self._rows.items())
            ]

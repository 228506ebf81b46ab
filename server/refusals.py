"""Refusals, and how many of them the store keeps.

Refusals are events, but an attacker can cause millions of them: per kind, at
most ``burst`` are stored in full at once and ``per_hour`` sustained, and the
rest are counted and stored as one summary event per ``window`` seconds (with
one note when counting starts); refusals attributed to one enrolled client
also draw on that client's own budget (``client_burst`` at once,
``client_per_hour`` sustained). A flood of one kind thus stores at most
``per_hour`` refusals (after a first ``burst``) and ``2 x 3600 / window`` notes
and summaries an hour, whatever its rate: with the defaults, 240 rows an hour.
:class:`RefusalBudget` decides what is kept; the recorder
(:meth:`fedplat.server.recorder.Recorder.rejection`) writes it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from fedplat.transport.limits import KeyedBuckets


@dataclass
class Rejection:
    """A refusal the recorder stores as an event (rate-limited)."""

    kind: str
    reason: str
    client_id: str | None = None
    details: dict[str, object] = field(default_factory=dict)


class Keep(enum.Enum):
    """What is stored of one refusal."""

    FULL = "full"  # the refusal itself
    FIRST_COUNTED = "first_counted"  # a note that the kind's next are counted
    COUNTED = "counted"  # nothing now: counted in its window's summary


@dataclass(frozen=True)
class Counted:
    """Refusals of ``kind`` counted, not stored one by one, in a window."""

    kind: str
    suppressed: int


@dataclass(frozen=True)
class Decision:
    keep: Keep
    #: The kind's window that ended with this refusal, to be summarised first.
    ended: Counted | None = None


@dataclass
class _Window:
    start: float
    stored: int = 0
    suppressed: int = 0


class RefusalBudget:
    """Per kind and per client budgets of stored refusals (module docstring).
    Not thread-safe: the recorder calls it under its lock."""

    def __init__(
        self,
        *,
        window: float,
        burst: int,
        per_hour: float,
        client_burst: int,
        client_per_hour: float,
        clock: Callable[[], float],
    ) -> None:
        self.window = window
        self._kinds = KeyedBuckets(per_hour / 3600.0, burst, clock)
        self._clock = clock
        self._windows: dict[str, _Window] = {}
        self._clients = KeyedBuckets(client_per_hour / 3600.0, client_burst, clock)

    def admit(self, r: Rejection) -> Decision:
        now = self._clock()
        if r.client_id is not None and not self._client_allows(r.client_id):
            # Over this client's own budget: counted, not stored.
            self._windows.setdefault(r.kind, _Window(now)).suppressed += 1
            return Decision(Keep.COUNTED)
        ended = None
        w = self._windows.get(r.kind)
        if w is None or now - w.start >= self.window:
            if w is not None and w.suppressed:
                ended = Counted(r.kind, w.suppressed)
            w = self._windows[r.kind] = _Window(now)
        if not self._kinds.take(r.kind):
            w.suppressed += 1
            first = w.suppressed == 1
            return Decision(Keep.FIRST_COUNTED if first else Keep.COUNTED, ended)
        w.stored += 1
        return Decision(Keep.FULL, ended)

    def due(self, *, final: bool = False) -> list[Counted]:
        """The counts of the windows that ended (every window's, ``final``)."""
        now = self._clock()
        out = []
        for kind, w in list(self._windows.items()):
            if (final or now - w.start >= self.window) and w.suppressed:
                out.append(Counted(kind, w.suppressed))
                del self._windows[kind]
        return out

    def _client_allows(self, client_id: str) -> bool:
        """One more stored refusal attributed to ``client_id``."""
        return self._clients.take(client_id)


__all__ = ["Counted", "Decision", "Keep", "RefusalBudget", "Rejection"]

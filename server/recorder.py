"""The recorder: every store write of a running coordinator.

A round is written twice: one row when it opens, and everything else (each
selected client's participation and verdict, contributions, metrics, events,
ledger entries, the run's progress) in one transaction when it closes
(:meth:`Recorder.close_round`). In between, events and client liveness are
buffered and flushed by one background thread every ``flush_seconds``, together
with the coordinator's heartbeat, so no RPC ever waits for the database.

Refusals are events too, but an attacker can cause millions of them: per kind,
at most ``burst`` are stored in full per ``window`` seconds, and the rest are
counted and stored as one summary event per window. Store growth per attack is
bounded whatever its rate.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from fedplat.server.registry import Rejection

from fedplat.store import (
    HEARTBEAT_SECONDS,
    EventRow,
    RoundClose,
    RoundRecord,
    Store,
    StoreError,
)

log = logging.getLogger("fedplat.server.recorder")


@dataclass
class _Window:
    start: float
    stored: int = 0
    suppressed: int = 0


class Recorder:
    """Buffered, batched writes of one run (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        *,
        status: Callable[[], tuple[str | None, int | None]] = lambda: (None, None),
        flush_seconds: float = 0.5,
        heartbeat_seconds: float = HEARTBEAT_SECONDS,
        window: float = 10.0,
        burst: int = 20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.status = status
        self._flush_s = flush_seconds
        self._beat_s = heartbeat_seconds
        self._window_s = window
        self._burst = burst
        self._clock = clock
        self._lock = threading.Lock()
        self._events: list[EventRow] = []
        self._seen: set[str] = set()
        self._windows: dict[str, _Window] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_beat = 0.0

    # ------------------------------------------------------------ background
    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._loop, name="fedplat-recorder", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.flush(final=True)
        if self._thread is not None:
            # The last word: readers tell a clean stop (resumable) from a
            # coordinator that died, whose heartbeat merely goes stale.
            try:
                self.store.heartbeat(self.run_id, phase="stopped", live_clients=0)
            except StoreError:
                log.exception("recorder: could not record the stop")

    def _loop(self) -> None:
        while not self._stop.wait(self._flush_s):
            try:
                self.flush()
                now = self._clock()
                if now - self._last_beat >= self._beat_s:
                    self._last_beat = now
                    phase, live = self.status()
                    self.store.heartbeat(self.run_id, phase=phase, live_clients=live)
            except StoreError:
                log.exception("recorder: store write failed (will retry)")

    # ------------------------------------------------------------ buffered
    def event(
        self,
        kind: str,
        message: str,
        *,
        level: str = "info",
        round_number: int | None = None,
        client_id: str | None = None,
        details: dict[str, object] | None = None,
    ) -> None:
        with self._lock:
            self._events.append(
                EventRow(kind, message, level, round_number, client_id, details)
            )

    def rejection(self, r: Rejection) -> None:
        """A refusal: stored in full up to ``burst`` per kind and window."""
        now = self._clock()
        with self._lock:
            w = self._windows.get(r.kind)
            if w is None or now - w.start >= self._window_s:
                if w is not None and w.suppressed:
                    self._events.append(self._summary(r.kind, w))
                w = self._windows[r.kind] = _Window(now)
            if w.stored >= self._burst:
                if w.suppressed == 0:
                    self._events.append(
                        EventRow(
                            r.kind,
                            f"more {r.kind!r} refusals follow; for {self._window_s:.0f}"
                            " s they are counted, not stored one by one",
                            "warning",
                        )
                    )
                w.suppressed += 1
                return
            w.stored += 1
            rnd = r.details.get("round")
            self._events.append(
                EventRow(
                    r.kind,
                    f"refused: {r.reason}",
                    "warning",
                    rnd if isinstance(rnd, int) else None,
                    r.client_id,
                    {"status": "rejected"},
                )
            )

    def _summary(self, kind: str, w: _Window) -> EventRow:
        return EventRow(
            kind,
            f"{w.suppressed} more {kind!r} refusals in {self._window_s:.0f} s "
            "(not stored one by one)",
            "warning",
            details={"suppressed": w.suppressed},
        )

    def seen(self, client_id: str) -> None:
        """The client was heard from (its ``last_seen`` is written in batches)."""
        with self._lock:
            self._seen.add(client_id)

    def flush(self, *, final: bool = False) -> None:
        now = self._clock()
        with self._lock:
            for kind, w in list(self._windows.items()):
                if (final or now - w.start >= self._window_s) and w.suppressed:
                    self._events.append(self._summary(kind, w))
                    del self._windows[kind]
            events, self._events = self._events, []
            seen, self._seen = self._seen, set()
        if events:
            self.store.add_events(self.run_id, events)
        if seen:
            self.store.touch_clients(self.run_id, sorted(seen), status="active")

    # ------------------------------------------------------------ rounds
    def close_round(self, number: int, close: RoundClose) -> RoundRecord:
        """Write the round (buffered events first, so they precede it)."""
        self.flush()
        return self.store.close_round(self.run_id, number, close)


__all__ = ["Recorder"]

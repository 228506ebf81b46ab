"""The recorder: every store write of a running coordinator.

A round is written twice: one row when it opens, and everything else (each
selected client's participation and verdict, contributions, metrics, events,
ledger entries, the run's progress) in one transaction when it closes
(:meth:`Recorder.close_round`). In between, events and client liveness are
buffered and flushed by one background thread every ``flush_seconds``, together
with the coordinator's heartbeat, so no RPC ever waits for the database.

Refusals are events too, but an attacker can cause millions of them: per kind,
at most ``burst`` are stored in full per ``window`` seconds, and the rest are
counted and stored as one summary event per window; refusals attributed to one
enrolled client also draw on that client's own budget (``client_burst`` at
once, ``client_per_hour`` sustained). Store growth per attack, and per
identity, is bounded whatever its rate.

Nothing a caller sent can make a write fail: every buffered event and metric
is checked against the store's bounds when it is buffered (a bad one is
replaced by an ``event_refused`` event saying why), and a closing round's
per-client records are checked one by one (:meth:`Recorder.close_round`): a
client's record the store would refuse is replaced by a ``failed``
participation with the reason, and an event, instead of failing the round.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from fedplat.server.ratelimit import TokenBucket
from fedplat.server.registry import Rejection

from fedplat.store import (
    HEARTBEAT_SECONDS,
    EventRow,
    ParticipationRow,
    RoundClose,
    RoundRecord,
    Store,
    StoreError,
    event_problem,
    metrics_problem,
    participation_problem,
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
        client_burst: int = 20,
        client_per_hour: float = 360.0,
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
        self._metrics: list[tuple[dict[str, float], int | None, str | None]] = []
        self._seen: set[str] = set()
        self._windows: dict[str, _Window] = {}
        self._client_budget = (client_burst, client_per_hour / 3600.0)
        self._clients: dict[str, TokenBucket] = {}
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
        row = _checked(EventRow(kind, message, level, round_number, client_id, details))
        with self._lock:
            self._events.append(row)

    def metrics(
        self,
        values: dict[str, float],
        *,
        round_number: int | None = None,
        client_id: str | None = None,
    ) -> None:
        """Named scalars, written with the next batch (a bad one is dropped,
        with an event saying why)."""
        kept: dict[str, float] = {}
        for name, value in values.items():
            problem = metrics_problem({name: value}, client_id)
            if problem is None:
                kept[name] = value
            else:
                self.event("metric_refused", f"metric not stored: {problem}")
        if kept:
            with self._lock:
                self._metrics.append((kept, round_number, client_id))

    def rejection(self, r: Rejection) -> None:
        """A refusal: stored in full up to ``burst`` per kind and window."""
        now = self._clock()
        with self._lock:
            if r.client_id is not None and not self._client_allows(r.client_id):
                # Over this client's own budget: counted, not stored.
                self._windows.setdefault(r.kind, _Window(now)).suppressed += 1
                return
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
                _checked(
                    EventRow(
                        r.kind,
                        f"refused: {r.reason}",
                        "warning",
                        rnd if isinstance(rnd, int) else None,
                        r.client_id,
                        {"status": "rejected"},
                    )
                )
            )

    def _client_allows(self, client_id: str) -> bool:
        """One more stored refusal attributed to ``client_id`` (lock held)."""
        bucket = self._clients.get(client_id)
        if bucket is None:
            burst, rate = self._client_budget
            bucket = self._clients[client_id] = TokenBucket(rate, burst, self._clock)
        return bucket.take()

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
            metrics, self._metrics = self._metrics, []
            seen, self._seen = self._seen, set()
        if events:
            self.store.add_events(self.run_id, events)
        for values, rnd, cid in metrics:
            self.store.add_metrics(self.run_id, values, round_number=rnd, client_id=cid)
        if seen:
            self.store.touch_clients(self.run_id, sorted(seen), status="active")

    # ------------------------------------------------------------ rounds
    def close_round(self, number: int, close: RoundClose) -> RoundRecord:
        """Write the round (buffered events first, so they precede it); a
        client's record the store would refuse is dropped (module docstring)."""
        self.flush()
        return self.store.close_round(self.run_id, number, sanitized(close, number))


def _checked(e: EventRow) -> EventRow:
    """``e``, or an event saying why the store would refuse it."""
    problem = event_problem(e)
    if problem is None:
        return e
    log.warning("recorder: event %r not storable: %s", e.kind[:64], problem[:200])
    return EventRow(
        "event_refused",
        f"an event could not be stored: {problem}",
        "warning",
        e.round_number if event_problem(replace(e, client_id=None)) is None else None,
    )


def sanitized(close: RoundClose, number: int) -> RoundClose:
    """``close`` with every per-client record the store would refuse replaced
    (a participation) or dropped (client metrics, events), each with an event."""
    dropped: list[EventRow] = []
    parts = []
    for p in close.participations:
        problem = participation_problem(p)
        if problem is not None:
            dropped.append(_dropped(number, p.client_id, "participation", problem))
            p = ParticipationRow(
                client_id=p.client_id,
                status="failed",
                reason=f"record refused by the store: {problem}"[:500],
            )
        parts.append(p)
    client_metrics = {}
    for cid, values in (close.client_metrics or {}).items():
        problem = metrics_problem(values, cid)
        if problem is None:
            client_metrics[cid] = values
        else:
            dropped.append(_dropped(number, cid, "metrics", problem))
    metrics = {
        k: v
        for k, v in (close.metrics or {}).items()
        if metrics_problem({k: v}) is None
    }
    events = tuple(_checked(e) for e in close.events) + tuple(dropped)
    return replace(
        close,
        participations=tuple(parts),
        client_metrics=client_metrics,
        metrics=metrics,
        events=events,
    )


def _dropped(number: int, client_id: str, what: str, problem: str) -> EventRow:
    log.warning("round %d: %s of %s dropped: %s", number, what, client_id, problem)
    return _checked(
        EventRow(
            "record_dropped",
            f"round {number}: the {what} record of a client was refused by the "
            f"store and dropped: {problem}",
            "warning",
            number,
            client_id,
        )
    )


__all__ = ["Recorder", "sanitized"]

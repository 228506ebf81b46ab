"""The recorder: every store write of a running coordinator.

The only code in server/ that writes the store (:mod:`fedplat.server.app` opens
it; the parts read through :attr:`Recorder.reads`, a
:class:`~fedplat.server.reads.StoreReader`). A round is written twice: one row
when it opens, and everything else (each selected client's participation and
verdict, contributions, metrics, events, ledger entries, the run's progress) in
one transaction when it closes (:meth:`Recorder.close_round`). In between, events
and client liveness are buffered and flushed by one background thread every
``flush_seconds``, together with the coordinator's heartbeat, so no call waits
for the database but enrolment, whose admission is durable before it is answered
(:meth:`Recorder.enrol_client`). The run's own writes (created, resized, its
status) are made at once; one that follows events of its own flushes them first.

Refusals are events too, but an attacker can cause millions of them: how many
are stored, per kind and per client, is :mod:`fedplat.server.refusals`' budget.

Nothing a caller sent can make a write fail: every buffered event and metric
is checked against the store's bounds when it is buffered (a bad one is
replaced by an ``event_refused`` event saying why), and a closing round's
per-client records are checked one by one (:meth:`Recorder.close_round`): a
client's record the store would refuse is replaced by a ``failed``
participation with the reason, and an event, instead of failing the round.

The store's record shapes it accepts (:class:`RoundClose` and its rows,
:class:`Verdict`) are its input types: the modules that build them take them
from here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Literal

from fedplat.server.reads import StoreReader
from fedplat.server.refusals import Counted, Keep, RefusalBudget, Rejection

# ContributionRow, EventRow, ParticipationRow, RoundClose and Verdict are the
# recorder's input types (module docstring): re-exported for the modules that
# build them.
from fedplat.store import (
    HEARTBEAT_SECONDS,
    ClientRecord,
    ContributionRow,
    EventRow,
    ParticipationRow,
    RoundClose,
    RoundRecord,
    RunRecord,
    Store,
    StoreError,
    Verdict,
    event_problem,
    metrics_problem,
    participation_problem,
)
from fedplat.store.clients import TokenError

log = logging.getLogger("fedplat.server.recorder")


class EnrolmentRefused(Exception):
    """The store refused an enrolment (``token``: because of its token)."""

    def __init__(self, reason: str, *, token: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.token = token


class Recorder:
    """Every store write of one run, most of them buffered and batched (see
    the module docstring). It writes for the run it creates or attaches to."""

    def __init__(
        self,
        store: Store,
        run_id: str | None = None,
        *,
        status: Callable[[], tuple[str | None, int | None]] = lambda: (None, None),
        flush_seconds: float = 0.5,
        heartbeat_seconds: float = HEARTBEAT_SECONDS,
        window: float = 60.0,
        burst: int = 20,
        per_hour: float = 120.0,
        client_burst: int = 20,
        client_per_hour: float = 360.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        #: The read port on the same store (the parts read through it).
        self.reads = StoreReader(store)
        self._run_id = run_id
        self.status = status
        self._flush_s = flush_seconds
        self._beat_s = heartbeat_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._events: list[EventRow] = []
        self._metrics: list[tuple[dict[str, float], int | None, str | None]] = []
        self._seen: set[str] = set()
        self._refusals = RefusalBudget(
            window=window,
            burst=burst,
            per_hour=per_hour,
            client_burst=client_burst,
            client_per_hour=client_per_hour,
            clock=clock,
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_beat = 0.0

    # ------------------------------------------------------------ the run
    @property
    def run_id(self) -> str:
        """The run written for (created or resumed when the run opens)."""
        if self._run_id is None:
            raise RuntimeError("the recorder has no run yet (create_run or attach)")
        return self._run_id

    def attach(self, run_id: str) -> None:
        """Write for ``run_id`` from now on (a run being resumed)."""
        if self._run_id not in (None, run_id):
            raise RuntimeError(f"the recorder writes for run {self._run_id}")
        self._run_id = run_id

    def create_run(
        self,
        name: str,
        config: dict[str, Any],
        layout: dict[str, Any],
        total_rounds: int,
    ) -> RunRecord:
        """Create the run, and write for it from now on."""
        if self._run_id is not None:
            raise RuntimeError(f"the recorder writes for run {self._run_id}")
        run = self._store.create_run(name, config, layout, total_rounds)
        self.attach(run.id)
        return run

    def resize_run(self, total_rounds: int, *, reopen: bool) -> RunRecord:
        """A changed ``run.rounds`` (``reopen``: a completed run runs again)."""
        self.flush()
        return self._store.update_run(
            self.run_id,
            total_rounds=total_rounds,
            status="running" if reopen else None,
        )

    def mark_running(self, started_at: datetime | None = None) -> RunRecord:
        """The run is running (``started_at``: when it first started)."""
        return self._store.update_run(
            self.run_id, status="running", started_at=started_at
        )

    def finish_run(
        self, status: Literal["completed", "failed"], reason: str | None = None
    ) -> RunRecord:
        """The run ends without a round to close (its events written first)."""
        self.flush()
        return self._store.update_run(
            self.run_id, status=status, reason=reason, finished_at=datetime.now(UTC)
        )

    # ------------------------------------------------------------ enrolment
    def enrol_client(
        self,
        client_id: str,
        *,
        token: str | None,
        run_name: str,
        name: str,
        num_examples: int,
        info: dict[str, Any],
        public_key: str,
        cert_fingerprint: str | None,
    ) -> ClientRecord:
        """Admit a client durably, before its call is answered: a new client
        with an enrolment ``token`` spends it in the same transaction (a client
        the store refuses keeps its token); otherwise the client is written
        (or rewritten) as active. Raises :class:`EnrolmentRefused`."""
        try:
            if token is not None:
                return self._store.enrol_with_token(
                    token,
                    run_id=self.run_id,
                    run_name=run_name,
                    client_id=client_id,
                    name=name,
                    num_examples=num_examples,
                    info=info,
                    public_key=public_key,
                )
            return self._store.upsert_client(
                self.run_id,
                client_id,
                name=name,
                num_examples=num_examples,
                info=info,
                status="active",
                public_key=public_key,
                cert_fingerprint=cert_fingerprint,
            )
        except TokenError as exc:
            raise EnrolmentRefused(str(exc), token=True) from exc
        except StoreError as exc:
            raise EnrolmentRefused(str(exc), token=False) from exc

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
                self._store.heartbeat(self.run_id, phase="stopped", live_clients=0)
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
                    self._store.heartbeat(self.run_id, phase=phase, live_clients=live)
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
        """A refusal: stored in full within its budgets (module docstring)."""
        with self._lock:
            decision = self._refusals.admit(r)
            if decision.ended is not None:
                self._events.append(self._summary(decision.ended))
            if decision.keep is Keep.FIRST_COUNTED:
                self._events.append(
                    EventRow(
                        r.kind,
                        f"more {r.kind!r} refusals follow; for "
                        f"{self._refusals.window:.0f} s they are counted, not "
                        "stored one by one",
                        "warning",
                    )
                )
            if decision.keep is not Keep.FULL:
                return
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

    def _summary(self, c: Counted) -> EventRow:
        return EventRow(
            c.kind,
            f"{c.suppressed} more {c.kind!r} refusals in "
            f"{self._refusals.window:.0f} s (not stored one by one)",
            "warning",
            details={"suppressed": c.suppressed},
        )

    def seen(self, client_id: str) -> None:
        """The client was heard from (its ``last_seen`` is written in batches)."""
        with self._lock:
            self._seen.add(client_id)

    def flush(self, *, final: bool = False) -> None:
        with self._lock:
            self._events.extend(map(self._summary, self._refusals.due(final=final)))
            events, self._events = self._events, []
            metrics, self._metrics = self._metrics, []
            seen, self._seen = self._seen, set()
        if events:
            self._store.add_events(self.run_id, events)
        for values, rnd, cid in metrics:
            self._store.add_metrics(
                self.run_id, values, round_number=rnd, client_id=cid
            )
        if seen:
            self._store.touch_clients(self.run_id, sorted(seen), status="active")

    # ------------------------------------------------------------ rounds
    def open_round(
        self,
        number: int,
        *,
        num_selected: int,
        deadline_at: datetime,
        model_version: int,
    ) -> RoundRecord:
        """The round's one row while it is open (the rest when it closes)."""
        return self._store.open_round(
            self.run_id,
            number,
            num_selected=num_selected,
            deadline_at=deadline_at,
            model_version=model_version,
        )

    def close_round(self, number: int, close: RoundClose) -> RoundRecord:
        """Write the round (buffered events first, so they precede it); a
        client's record the store would refuse is dropped (module docstring)."""
        self.flush()
        return self._store.close_round(self.run_id, number, sanitized(close, number))


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


__all__ = [
    "ContributionRow",
    "EnrolmentRefused",
    "EventRow",
    "ParticipationRow",
    "Recorder",
    "RoundClose",
    "Verdict",
    "sanitized",
]

"""Metrics and events."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select

from fedplat.store.base import StoreBase
from fedplat.store.convert import (
    _event_record,
    _metric_record,
)
from fedplat.store.models import (
    Event,
    Metric,
)
from fedplat.store.records import (
    EventRecord,
    EventRow,
    MetricRecord,
)
from fedplat.store.statuses import (
    EVENT_LEVELS,
)
from fedplat.store.validate import (
    _ID_MAX,
    _KIND_MAX,
    _NAME_MAX,
    StoreError,
    _aware,
    _choice,
    _count,
    _encode,
    _finite,
    _now,
    _text,
)

#: Longest stored event message; longer ones are cut (they may quote input).
MAX_MESSAGE = 1000
#: Largest stored event ``details`` object, as JSON.
MAX_DETAILS = 4096


def metric_rows(
    run_id: str,
    values: Mapping[str, float],
    round_number: int | None,
    client_id: str | None,
) -> list[dict[str, Any]]:
    """Validated insert rows for named scalars (NaN and infinities rejected)."""
    if not isinstance(values, Mapping):
        raise StoreError("values must be a dict of name -> number")
    if round_number is not None:
        _count("round_number", round_number)
    if client_id is not None:
        _text("client_id", client_id, _ID_MAX)
    now = _now()
    return [
        {
            "run_id": run_id,
            "round_number": round_number,
            "client_id": client_id,
            "name": _text("metric name", name, _NAME_MAX),
            "value": _finite(f"metric {name!r}", value),
            "created_at": now,
        }
        for name, value in values.items()
    ]


def event_rows(run_id: str | None, events: Sequence[EventRow]) -> list[dict[str, Any]]:
    """Validated insert rows for events; messages are cut at :data:`MAX_MESSAGE`."""
    rows = []
    now = _now()
    for e in events:
        _text("kind", e.kind, _KIND_MAX)
        if not isinstance(e.message, str):
            raise StoreError(f"message must be a string, got {e.message!r}")
        _choice("level", e.level, EVENT_LEVELS)
        if e.round_number is not None:
            _count("round_number", e.round_number)
        if e.client_id is not None:
            _text("client_id", e.client_id, _ID_MAX)
        details = _encode("details", {} if e.details is None else e.details)
        if len(details) > MAX_DETAILS:
            raise StoreError(f"event details longer than {MAX_DETAILS} characters")
        message = e.message
        if len(message) > MAX_MESSAGE:
            message = message[: MAX_MESSAGE - 1] + "\u2026"
        rows.append(
            {
                "run_id": run_id,
                "round_number": e.round_number,
                "client_id": e.client_id,
                "kind": e.kind,
                "level": e.level,
                "message": message,
                "details_json": details,
                "created_at": now,
            }
        )
    return rows


def event_problem(e: EventRow) -> str | None:
    """Why the store would refuse event ``e``, or None."""
    try:
        event_rows(None, [e])
    except StoreError as exc:
        return str(exc)
    return None


def metrics_problem(
    values: Mapping[str, float], client_id: str | None = None
) -> str | None:
    """Why the store would refuse these named scalars, or None."""
    try:
        metric_rows("-", values, None, client_id)
    except StoreError as exc:
        return str(exc)
    return None


class EventsStore(StoreBase):
    """Metrics and events."""

    def add_metric(
        self,
        run_id: str,
        name: str,
        value: float,
        *,
        round_number: int | None = None,
        client_id: str | None = None,
    ) -> None:
        """Record one named scalar; NaN and infinities are rejected."""
        self.add_metrics(
            run_id, {name: value}, round_number=round_number, client_id=client_id
        )

    def add_metrics(
        self,
        run_id: str,
        values: dict[str, float],
        *,
        round_number: int | None = None,
        client_id: str | None = None,
    ) -> None:
        """Record several named scalars in one transaction (all or none)."""
        rows = metric_rows(run_id, values, round_number, client_id)
        if not rows:
            return
        with self._write() as session:
            self._require_run(session, run_id)
            session.execute(insert(Metric), rows)

    def list_metrics(self, run_id: str, name: str | None = None) -> list[MetricRecord]:
        """Return a run's metrics (optionally one name) in insertion order."""
        query = select(Metric).where(Metric.run_id == run_id)
        if name is not None:
            query = query.where(Metric.name == name)
        with self._read() as session:
            rows = session.scalars(query.order_by(Metric.id))
            return [_metric_record(r) for r in rows]

    def add_event(
        self,
        run_id: str | None,
        kind: str,
        message: str,
        *,
        level: str = "info",
        round_number: int | None = None,
        client_id: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        """Record an event (``run_id`` ``None`` for coordinator-wide events)."""
        self.add_events(
            run_id,
            [EventRow(kind, message, level, round_number, client_id, details)],
        )

    def add_events(self, run_id: str | None, events: Sequence[EventRow]) -> None:
        """Record several events of one run in one transaction."""
        rows = event_rows(run_id, events)
        if not rows:
            return
        with self._write() as session:
            if run_id is not None:
                self._require_run(session, run_id)
            session.execute(insert(Event), rows)

    def list_events(
        self,
        run_id: str | None = None,
        kind: str | None = None,
        limit: int | None = None,
        before: datetime | None = None,
    ) -> list[EventRecord]:
        """Return events, newest first, optionally of one run and/or kind, and
        older than ``before`` (paging back through a log).

        ``run_id=None`` means events of every run and coordinator-wide ones.
        """
        query = select(Event)
        if run_id is not None:
            query = query.where(Event.run_id == run_id)
        if kind is not None:
            query = query.where(Event.kind == kind)
        if before is not None:
            query = query.where(Event.created_at < _aware("before", before))
        query = query.order_by(Event.created_at.desc(), Event.id.desc())
        if limit is not None:
            query = query.limit(_count("limit", limit, minimum=1))
        with self._read() as session:
            return [_event_record(r) for r in session.scalars(query)]

    def nth_newest_event_id(self, run_id: str, n: int) -> int | None:
        """The id of run ``run_id``'s ``n``-th newest event (``None``: it has
        fewer); one indexed read, whatever ``n`` is."""
        query = (
            select(Event.id)
            .where(Event.run_id == run_id)
            .order_by(Event.id.desc())
            .offset(_count("n", n, minimum=1) - 1)
            .limit(1)
        )
        with self._read() as session:
            return session.scalars(query).first()

    def events_after(
        self, run_id: str, after_id: int = 0, limit: int = 500
    ) -> list[EventRecord]:
        """Run ``run_id``'s events with an id above ``after_id``, oldest first: a
        log's next page (ids grow with every event a store records)."""
        _count("after_id", after_id)
        query = (
            select(Event)
            .where(Event.run_id == run_id, Event.id > after_id)
            .order_by(Event.id)
            .limit(_count("limit", limit, minimum=1))
        )
        with self._read() as session:
            return [_event_record(r) for r in session.scalars(query)]

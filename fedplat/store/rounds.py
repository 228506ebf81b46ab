"""Rounds, participations and contributions: opened once, closed once, then frozen.

A round is *opened* (:meth:`RoundsStore.open_round`: one row, status ``open``) and
*closed* (:meth:`RoundsStore.close_round`) in one transaction that writes every
participation, verdict, contribution, metric and event of the round, its totals,
the run's progress and, optionally, contribution ledger entries. Nothing else ever
writes a participation, and a closed round (``completed`` or ``failed``) is never
reopened or changed: late, duplicate or replayed calls can only add events.

An ``open`` round may be reopened (a coordinator restarted mid-round, or a retry
after an attempt without quorum): it holds no participations yet.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import case, insert, or_, select, update
from sqlalchemy.orm import Session

from fedplat.store.base import StoreBase
from fedplat.store.convert import (
    _contribution_record,
    _participation_record,
    _round_record,
)
from fedplat.store.events import event_rows, metric_rows
from fedplat.store.ledger_rows import append_ledger_rows
from fedplat.store.models import (
    Client,
    Contribution,
    Event,
    Metric,
    Participation,
    Round,
    Run,
)
from fedplat.store.records import (
    ContributionRecord,
    ContributionRow,
    ParticipationRecord,
    ParticipationRow,
    RoundClose,
    RoundRecord,
)
from fedplat.store.statuses import FINAL_ROUND_STATUSES, PARTICIPATION_STATUSES
from fedplat.store.validate import (
    _ID_MAX,
    _KIND_MAX,
    _SHA256_HEX_LEN,
    INT64_MAX,
    StoreError,
    _aware,
    _choice,
    _count,
    _encode,
    _finite,
    _now,
    _opt_finite,
    _opt_text,
    _text,
)

MAX_FLAG_LEN = _KIND_MAX
MAX_FLAGS = 32


def _flags_json(field: str, flags: Sequence[str]) -> str:
    if len(flags) > MAX_FLAGS:
        raise StoreError(f"{field}: at most {MAX_FLAGS} flags")
    return json.dumps([_text(f"{field} flag", f, MAX_FLAG_LEN) for f in flags])


def _participation_values(
    run_id: str, number: int, p: ParticipationRow, now: datetime
) -> dict[str, Any]:
    f = f"participation of {p.client_id!r}"
    v = p.verdict
    return {
        "run_id": run_id,
        "round_number": number,
        "client_id": _text(f"{f} client_id", p.client_id, _ID_MAX),
        "status": _choice(f"{f} status", p.status, PARTICIPATION_STATUSES),
        "bytes_up": _count(f"{f} bytes_up", p.bytes_up, maximum=INT64_MAX),
        "bytes_down": _count(f"{f} bytes_down", p.bytes_down, maximum=INT64_MAX),
        "num_examples": _count(f"{f} num_examples", p.num_examples),
        "duration_s": _opt_finite(f"{f} duration_s", p.duration_s, nonneg=True),
        "train_loss": _opt_finite(f"{f} train_loss", p.train_loss),
        "weight": _opt_finite(f"{f} weight", v.weight),
        "selected": v.selected,
        "score": _opt_finite(f"{f} score", v.score),
        "flags": _flags_json(f, v.flags),
        "reason": _opt_text(f"{f} reason", p.reason),
        "updated_at": now,
    }


def participation_problem(p: ParticipationRow) -> str | None:
    """Why the store would refuse ``p`` (a value out of its column's range, a
    bad status or flag), or None: a writer can drop one client's record instead
    of failing the round's transaction."""
    try:
        _participation_values("-", 1, p, _now())
    except StoreError as exc:
        return str(exc)
    return None


def _contribution_values(
    run_id: str, number: int, c: ContributionRow
) -> dict[str, Any]:
    f = f"contribution of {c.client_id!r}"
    scores = {
        _text(f"{f} scorer", k, _KIND_MAX): _finite(f"{f} score {k!r}", v)
        for k, v in c.scores.items()
    }
    return {
        "run_id": run_id,
        "round_number": number,
        "client_id": _text(f"{f} client_id", c.client_id, _ID_MAX),
        "score": _opt_finite(f"{f} score", c.score),
        "scores_json": _encode(f"{f} scores", scores),
        "suspect": bool(c.suspect),
        "flags": _flags_json(f, c.flags),
    }


def _check_sha(value: str | None) -> str | None:
    if value is None:
        return None
    if (
        not isinstance(value, str)
        or len(value) != _SHA256_HEX_LEN
        or any(c not in "0123456789abcdefABCDEF" for c in value)
    ):
        raise StoreError("checkpoint_sha256 must be 64 hexadecimal characters")
    return value.lower()


class RoundsStore(StoreBase):
    """Rounds, participations and contributions (see the module docstring)."""

    def open_round(
        self,
        run_id: str,
        number: int,
        *,
        num_selected: int,
        deadline_at: datetime,
        model_version: int,
    ) -> RoundRecord:
        """Open round ``number`` (or reopen it while it is still ``open``).

        Raises
        ------
        StoreError
            If the round is closed (``completed`` or ``failed``), or ``number`` is
            outside ``1..total_rounds``.
        """
        _count("number", number, minimum=1)
        # Zero: a Poisson draw may select nobody (under central DP the round
        # still releases a noised model).
        _count("num_selected", num_selected)
        _count("model_version", model_version)
        deadline = _aware("deadline_at", deadline_at)
        now = _now()
        with self._write() as session:
            run = self._require_run(session, run_id, lock=True)
            if number > run.total_rounds:
                raise StoreError(
                    f"round {number} exceeds total_rounds {run.total_rounds} "
                    f"of run {run_id!r}"
                )
            row = session.scalar(
                select(Round)
                .where(Round.run_id == run_id, Round.number == number)
                .with_for_update()
            )
            if row is None:
                row = Round(run_id=run_id, number=number)
                session.add(row)
            elif row.status != "open":
                raise StoreError(
                    f"round {number} of run {run_id!r} is {row.status}; a closed "
                    "round is never reopened"
                )
            row.status = "open"
            row.started_at = now
            row.finished_at = None
            row.deadline_at = deadline
            row.num_selected = num_selected
            row.num_succeeded = row.num_failed = row.num_aggregated = 0
            row.accuracy = row.loss = None
            row.model_version = model_version
            row.checkpoint_path = row.checkpoint_sha256 = None
            row.bytes_up = row.bytes_down = 0
            row.reason = None
            session.flush()
            return _round_record(row)

    def close_round(self, run_id: str, number: int, close: RoundClose) -> RoundRecord:
        """Write everything of round ``number`` in one transaction and close it.

        There is one participation per selected client (``num_selected`` of
        :meth:`open_round`), and contributions only for those clients: the store
        refuses to write what ``fedplat store check`` would report.
        ``num_succeeded`` and ``num_aggregated`` count participations with status
        ``succeeded``; ``num_failed`` all others; byte totals sum them. A
        ``completed`` round advances the run's ``current_round`` and
        ``best_accuracy``; ``close.run_status`` also finishes the run.
        """
        _count("number", number, minimum=1)
        _choice("status", close.status, FINAL_ROUND_STATUSES)
        acc = _opt_finite("accuracy", close.accuracy)
        loss = _opt_finite("loss", close.loss)
        parts = [
            _participation_values(run_id, number, p, _now())
            for p in close.participations
        ]
        ids = [p["client_id"] for p in parts]
        if len(set(ids)) != len(ids):
            raise StoreError("a client appears twice among the participations")
        contribs = [
            _contribution_values(run_id, number, c) for c in close.contributions
        ]
        stray = sorted({c["client_id"] for c in contribs} - set(ids))
        if stray:
            raise StoreError(
                f"contributions for clients without a participation: {stray[:10]}"
            )
        metrics = metric_rows(run_id, close.metrics or {}, number, None)
        for cid, values in (close.client_metrics or {}).items():
            metrics += metric_rows(run_id, values, number, cid)
        events = event_rows(run_id, close.events)
        with self._write() as session:
            run = self._require_run(session, run_id, lock=True)
            row = self._open_round_row(session, run_id, number)
            if len(parts) != row.num_selected:
                raise StoreError(
                    f"round {number} of run {run_id!r} selected {row.num_selected} "
                    f"clients; got {len(parts)} participations (one per selected "
                    "client)"
                )
            self._check_enrolled(
                session, run_id, ids + [c["client_id"] for c in contribs]
            )
            if parts:
                session.execute(insert(Participation), parts)
            if contribs:
                session.execute(insert(Contribution), contribs)
            if metrics:
                session.execute(insert(Metric), metrics)
            if events:
                session.execute(insert(Event), events)
            if close.ledger is not None:
                append_ledger_rows(session, run_id, *close.ledger)
            ok = sum(p["status"] == "succeeded" for p in parts)
            row.status = close.status
            row.finished_at = _now()
            row.num_succeeded = row.num_aggregated = ok
            row.num_failed = len(parts) - ok
            row.bytes_up = sum(p["bytes_up"] for p in parts)
            row.bytes_down = sum(p["bytes_down"] for p in parts)
            row.accuracy, row.loss = acc, loss
            row.checkpoint_path = _opt_text("checkpoint_path", close.checkpoint_path)
            row.checkpoint_sha256 = _check_sha(close.checkpoint_sha256)
            row.reason = _opt_text("reason", close.reason)
            session.flush()
            self._advance_run(session, run, number, close, acc)
            return _round_record(row)

    @staticmethod
    def _open_round_row(session: Session, run_id: str, number: int) -> Round:
        row = session.scalar(
            select(Round)
            .where(Round.run_id == run_id, Round.number == number)
            .with_for_update()
        )
        if row is None:
            raise StoreError(f"unknown round {number} of run {run_id!r}")
        if row.status != "open":
            raise StoreError(
                f"round {number} of run {run_id!r} is {row.status}, not open; "
                "a closed round is never rewritten"
            )
        return row

    @staticmethod
    def _check_enrolled(session: Session, run_id: str, ids: list[str]) -> None:
        if not ids:
            return
        known = set(
            session.scalars(
                select(Client.id).where(Client.run_id == run_id, Client.id.in_(ids))
            )
        )
        missing = sorted(set(ids) - known)
        if missing:
            raise StoreError(f"clients not enrolled in run {run_id!r}: {missing[:10]}")

    @staticmethod
    def _advance_run(
        session: Session, run: Run, number: int, close: RoundClose, acc: float | None
    ) -> None:
        values: dict[str, Any] = {}
        if close.status == "completed":
            values["current_round"] = number
            if acc is not None:
                # Computed by the database from the committed value, so a
                # concurrent update_run cannot be lost to a read-modify-write.
                values["best_accuracy"] = case(
                    (or_(Run.best_accuracy.is_(None), Run.best_accuracy < acc), acc),
                    else_=Run.best_accuracy,
                )
        if close.run_status is not None:
            values["status"] = _choice(
                "run_status", close.run_status, ("completed", "failed")
            )
            values["finished_at"] = _now()
            values["phase"] = None
            if close.run_status == "failed":
                values["reason"] = close.reason
        if values:
            session.execute(
                update(Run)
                .where(Run.id == run.id)
                .values(**values)
                .execution_options(synchronize_session=False)
            )

    # ------------------------------------------------------------------ reads

    def get_round(self, run_id: str, number: int) -> RoundRecord | None:
        """Return one round of a run, or ``None``."""
        with self._read() as session:
            row = session.scalar(
                select(Round).where(Round.run_id == run_id, Round.number == number)
            )
            return None if row is None else _round_record(row)

    def list_rounds(self, run_id: str) -> list[RoundRecord]:
        """Return the rounds of a run in ascending order of number."""
        with self._read() as session:
            rows = session.scalars(
                select(Round).where(Round.run_id == run_id).order_by(Round.number)
            )
            return [_round_record(r) for r in rows]

    def last_completed_round(self, run_id: str) -> RoundRecord | None:
        """Return the highest-numbered completed round of a run, or ``None``."""
        with self._read() as session:
            row = session.scalar(
                select(Round)
                .where(Round.run_id == run_id, Round.status == "completed")
                .order_by(Round.number.desc())
                .limit(1)
            )
            return None if row is None else _round_record(row)

    def list_participations(
        self,
        run_id: str,
        round_number: int | None = None,
        client_id: str | None = None,
    ) -> list[ParticipationRecord]:
        """Participations of a run (optionally one round and/or client), ordered
        by round number, then client id."""
        query = select(Participation).where(Participation.run_id == run_id)
        if round_number is not None:
            query = query.where(Participation.round_number == round_number)
        if client_id is not None:
            query = query.where(Participation.client_id == client_id)
        query = query.order_by(Participation.round_number, Participation.client_id)
        with self._read() as session:
            return [_participation_record(r) for r in session.scalars(query)]

    def list_contributions(
        self,
        run_id: str,
        round_number: int | None = None,
        client_id: str | None = None,
    ) -> list[ContributionRecord]:
        """Contribution rows of a run, ordered by round number, then client id."""
        query = select(Contribution).where(Contribution.run_id == run_id)
        if round_number is not None:
            query = query.where(Contribution.round_number == round_number)
        if client_id is not None:
            query = query.where(Contribution.client_id == client_id)
        query = query.order_by(Contribution.round_number, Contribution.client_id)
        with self._read() as session:
            return [_contribution_record(r) for r in session.scalars(query)]

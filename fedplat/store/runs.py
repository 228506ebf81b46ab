"""Runs: create, read, update."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import select, update

from fedplat.store.base import StoreBase
from fedplat.store.convert import (
    _run_record,
)
from fedplat.store.models import (
    Run,
)
from fedplat.store.records import (
    RunRecord,
)
from fedplat.store.statuses import (
    RUN_STATUSES,
)
from fedplat.store.validate import (
    _NAME_MAX,
    StoreError,
    _aware,
    _choice,
    _count,
    _encode,
    _now,
    _opt_aware,
    _opt_finite,
    _opt_text,
    _text,
)

#: How often a running coordinator stamps ``runs.heartbeat_at`` (seconds). Readers
#: judge a run whose stamp is many periods old as no longer driven by anyone.
HEARTBEAT_SECONDS = 2.0


class RunsStore(StoreBase):
    """Runs: create, read, update."""

    # ------------------------------------------------------------------ #
    # Runs                                                                 #
    # ------------------------------------------------------------------ #

    def create_run(
        self,
        name: str,
        config: dict[str, Any],
        layout: dict[str, Any],
        total_rounds: int,
    ) -> RunRecord:
        """Create a run in status ``pending``.

        Parameters
        ----------
        name
            Unique, human-readable name.
        config
            The run's configuration (JSON-serializable).
        layout
            The model's parameter layout (JSON-serializable; key order is kept).
        total_rounds
            Number of rounds to train, at least 1.

        Returns
        -------
        RunRecord
            The new run, with a fresh uuid4-hex ``id``.
        """
        _text("name", name, _NAME_MAX)
        config_json = _encode("config", config)
        layout_json = _encode("layout", layout)
        _count("total_rounds", total_rounds, minimum=1)
        row = Run(
            id=uuid.uuid4().hex,
            name=name,
            status="pending",
            config_json=config_json,
            layout_json=layout_json,
            total_rounds=total_rounds,
            current_round=0,
            best_accuracy=None,
            created_at=_now(),
            started_at=None,
            finished_at=None,
        )
        with self._write() as session:
            if session.scalar(select(Run.id).where(Run.name == name)) is not None:
                raise StoreError(f"a run named {name!r} already exists")
            session.add(row)
            session.flush()
            return _run_record(row)

    def get_run(self, run_id: str) -> RunRecord | None:
        """Return the run with this id, or ``None``."""
        with self._read() as session:
            row = session.get(Run, run_id)
            return None if row is None else _run_record(row)

    def get_run_by_name(self, name: str) -> RunRecord | None:
        """Return the run with this name, or ``None``."""
        with self._read() as session:
            row = session.scalar(select(Run).where(Run.name == name))
            return None if row is None else _run_record(row)

    def list_runs(self) -> list[RunRecord]:
        """Return all runs, newest first."""
        with self._read() as session:
            rows = session.scalars(
                select(Run).order_by(Run.created_at.desc(), Run.name)
            )
            return [_run_record(r) for r in rows]

    def update_run(
        self,
        run_id: str,
        *,
        status: str | None = None,
        current_round: int | None = None,
        best_accuracy: float | None = None,
        started_at: datetime | None = None,
        finished_at: datetime | None = None,
        total_rounds: int | None = None,
        reason: str | None = None,
    ) -> RunRecord:
        """Set the given fields of a run (``None`` leaves a field unchanged).

        ``total_rounds`` may grow (a run extended by a larger ``run.rounds``) but
        never below the rounds already completed.

        Returns
        -------
        RunRecord
            The run after the update.
        """
        if status is not None:
            _choice("status", status, RUN_STATUSES)
        if current_round is not None:
            _count("current_round", current_round)
        accuracy = _opt_finite("best_accuracy", best_accuracy)
        started = _opt_aware("started_at", started_at)
        finished = _opt_aware("finished_at", finished_at)
        if total_rounds is not None:
            _count("total_rounds", total_rounds, minimum=1)
        _opt_text("reason", reason)
        with self._write() as session:
            row = self._require_run(session, run_id, lock=True)
            if total_rounds is not None:
                if total_rounds < row.current_round:
                    raise StoreError(
                        f"run {run_id!r} already completed {row.current_round} "
                        f"rounds; total_rounds cannot be {total_rounds}"
                    )
                row.total_rounds = total_rounds
            if reason is not None:
                row.reason = reason
            if current_round is not None:
                if current_round > row.total_rounds:
                    raise StoreError(
                        f"current_round {current_round} exceeds total_rounds "
                        f"{row.total_rounds} of run {run_id!r}"
                    )
                row.current_round = current_round
            if status is not None:
                row.status = status
            if accuracy is not None:
                row.best_accuracy = accuracy
            if started is not None:
                row.started_at = started
            if finished is not None:
                row.finished_at = finished
            session.flush()
            return _run_record(row)

    def heartbeat(
        self,
        run_id: str,
        *,
        phase: str | None,
        live_clients: int | None,
        when: datetime | None = None,
    ) -> None:
        """The coordinator is alive: stamp ``heartbeat_at``, its phase and count.

        Written every :data:`HEARTBEAT_SECONDS` while it runs, and once more with
        phase ``"stopped"`` when it stops cleanly. ``when`` (default: now) is for
        replaying a history, as tests do.
        """
        if phase is not None:
            _text("phase", phase, 32)
        if live_clients is not None:
            _count("live_clients", live_clients)
        at = _now() if when is None else _aware("when", when)
        with self._write() as session:
            session.execute(
                update(Run)
                .where(Run.id == run_id)
                .values(heartbeat_at=at, phase=phase, live_clients=live_clients)
                .execution_options(synchronize_session=False)
            )

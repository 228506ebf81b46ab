"""Rounds and participations."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import case, delete, func, insert, or_, select, update

from fedplat.store.base import StoreBase
from fedplat.store.convert import (
    _participation_record,
    _round_record,
)
from fedplat.store.models import (
    Client,
    Participation,
    Round,
    Run,
)
from fedplat.store.records import (
    ParticipationRecord,
    RoundRecord,
)
from fedplat.store.statuses import (
    FINAL_ROUND_STATUSES,
    PARTICIPATION_STATUSES,
)
from fedplat.store.validate import (
    _ID_MAX,
    _SHA256_HEX_LEN,
    StoreError,
    _aware,
    _choice,
    _count,
    _encode,
    _finite,
    _now,
    _opt_finite,
    _opt_text,
    _rowcount,
    _text,
    _try_insert,
)


class RoundsStore(StoreBase):
    """Rounds and participations."""

    # ------------------------------------------------------------------ #
    # Rounds                                                               #
    # ------------------------------------------------------------------ #

    def start_round(
        self,
        run_id: str,
        number: int,
        *,
        selected: list[str],
        deadline_at: datetime,
        model_version: int,
    ) -> RoundRecord:
        """Open round ``number`` with one ``selected`` participation per client.

        A round that exists with status ``open`` or ``failed`` (a retry, or a
        coordinator restarted mid-round) is reset: its counters, results and
        participations are replaced. A ``completed`` round cannot be restarted.

        Parameters
        ----------
        run_id
            The run.
        number
            Round number, ``1 <= number <= total_rounds``.
        selected
            Ids of enrolled clients of the run; non-empty, no duplicates.
        deadline_at
            Timezone-aware time after which updates are late.
        model_version
            Version of the global model the clients train from.

        Returns
        -------
        RoundRecord
            The open round.
        """
        _count("number", number, minimum=1)
        _count("model_version", model_version)
        deadline = _aware("deadline_at", deadline_at)
        if isinstance(selected, str) or not isinstance(selected, list | tuple):
            raise StoreError("selected must be a list of client ids")
        for client_id in selected:
            _text("selected client id", client_id, _ID_MAX)
        if not selected:
            raise StoreError("selected must name at least one client")
        if len(set(selected)) != len(selected):
            raise StoreError("selected contains duplicate client ids")
        now = _now()
        with self._write() as session:
            run = self._require_run(session, run_id, lock=True)
            if number > run.total_rounds:
                raise StoreError(
                    f"round {number} exceeds total_rounds {run.total_rounds} "
                    f"of run {run_id!r}"
                )
            known = set(
                session.scalars(
                    select(Client.id).where(
                        Client.run_id == run_id, Client.id.in_(selected)
                    )
                )
            )
            missing = [c for c in selected if c not in known]
            if missing:
                raise StoreError(
                    f"clients not enrolled in run {run_id!r}: {missing[:10]}"
                )
            row = session.scalar(
                select(Round)
                .where(Round.run_id == run_id, Round.number == number)
                .with_for_update()
            )
            if row is None:
                row = Round(run_id=run_id, number=number)
                session.add(row)
            elif row.status == "completed":
                raise StoreError(
                    f"round {number} of run {run_id!r} is completed; "
                    "it cannot be restarted"
                )
            row.status = "open"
            row.started_at = now
            row.finished_at = None
            row.deadline_at = deadline
            row.num_selected = len(selected)
            row.num_succeeded = 0
            row.num_failed = 0
            row.accuracy = None
            row.loss = None
            row.model_version = model_version
            row.checkpoint_path = None
            row.checkpoint_sha256 = None
            row.bytes_up = 0
            row.bytes_down = 0
            row.reason = None
            session.execute(
                delete(Participation)
                .where(
                    Participation.run_id == run_id,
                    Participation.round_number == number,
                )
                .execution_options(synchronize_session=False)
            )
            # The round row must exist before participations reference it.
            session.flush()
            session.execute(
                insert(Participation),
                [
                    {
                        "run_id": run_id,
                        "round_number": number,
                        "client_id": client_id,
                        "status": "selected",
                        "bytes_up": 0,
                        "bytes_down": 0,
                        "num_examples": 0,
                        "flags_json": "{}",
                        "updated_at": now,
                    }
                    for client_id in selected
                ],
            )
            return _round_record(row)

    def finish_round(
        self,
        run_id: str,
        number: int,
        *,
        status: str,
        accuracy: float | None = None,
        loss: float | None = None,
        checkpoint_path: str | None = None,
        checkpoint_sha256: str | None = None,
        reason: str | None = None,
    ) -> RoundRecord:
        """Close an open round and total its participations.

        ``num_succeeded`` counts participations with status ``succeeded``;
        ``num_failed`` counts all others (clients still ``selected`` or
        ``downloaded`` when the round closes never delivered). Byte totals sum all
        participations.

        When ``status`` is ``completed``, the run's ``current_round`` becomes
        ``number`` and its ``best_accuracy`` the maximum of the old value and
        ``accuracy``, in the same transaction as the round: no crash can leave a
        completed round that the run does not reflect, which resumption relies on.

        Parameters
        ----------
        run_id, number
            The round, which must be ``open``.
        status
            ``completed`` or ``failed``.
        accuracy, loss
            Evaluation of the new global model (finite), if any.
        checkpoint_path, checkpoint_sha256
            Where the round's checkpoint was written and its hex SHA-256.
        reason
            Why the round failed.

        Returns
        -------
        RoundRecord
            The closed round.
        """
        _count("number", number, minimum=1)
        _choice("status", status, FINAL_ROUND_STATUSES)
        acc = _opt_finite("accuracy", accuracy)
        loss_value = _opt_finite("loss", loss)
        _opt_text("checkpoint_path", checkpoint_path)
        _opt_text("reason", reason)
        if checkpoint_sha256 is not None and (
            not isinstance(checkpoint_sha256, str)
            or len(checkpoint_sha256) != _SHA256_HEX_LEN
            or any(c not in "0123456789abcdefABCDEF" for c in checkpoint_sha256)
        ):
            raise StoreError("checkpoint_sha256 must be 64 hexadecimal characters")
        with self._write() as session:
            row = session.scalar(
                select(Round)
                .where(Round.run_id == run_id, Round.number == number)
                .with_for_update()
            )
            if row is None:
                raise StoreError(f"unknown round {number} of run {run_id!r}")
            if row.status != "open":
                raise StoreError(
                    f"round {number} of run {run_id!r} is {row.status}, not open"
                )
            succeeded = case((Participation.status == "succeeded", 1), else_=0)
            total, n_ok, up, down = session.execute(
                select(
                    func.count(Participation.id),
                    func.coalesce(func.sum(succeeded), 0),
                    func.coalesce(func.sum(Participation.bytes_up), 0),
                    func.coalesce(func.sum(Participation.bytes_down), 0),
                ).where(
                    Participation.run_id == run_id,
                    Participation.round_number == number,
                )
            ).one()
            row.status = status
            row.finished_at = _now()
            row.num_succeeded = int(n_ok)
            row.num_failed = int(total) - int(n_ok)
            row.bytes_up = int(up)
            row.bytes_down = int(down)
            row.accuracy = acc
            row.loss = loss_value
            row.checkpoint_path = checkpoint_path
            row.checkpoint_sha256 = (
                None if checkpoint_sha256 is None else checkpoint_sha256.lower()
            )
            row.reason = reason
            session.flush()
            if status == "completed":
                values: dict[str, Any] = {"current_round": number}
                if acc is not None:
                    # Computed by the database from the committed value, so a
                    # concurrent update_run cannot be lost to a read-modify-write.
                    values["best_accuracy"] = case(
                        (
                            or_(Run.best_accuracy.is_(None), Run.best_accuracy < acc),
                            acc,
                        ),
                        else_=Run.best_accuracy,
                    )
                session.execute(
                    update(Run)
                    .where(Run.id == run_id)
                    .values(**values)
                    .execution_options(synchronize_session=False)
                )
            return _round_record(row)

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

    # ------------------------------------------------------------------ #
    # Participations                                                       #
    # ------------------------------------------------------------------ #

    def update_participation(
        self,
        run_id: str,
        round_number: int,
        client_id: str,
        *,
        status: str | None = None,
        bytes_up: int | None = None,
        bytes_down: int | None = None,
        num_examples: int | None = None,
        duration_s: float | None = None,
        train_loss: float | None = None,
        weight: float | None = None,
        flags: dict[str, Any] | None = None,
        reason: str | None = None,
    ) -> None:
        """Update (or create) one client's participation in a round.

        ``bytes_up`` and ``bytes_down`` are *added* to the stored totals (a client
        may download or upload in several attempts); every other given field
        replaces the stored value (``flags`` as a whole). A missing row is created
        with status ``selected`` unless ``status`` is given; the round must exist
        and the client must be enrolled in the run.
        """
        _count("round_number", round_number, minimum=1)
        _text("client_id", client_id, _ID_MAX)
        values: dict[str, Any] = {}
        if status is not None:
            values["status"] = _choice("status", status, PARTICIPATION_STATUSES)
        if num_examples is not None:
            values["num_examples"] = _count("num_examples", num_examples)
        if duration_s is not None:
            values["duration_s"] = _finite("duration_s", duration_s, nonneg=True)
        if train_loss is not None:
            values["train_loss"] = _finite("train_loss", train_loss)
        if weight is not None:
            values["weight"] = _finite("weight", weight)
        if flags is not None:
            values["flags_json"] = _encode("flags", flags)
        if reason is not None:
            values["reason"] = _opt_text("reason", reason)
        add_up = 0 if bytes_up is None else _count("bytes_up", bytes_up)
        add_down = 0 if bytes_down is None else _count("bytes_down", bytes_down)
        values["updated_at"] = _now()

        # Increments are done by the database (col = col + n), not read-modify-
        # write in Python, so concurrent reports for one client are never lost.
        increments = {
            "bytes_up": Participation.bytes_up + add_up,
            "bytes_down": Participation.bytes_down + add_down,
        }
        stmt = (
            update(Participation)
            .where(
                Participation.run_id == run_id,
                Participation.round_number == round_number,
                Participation.client_id == client_id,
            )
            .values(**values, **increments)
            .execution_options(synchronize_session=False)
        )
        with self._write() as session:
            if _rowcount(session.execute(stmt)) > 0:
                return
            round_exists = session.scalar(
                select(Round.id).where(
                    Round.run_id == run_id, Round.number == round_number
                )
            )
            if round_exists is None:
                raise StoreError(f"unknown round {round_number} of run {run_id!r}")
            if session.get(Client, (run_id, client_id)) is None:
                raise StoreError(f"unknown client {client_id!r} in run {run_id!r}")
            row = Participation(
                run_id=run_id,
                round_number=round_number,
                client_id=client_id,
                status=values.get("status", "selected"),
                bytes_up=add_up,
                bytes_down=add_down,
                num_examples=values.get("num_examples", 0),
                duration_s=values.get("duration_s"),
                train_loss=values.get("train_loss"),
                weight=values.get("weight"),
                flags_json=values.get("flags_json", "{}"),
                reason=values.get("reason"),
                updated_at=values["updated_at"],
            )
            if not _try_insert(session, row):
                # Another writer created the row first: apply ours on top of it.
                session.execute(stmt)

    def list_participations(
        self,
        run_id: str,
        round_number: int | None = None,
        client_id: str | None = None,
    ) -> list[ParticipationRecord]:
        """Return participations of a run, optionally of one round and/or client.

        Ordered by round number, then client id.
        """
        query = select(Participation).where(Participation.run_id == run_id)
        if round_number is not None:
            query = query.where(Participation.round_number == round_number)
        if client_id is not None:
            query = query.where(Participation.client_id == client_id)
        query = query.order_by(Participation.round_number, Participation.client_id)
        with self._read() as session:
            return [_participation_record(r) for r in session.scalars(query)]

"""The store's API: a thread-safe repository over the fedplat database.

Every public method runs in its own short transaction on its own ``Session``, so
the coordinator may call a single :class:`Store` from many gRPC worker threads.
Results are detached frozen dataclasses (:mod:`fedplat.store.records`); ORM objects
never leave this module.

Inputs are validated here, at the boundary, and every failure (bad input, unknown
run or client, integrity or connection errors) surfaces as :class:`StoreError`, so
callers need to catch one exception type.
"""

from __future__ import annotations

import itertools
import json
import math
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from numbers import Real
from typing import Any, cast

from sqlalchemy import CursorResult, case, delete, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from fedplat.store.engine import WRITE_TRANSACTION_OPTION, make_engine, resolve_url
from fedplat.store.models import (
    Base,
    Client,
    Event,
    LedgerEntry,
    LedgerHead,
    Metric,
    Participation,
    Round,
    Run,
)
from fedplat.store.records import (
    ClientRecord,
    EventRecord,
    LedgerEntryLike,
    LedgerEntryRecord,
    LedgerHeadLike,
    LedgerHeadRecord,
    MetricRecord,
    ParticipationRecord,
    RoundRecord,
    RunRecord,
)
from fedplat.store.schema import migrate as _migrate
from fedplat.store.statuses import (
    CLIENT_STATUSES,
    EVENT_LEVELS,
    FINAL_ROUND_STATUSES,
    PARTICIPATION_STATUSES,
    RUN_STATUSES,
)

# Column widths of the schema; longer values would be truncated by some backends
# and rejected by others, so they are rejected here with a clear message.
_ID_MAX = 64
_NAME_MAX = 255
_KIND_MAX = 64
_SHA256_HEX_LEN = 64


class StoreError(RuntimeError):
    """Invalid input, a missing or conflicting row, or a database failure."""


# --------------------------------------------------------------------------- #
# Validation helpers                                                           #
# --------------------------------------------------------------------------- #


def _now() -> datetime:
    return datetime.now(UTC)


def _choice(field: str, value: object, allowed: Iterable[str]) -> str:
    allowed = tuple(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise StoreError(f"{field} must be one of {list(allowed)}, got {value!r}")
    return value


def _text(field: str, value: object, max_len: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise StoreError(f"{field} must be a non-empty string, got {value!r}")
    if len(value) > max_len:
        raise StoreError(f"{field} must be at most {max_len} characters")
    return value


def _opt_text(field: str, value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise StoreError(f"{field} must be a string or None, got {value!r}")
    return value


def _count(field: str, value: object, *, minimum: int = 0) -> int:
    # bool is an int subclass; True as a byte count is always a caller bug.
    if isinstance(value, bool) or not isinstance(value, int):
        raise StoreError(f"{field} must be an integer, got {value!r}")
    if value < minimum:
        raise StoreError(f"{field} must be >= {minimum}, got {value}")
    return value


def _finite(field: str, value: object, *, nonneg: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise StoreError(f"{field} must be a real number, got {value!r}")
    result = float(value)
    if not math.isfinite(result):
        raise StoreError(f"{field} must be finite, got {result}")
    if nonneg and result < 0:
        raise StoreError(f"{field} must be >= 0, got {result}")
    return result


def _opt_finite(field: str, value: object, *, nonneg: bool = False) -> float | None:
    return None if value is None else _finite(field, value, nonneg=nonneg)


def _aware(field: str, value: object) -> datetime:
    if not isinstance(value, datetime):
        raise StoreError(f"{field} must be a datetime, got {value!r}")
    # A naive datetime is ambiguous (local time? UTC?); guessing would silently
    # shift deadlines by the host's UTC offset.
    if value.tzinfo is None or value.utcoffset() is None:
        raise StoreError(f"{field} must be timezone-aware (e.g. datetime.now(UTC))")
    return value.astimezone(UTC)


def _opt_aware(field: str, value: object) -> datetime | None:
    return None if value is None else _aware(field, value)


def _json_default(value: Any) -> Any:
    # numpy / torch scalars (e.g. a score computed by an aggregator) expose
    # .item(); anything else is a caller bug and must not be stringified.
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError):
            pass
    raise TypeError(f"{type(value).__name__} is not JSON-serializable")


def _check_keys(field: str, value: Any) -> None:
    # json.dumps silently turns 1 into "1"; the round trip would then differ and
    # lookups by the original key would fail far from the cause.
    if isinstance(value, Mapping):
        for key, inner in value.items():
            if not isinstance(key, str):
                raise StoreError(f"{field}: JSON object keys must be str, got {key!r}")
            _check_keys(field, inner)
    elif isinstance(value, list | tuple):
        for inner in value:
            _check_keys(field, inner)


def _encode(field: str, value: object) -> str:
    if not isinstance(value, Mapping):
        raise StoreError(f"{field} must be a dict, got {type(value).__name__}")
    _check_keys(field, value)
    try:
        # allow_nan=False: NaN/Infinity are not JSON and break the monitor's parser.
        return json.dumps(dict(value), allow_nan=False, default=_json_default)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{field} is not JSON-serializable: {exc}") from exc


def _decode(text: str) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads(text))


# --------------------------------------------------------------------------- #
# ORM -> record conversion                                                     #
# --------------------------------------------------------------------------- #


def _run_record(row: Run) -> RunRecord:
    return RunRecord(
        id=row.id,
        name=row.name,
        status=row.status,
        config=_decode(row.config_json),
        layout=_decode(row.layout_json),
        total_rounds=row.total_rounds,
        current_round=row.current_round,
        best_accuracy=row.best_accuracy,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
    )


def _client_record(row: Client) -> ClientRecord:
    return ClientRecord(
        run_id=row.run_id,
        id=row.id,
        name=row.name,
        status=row.status,
        enrolled_at=row.enrolled_at,
        last_seen=row.last_seen,
        num_examples=row.num_examples,
        info=_decode(row.info_json),
    )


def _round_record(row: Round) -> RoundRecord:
    return RoundRecord(
        id=row.id,
        run_id=row.run_id,
        number=row.number,
        status=row.status,
        started_at=row.started_at,
        finished_at=row.finished_at,
        deadline_at=row.deadline_at,
        num_selected=row.num_selected,
        num_succeeded=row.num_succeeded,
        num_failed=row.num_failed,
        accuracy=row.accuracy,
        loss=row.loss,
        model_version=row.model_version,
        checkpoint_path=row.checkpoint_path,
        checkpoint_sha256=row.checkpoint_sha256,
        bytes_up=row.bytes_up,
        bytes_down=row.bytes_down,
        reason=row.reason,
    )


def _participation_record(row: Participation) -> ParticipationRecord:
    return ParticipationRecord(
        id=row.id,
        run_id=row.run_id,
        round_number=row.round_number,
        client_id=row.client_id,
        status=row.status,
        bytes_up=row.bytes_up,
        bytes_down=row.bytes_down,
        num_examples=row.num_examples,
        duration_s=row.duration_s,
        train_loss=row.train_loss,
        weight=row.weight,
        flags=_decode(row.flags_json),
        reason=row.reason,
        updated_at=row.updated_at,
    )


def _metric_record(row: Metric) -> MetricRecord:
    return MetricRecord(
        id=row.id,
        run_id=row.run_id,
        round_number=row.round_number,
        client_id=row.client_id,
        name=row.name,
        value=row.value,
        created_at=row.created_at,
    )


def _event_record(row: Event) -> EventRecord:
    return EventRecord(
        id=row.id,
        run_id=row.run_id,
        round_number=row.round_number,
        client_id=row.client_id,
        kind=row.kind,
        level=row.level,
        message=row.message,
        details=_decode(row.details_json),
        created_at=row.created_at,
    )


def _ledger_entry_record(row: LedgerEntry) -> LedgerEntryRecord:
    return LedgerEntryRecord(
        id=row.id,
        run_id=row.run_id,
        seq=row.seq,
        round_number=row.round_number,
        client_id=row.client_id,
        payload_json=row.payload_json,
        prev_hash=row.prev_hash,
        entry_hash=row.entry_hash,
        signature=row.signature,
        created_at=row.created_at,
    )


def _ledger_head_record(row: LedgerHead) -> LedgerHeadRecord:
    return LedgerHeadRecord(
        run_id=row.run_id,
        seq=row.seq,
        head_hash=row.head_hash,
        signature=row.signature,
        public_key_pem=row.public_key_pem,
        key_id=row.key_id,
        updated_at=row.updated_at,
    )


_HEX = frozenset("0123456789abcdef")
_SIGNATURE_HEX_MAX = 128


def _sha_hex(field: str, value: object) -> str:
    # Lower-case only: the chain compares hashes as strings.
    if (
        not isinstance(value, str)
        or len(value) != _SHA256_HEX_LEN
        or not set(value) <= _HEX
    ):
        raise StoreError(f"{field} must be 64 lower-case hexadecimal characters")
    return value


def _opt_signature(field: str, value: object) -> str | None:
    if value is None:
        return None
    if (
        not isinstance(value, str)
        or not value
        or len(value) > _SIGNATURE_HEX_MAX
        or not set(value) <= _HEX
    ):
        raise StoreError(
            f"{field} must be None or at most {_SIGNATURE_HEX_MAX} lower-case "
            "hexadecimal characters"
        )
    return value


def _rowcount(result: object) -> int:
    return cast(CursorResult[Any], result).rowcount


def _try_insert(session: Session, row: Base) -> bool:
    """Insert ``row`` inside a savepoint; ``False`` if a unique key already exists.

    Another thread or process may insert the same key between our read and our
    insert. The savepoint keeps the surrounding transaction usable (PostgreSQL
    aborts the whole transaction on an error otherwise), so the caller can fall
    back to updating the row that won the race.
    """
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:
        return False
    return True


# --------------------------------------------------------------------------- #
# The store                                                                    #
# --------------------------------------------------------------------------- #


class Store:
    """Thread-safe repository of runs, clients, rounds, participations, metrics,
    events and the contribution ledger.

    Parameters
    ----------
    url
        Any SQLAlchemy URL (``sqlite:///...``, ``postgresql+psycopg://...``) or a
        plain filesystem path, which means a SQLite database at that path (parent
        directories are created).
    migrate
        Run Alembic ``upgrade head`` before use. Read-only clients such as the
        monitor pass ``False`` and rely on the coordinator having migrated.

    Attributes
    ----------
    url
        The resolved SQLAlchemy URL (password included; use ``repr`` to log).

    Notes
    -----
    On SQLite the database runs in WAL mode with a 30 s busy timeout, and write
    transactions begin with ``BEGIN IMMEDIATE``, so concurrent writers queue
    instead of failing with "database is locked".
    """

    url: str

    def __init__(self, url: str, *, migrate: bool = True) -> None:
        if not isinstance(url, str) or not url:
            raise StoreError(f"url must be a non-empty string, got {url!r}")
        try:
            resolved = resolve_url(url)
            self._engine = make_engine(resolved)
        except (SQLAlchemyError, ValueError, OSError) as exc:
            raise StoreError(f"cannot open store {url!r}: {exc}") from exc
        self.url = resolved.render_as_string(hide_password=False)
        self._display_url = resolved.render_as_string(hide_password=True)
        self._closed = False
        # expire_on_commit=False: records are built after commit without a
        # round trip to reload attributes the transaction itself just wrote.
        self._reader = sessionmaker(self._engine, expire_on_commit=False)
        self._writer = sessionmaker(
            self._engine.execution_options(**{WRITE_TRANSACTION_OPTION: True}),
            expire_on_commit=False,
        )
        if migrate:
            try:
                _migrate(self._engine)
            except Exception as exc:
                self._engine.dispose()
                raise StoreError(
                    f"cannot migrate store {self._display_url}: {exc}"
                ) from exc

    def __repr__(self) -> str:
        return f"Store({self._display_url!r})"

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release every pooled connection. Further calls raise StoreError."""
        if not self._closed:
            self._closed = True
            self._engine.dispose()

    # ------------------------------------------------------------------ #
    # Sessions                                                             #
    # ------------------------------------------------------------------ #

    @contextmanager
    def _session(self, factory: sessionmaker[Session]) -> Iterator[Session]:
        if self._closed:
            raise StoreError("store is closed")
        try:
            with factory.begin() as session:
                yield session
        except StoreError:
            raise
        except IntegrityError as exc:
            raise StoreError(f"integrity violation: {exc.orig}") from exc
        except SQLAlchemyError as exc:
            raise StoreError(f"database error: {exc}") from exc

    def _read(self) -> AbstractContextManager[Session]:
        return self._session(self._reader)

    def _write(self) -> AbstractContextManager[Session]:
        return self._session(self._writer)

    @staticmethod
    def _require_run(session: Session, run_id: str, *, lock: bool = False) -> Run:
        _text("run_id", run_id, _ID_MAX)
        run = session.get(Run, run_id, with_for_update=lock or None)
        if run is None:
            raise StoreError(f"unknown run {run_id!r}")
        return run

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
    ) -> RunRecord:
        """Set the given fields of a run (``None`` leaves a field unchanged).

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
        with self._write() as session:
            row = self._require_run(session, run_id, lock=True)
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

    # ------------------------------------------------------------------ #
    # Clients                                                              #
    # ------------------------------------------------------------------ #

    def upsert_client(
        self,
        run_id: str,
        client_id: str,
        *,
        name: str,
        num_examples: int,
        info: dict[str, Any] | None = None,
        status: str = "enrolled",
    ) -> ClientRecord:
        """Enroll a client in a run, or update an enrolled one.

        An existing client gets the given ``name``, ``num_examples`` and ``status``
        (policy such as "a banned client stays banned" is the caller's), ``info``
        if given, and ``last_seen`` = now; ``enrolled_at`` is kept.

        Returns
        -------
        ClientRecord
            The client after the upsert.
        """
        _text("client_id", client_id, _ID_MAX)
        _text("name", name, _NAME_MAX)
        _count("num_examples", num_examples)
        _choice("status", status, CLIENT_STATUSES)
        info_json = None if info is None else _encode("info", info)
        now = _now()
        with self._write() as session:
            self._require_run(session, run_id)
            row = session.get(Client, (run_id, client_id))
            if row is None:
                row = Client(
                    run_id=run_id,
                    id=client_id,
                    name=name,
                    status=status,
                    enrolled_at=now,
                    last_seen=now,
                    num_examples=num_examples,
                    info_json=info_json if info_json is not None else "{}",
                )
                if _try_insert(session, row):
                    return _client_record(row)
                row = session.get(Client, (run_id, client_id), populate_existing=True)
                if row is None:  # pragma: no cover - the conflicting row vanished
                    raise StoreError(f"cannot enroll client {client_id!r}")
            row.name = name
            row.num_examples = num_examples
            row.status = status
            row.last_seen = now
            if info_json is not None:
                row.info_json = info_json
            session.flush()
            return _client_record(row)

    def touch_client(
        self, run_id: str, client_id: str, *, status: str | None = None
    ) -> None:
        """Record that a client was heard from now, optionally changing its status."""
        values: dict[str, Any] = {"last_seen": _now()}
        if status is not None:
            values["status"] = _choice("status", status, CLIENT_STATUSES)
        with self._write() as session:
            result = session.execute(
                update(Client)
                .where(Client.run_id == run_id, Client.id == client_id)
                .values(**values)
                .execution_options(synchronize_session=False)
            )
            if _rowcount(result) == 0:
                raise StoreError(f"unknown client {client_id!r} in run {run_id!r}")

    def get_client(self, run_id: str, client_id: str) -> ClientRecord | None:
        """Return one client of a run, or ``None``."""
        with self._read() as session:
            row = session.get(Client, (run_id, client_id))
            return None if row is None else _client_record(row)

    def list_clients(self, run_id: str) -> list[ClientRecord]:
        """Return the clients of a run, ordered by id."""
        with self._read() as session:
            rows = session.scalars(
                select(Client).where(Client.run_id == run_id).order_by(Client.id)
            )
            return [_client_record(r) for r in rows]

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

    # ------------------------------------------------------------------ #
    # Metrics and events                                                   #
    # ------------------------------------------------------------------ #

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
        if not isinstance(values, Mapping):
            raise StoreError("values must be a dict of name -> number")
        if round_number is not None:
            _count("round_number", round_number)
        if client_id is not None:
            _text("client_id", client_id, _ID_MAX)
        now = _now()
        rows = [
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
        _text("kind", kind, _KIND_MAX)
        if not isinstance(message, str):
            raise StoreError(f"message must be a string, got {message!r}")
        _choice("level", level, EVENT_LEVELS)
        if round_number is not None:
            _count("round_number", round_number)
        if client_id is not None:
            _text("client_id", client_id, _ID_MAX)
        details_json = _encode("details", {} if details is None else details)
        with self._write() as session:
            if run_id is not None:
                self._require_run(session, run_id)
            session.add(
                Event(
                    run_id=run_id,
                    round_number=round_number,
                    client_id=client_id,
                    kind=kind,
                    level=level,
                    message=message,
                    details_json=details_json,
                    created_at=_now(),
                )
            )

    def list_events(
        self,
        run_id: str | None = None,
        kind: str | None = None,
        limit: int | None = None,
    ) -> list[EventRecord]:
        """Return events, newest first, optionally of one run and/or kind.

        ``run_id=None`` means events of every run and coordinator-wide ones.
        """
        query = select(Event)
        if run_id is not None:
            query = query.where(Event.run_id == run_id)
        if kind is not None:
            query = query.where(Event.kind == kind)
        query = query.order_by(Event.created_at.desc(), Event.id.desc())
        if limit is not None:
            query = query.limit(_count("limit", limit, minimum=1))
        with self._read() as session:
            return [_event_record(r) for r in session.scalars(query)]

    # ------------------------------------------------------------------ #
    # Contribution ledger                                                  #
    # ------------------------------------------------------------------ #

    def append_ledger(
        self,
        run_id: str,
        entries: Sequence[LedgerEntryLike],
        head: LedgerHeadLike,
    ) -> LedgerHeadRecord:
        """Append entries to a run's ledger and replace its head, atomically.

        The store keeps the chain append-only and linked; hashing, signing and
        verification are :mod:`fedplat.contribution.ledger`'s. Entries must
        continue the stored chain: consecutive ``seq`` starting right after the
        stored last entry (at 1 for an empty ledger), each ``prev_hash`` equal to
        the previous entry's ``entry_hash``. The head must name the new last
        entry. A concurrent writer that appended first makes this call fail
        instead of forking the chain.

        Parameters
        ----------
        run_id
            The run.
        entries
            New entries in chain order (may be empty to re-sign the head).
        head
            The new head: ``seq`` and ``head_hash`` of the last entry, its
            signature and the public key to verify it with.

        Returns
        -------
        LedgerHeadRecord
            The stored head.
        """
        rows: list[dict[str, Any]] = []
        for i, e in enumerate(entries):
            field = f"ledger entry {i}"
            _count(f"{field} seq", e.seq, minimum=1)
            _count(f"{field} round_number", e.round_number, minimum=1)
            _text(f"{field} client_id", e.client_id, _ID_MAX)
            _text(f"{field} payload_json", e.payload_json, 10**9)
            rows.append(
                {
                    "run_id": run_id,
                    "seq": e.seq,
                    "round_number": e.round_number,
                    "client_id": e.client_id,
                    "payload_json": e.payload_json,
                    "prev_hash": _sha_hex(f"{field} prev_hash", e.prev_hash),
                    "entry_hash": _sha_hex(f"{field} entry_hash", e.entry_hash),
                    "signature": _opt_signature(f"{field} signature", e.signature),
                }
            )
        for before, after in itertools.pairwise(rows):
            if after["seq"] != before["seq"] + 1:
                raise StoreError(
                    f"ledger entries must have consecutive seq, got {before['seq']} "
                    f"then {after['seq']}"
                )
            if after["prev_hash"] != before["entry_hash"]:
                raise StoreError(
                    f"ledger entry seq {after['seq']} does not link to seq "
                    f"{before['seq']}"
                )
        _count("head seq", head.seq)
        head_hash = _sha_hex("head head_hash", head.head_hash)
        head_sig = _opt_signature("head signature", head.signature)
        pem = _opt_text("head public_key_pem", head.public_key_pem)
        key_id = _opt_text("head key_id", head.key_id)
        if key_id is not None:
            _text("head key_id", key_id, _SHA256_HEX_LEN)
        if rows and (
            head.seq != rows[-1]["seq"] or head_hash != rows[-1]["entry_hash"]
        ):
            raise StoreError("ledger head must name the last appended entry")
        now = _now()
        with self._write() as session:
            # Row lock on PostgreSQL (BEGIN IMMEDIATE on SQLite): appends to one
            # run's ledger are serialised, so two writers cannot both extend it.
            self._require_run(session, run_id, lock=True)
            last = session.scalar(
                select(LedgerEntry)
                .where(LedgerEntry.run_id == run_id)
                .order_by(LedgerEntry.seq.desc())
                .limit(1)
            )
            last_seq = 0 if last is None else last.seq
            if rows:
                if rows[0]["seq"] != last_seq + 1:
                    raise StoreError(
                        f"ledger of run {run_id!r} ends at seq {last_seq}; the "
                        f"next entry must be seq {last_seq + 1}, got {rows[0]['seq']}"
                    )
                if last is not None and rows[0]["prev_hash"] != last.entry_hash:
                    raise StoreError(
                        f"ledger entry seq {rows[0]['seq']} does not link to the "
                        f"stored entry seq {last_seq}"
                    )
                session.execute(
                    insert(LedgerEntry), [{**r, "created_at": now} for r in rows]
                )
            elif head.seq != last_seq or (
                last is not None and head_hash != last.entry_hash
            ):
                raise StoreError("ledger head must name the stored last entry")
            row = session.get(LedgerHead, run_id, with_for_update=True)
            if row is None:
                row = LedgerHead(run_id=run_id)
                session.add(row)
            row.seq = head.seq
            row.head_hash = head_hash
            row.signature = head_sig
            row.public_key_pem = pem
            row.key_id = key_id
            row.updated_at = now
            session.flush()
            return _ledger_head_record(row)

    def list_ledger_entries(
        self,
        run_id: str,
        *,
        round_number: int | None = None,
        client_id: str | None = None,
    ) -> list[LedgerEntryRecord]:
        """Return a run's ledger entries in chain order (ascending ``seq``),
        optionally of one round and/or client."""
        query = select(LedgerEntry).where(LedgerEntry.run_id == run_id)
        if round_number is not None:
            query = query.where(LedgerEntry.round_number == round_number)
        if client_id is not None:
            query = query.where(LedgerEntry.client_id == client_id)
        with self._read() as session:
            rows = session.scalars(query.order_by(LedgerEntry.seq))
            return [_ledger_entry_record(r) for r in rows]

    def get_ledger_head(self, run_id: str) -> LedgerHeadRecord | None:
        """Return the signed head of a run's ledger, or ``None`` if it has none."""
        with self._read() as session:
            row = session.get(LedgerHead, run_id)
            return None if row is None else _ledger_head_record(row)


__all__ = ["Store", "StoreError"]

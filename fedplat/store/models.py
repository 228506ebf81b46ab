"""SQLAlchemy 2 ORM models of the fedplat store.

The schema is owned by the Alembic migrations in :mod:`fedplat.store.migrations`;
these models must describe exactly the same tables (a test runs Alembic's
autogenerate against a migrated database and expects no difference).

JSON payloads are stored as ``Text`` rather than a native JSON type so the same
schema works on SQLite and PostgreSQL, and so the read-only monitor can decode them
without dialect-specific operators. The repository encodes and decodes them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Double,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from fedplat.store.statuses import (
    EVENT_LEVELS,
    PARTICIPATION_STATUSES,
    ROUND_STATUSES,
    RUN_STATUSES,
)

# Deterministic constraint names: Alembic can only drop or alter a constraint it
# can name, and SQLite's batch migrations need names to recreate tables.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

ID_LEN = 64
NAME_LEN = 255
STATUS_LEN = 32
KIND_LEN = 64


def _in(column: str, values: tuple[str, ...]) -> str:
    quoted = ", ".join(f"'{v}'" for v in values)
    return f"{column} IN ({quoted})"


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that is always a timezone-aware UTC ``datetime`` in Python.

    PostgreSQL stores it as ``timestamptz``. SQLite has no timestamp type and
    SQLAlchemy's SQLite ``DATETIME`` silently drops ``tzinfo``, so values are
    normalised to UTC before binding and tagged as UTC when read back; otherwise a
    value written with an offset would be read back shifted.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(
        self, value: datetime | None, dialect: Dialect
    ) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("timestamps must be timezone-aware")
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(
        self, value: datetime | None, dialect: Dialect
    ) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    """Declarative base holding the shared metadata and naming convention."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UTCDateTime(),
        float: Double(),
        str: String(NAME_LEN),
    }


class Run(Base):
    """One federated training run (an experiment or a deployment)."""

    __tablename__ = "runs"
    __table_args__ = (
        CheckConstraint(_in("status", RUN_STATUSES), name="status"),
        CheckConstraint("total_rounds >= 0", name="total_rounds_nonneg"),
        CheckConstraint("current_round >= 0", name="current_round_nonneg"),
        # list_runs orders newest first.
        Index("ix_runs_created_at", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LEN), unique=True)
    status: Mapped[str] = mapped_column(String(STATUS_LEN))
    config_json: Mapped[str] = mapped_column(Text)
    layout_json: Mapped[str] = mapped_column(Text)
    total_rounds: Mapped[int] = mapped_column(Integer)
    current_round: Mapped[int] = mapped_column(Integer)
    best_accuracy: Mapped[float | None]
    created_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    # Liveness of the coordinator serving the run: a "running" run whose
    # heartbeat is stale was interrupted (the coordinator died).
    heartbeat_at: Mapped[datetime | None]
    # What the round driver is doing ("waiting_for_clients", "training", ...)
    # and how many clients it sees live, for the monitor.
    phase: Mapped[str | None] = mapped_column(String(STATUS_LEN))
    live_clients: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str | None] = mapped_column(Text)


class Client(Base):
    """A client enrolled in a run.

    ``status`` deliberately has no CHECK constraint: client life-cycle states are
    the vocabulary most likely to grow, and it is validated by the repository.
    """

    __tablename__ = "clients"
    __table_args__ = (
        CheckConstraint("num_examples >= 0", name="num_examples_nonneg"),
        # One identity per key and per certificate within a run.
        UniqueConstraint("run_id", "public_key"),
        UniqueConstraint("run_id", "cert_fingerprint"),
    )

    run_id: Mapped[str] = mapped_column(
        String(ID_LEN), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LEN))
    status: Mapped[str] = mapped_column(String(STATUS_LEN))
    enrolled_at: Mapped[datetime]
    last_seen: Mapped[datetime | None]
    num_examples: Mapped[int] = mapped_column(Integer)
    info_json: Mapped[str] = mapped_column(Text)
    # Hex of the raw Ed25519 public key registered at enrolment.
    public_key: Mapped[str | None] = mapped_column(String(64))
    # SHA-256 of the client certificate (admission "mtls").
    cert_fingerprint: Mapped[str | None] = mapped_column(String(64))
    # Aggregation-weight cap set by the operator (from the enrolment token).
    max_examples: Mapped[int | None] = mapped_column(Integer)
    token_id: Mapped[str | None] = mapped_column(String(ID_LEN))
    revoked_at: Mapped[datetime | None]


class EnrolmentToken(Base):
    """A single-use enrolment token (admission "tokens"); only its hash is kept."""

    __tablename__ = "enrolment_tokens"
    __table_args__ = (
        CheckConstraint(
            "max_examples IS NULL OR max_examples >= 1", name="max_examples_pos"
        ),
    )

    id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    run_name: Mapped[str | None] = mapped_column(String(NAME_LEN))
    note: Mapped[str | None] = mapped_column(String(NAME_LEN))
    max_examples: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    used_at: Mapped[datetime | None]
    used_run_id: Mapped[str | None] = mapped_column(String(ID_LEN))
    used_client_id: Mapped[str | None] = mapped_column(String(ID_LEN))
    revoked_at: Mapped[datetime | None]


class OperatorRevocation(Base):
    """An operator certificate the control API no longer accepts (by its
    SHA-256 fingerprint; certificates are issued offline, so revocation is the
    store's, checked on every call)."""

    __tablename__ = "operator_revocations"

    fingerprint: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LEN))
    revoked_by: Mapped[str] = mapped_column(String(NAME_LEN))
    revoked_at: Mapped[datetime]


class Round(Base):
    """One round of a run; ``number`` starts at 1."""

    __tablename__ = "rounds"
    __table_args__ = (
        # The unique constraint's index also serves "rounds of a run, in order".
        UniqueConstraint("run_id", "number"),
        CheckConstraint(_in("status", ROUND_STATUSES), name="status"),
        CheckConstraint("number >= 1", name="number_positive"),
        CheckConstraint(
            "num_selected >= 0 AND num_succeeded >= 0 AND num_failed >= 0"
            " AND bytes_up >= 0 AND bytes_down >= 0",
            name="counts_nonneg",
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(
        String(ID_LEN), ForeignKey("runs.id", ondelete="CASCADE")
    )
    number: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(STATUS_LEN))
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    deadline_at: Mapped[datetime | None]
    num_selected: Mapped[int] = mapped_column(Integer)
    num_succeeded: Mapped[int] = mapped_column(Integer)
    num_failed: Mapped[int] = mapped_column(Integer)
    accuracy: Mapped[float | None]
    loss: Mapped[float | None]
    model_version: Mapped[int] = mapped_column(Integer)
    checkpoint_path: Mapped[str | None] = mapped_column(Text)
    checkpoint_sha256: Mapped[str | None] = mapped_column(String(64))
    # 64-bit: a round of many clients moving large models passes 2 GiB quickly.
    bytes_up: Mapped[int] = mapped_column(BigInteger)
    bytes_down: Mapped[int] = mapped_column(BigInteger)
    reason: Mapped[str | None] = mapped_column(Text)
    # Updates that entered the aggregation (== succeeded participations).
    num_aggregated: Mapped[int] = mapped_column(Integer, server_default="0")


class Participation(Base):
    """What one client did in one round (selection, transfer, aggregator verdict)."""

    __tablename__ = "participations"
    __table_args__ = (
        # Serves "participations of a round" (the monitor's round view) too.
        UniqueConstraint("run_id", "round_number", "client_id"),
        # Participations belong to a round and to an enrolled client of that run.
        ForeignKeyConstraint(
            ["run_id", "round_number"],
            ["rounds.run_id", "rounds.number"],
            ondelete="CASCADE",
        ),
        ForeignKeyConstraint(
            ["run_id", "client_id"],
            ["clients.run_id", "clients.id"],
            ondelete="CASCADE",
        ),
        CheckConstraint(_in("status", PARTICIPATION_STATUSES), name="status"),
        CheckConstraint(
            "bytes_up >= 0 AND bytes_down >= 0 AND num_examples >= 0",
            name="counts_nonneg",
        ),
        # The monitor's client view: one client's history across rounds.
        Index("ix_participations_run_id_client_id", "run_id", "client_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(ID_LEN))
    round_number: Mapped[int] = mapped_column(Integer)
    client_id: Mapped[str] = mapped_column(String(ID_LEN))
    status: Mapped[str] = mapped_column(String(STATUS_LEN))
    # 64-bit: a round of many clients moving large models passes 2 GiB quickly.
    bytes_up: Mapped[int] = mapped_column(BigInteger)
    bytes_down: Mapped[int] = mapped_column(BigInteger)
    num_examples: Mapped[int] = mapped_column(Integer)
    duration_s: Mapped[float | None]
    train_loss: Mapped[float | None]
    # The aggregator's verdict (fedplat.aggregators.ClientDecision): effective
    # weight, whether the row contributed, its score and flags (a JSON list).
    weight: Mapped[float | None]
    selected: Mapped[bool | None]
    score: Mapped[float | None]
    flags: Mapped[str] = mapped_column(Text, server_default="[]")
    reason: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime]


class Contribution(Base):
    """A client's contribution scores and flags in one round (written at close)."""

    __tablename__ = "contributions"
    __table_args__ = (
        UniqueConstraint("run_id", "round_number", "client_id"),
        ForeignKeyConstraint(
            ["run_id", "round_number"],
            ["rounds.run_id", "rounds.number"],
            ondelete="CASCADE",
        ),
        ForeignKeyConstraint(
            ["run_id", "client_id"],
            ["clients.run_id", "clients.id"],
            ondelete="CASCADE",
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(ID_LEN))
    round_number: Mapped[int] = mapped_column(Integer)
    client_id: Mapped[str] = mapped_column(String(ID_LEN))
    # The primary scorer's value, and every scorer's (a JSON object of numbers).
    score: Mapped[float | None]
    scores_json: Mapped[str] = mapped_column(Text)
    suspect: Mapped[bool]
    # Contribution labels (free-rider, outlier, ...): a JSON list of strings.
    flags: Mapped[str] = mapped_column(Text)


class Metric(Base):
    """A named scalar, optionally tied to a round and/or a client."""

    __tablename__ = "metrics"
    __table_args__ = (Index("ix_metrics_run_id_name", "run_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(
        String(ID_LEN), ForeignKey("runs.id", ondelete="CASCADE")
    )
    round_number: Mapped[int | None] = mapped_column(Integer)
    client_id: Mapped[str | None] = mapped_column(String(ID_LEN))
    name: Mapped[str] = mapped_column(String(NAME_LEN))
    value: Mapped[float]
    created_at: Mapped[datetime]


class Event(Base):
    """An audit/log event; ``run_id`` is NULL for coordinator-wide events."""

    __tablename__ = "events"
    __table_args__ = (
        CheckConstraint(_in("level", EVENT_LEVELS), name="level"),
        Index("ix_events_run_id_kind", "run_id", "kind"),
        # A run's log in id order (the control API's StreamLog).
        Index("ix_events_run_id_id", "run_id", "id"),
        # list_events pages newest first, optionally over all runs.
        Index("ix_events_created_at", "created_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str | None] = mapped_column(
        String(ID_LEN), ForeignKey("runs.id", ondelete="CASCADE")
    )
    round_number: Mapped[int | None] = mapped_column(Integer)
    client_id: Mapped[str | None] = mapped_column(String(ID_LEN))
    kind: Mapped[str] = mapped_column(String(KIND_LEN))
    level: Mapped[str] = mapped_column(String(STATUS_LEN))
    message: Mapped[str] = mapped_column(Text)
    details_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]


class LedgerEntry(Base):
    """One entry of a run's contribution ledger (append-only, hash-chained).

    ``payload_json`` is the canonical JSON the entry's hash is computed over; it
    repeats ``seq``, ``round_number``, ``client_id`` and ``prev_hash``, which are
    copied into columns only for querying. The chain rules live in
    :mod:`fedplat.contribution.ledger`; the store only keeps the rows in order.
    """

    __tablename__ = "ledger_entries"
    __table_args__ = (
        # The chain order; its index also serves "entries of a run, in order".
        UniqueConstraint("run_id", "seq"),
        CheckConstraint("seq >= 1", name="seq_positive"),
        # The monitor's client view: one client's ledger across rounds.
        Index("ix_ledger_entries_run_id_client_id", "run_id", "client_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(
        String(ID_LEN), ForeignKey("runs.id", ondelete="CASCADE")
    )
    seq: Mapped[int] = mapped_column(Integer)
    round_number: Mapped[int] = mapped_column(Integer)
    client_id: Mapped[str] = mapped_column(String(ID_LEN))
    payload_json: Mapped[str] = mapped_column(Text)
    prev_hash: Mapped[str] = mapped_column(String(64))
    entry_hash: Mapped[str] = mapped_column(String(64))
    # Ed25519 signature of the entry hash (hex); NULL when the run has no key.
    signature: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime]


class LedgerHead(Base):
    """The signed head of a run's ledger: last ``seq``, its hash, the public key."""

    __tablename__ = "ledger_heads"
    __table_args__ = (CheckConstraint("seq >= 0", name="seq_nonneg"),)

    run_id: Mapped[str] = mapped_column(
        String(ID_LEN), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer)
    head_hash: Mapped[str] = mapped_column(String(64))
    signature: Mapped[str | None] = mapped_column(String(128))
    public_key_pem: Mapped[str | None] = mapped_column(Text)
    key_id: Mapped[str | None] = mapped_column(String(64))
    updated_at: Mapped[datetime]


__all__ = [
    "NAMING_CONVENTION",
    "Base",
    "Client",
    "Contribution",
    "EnrolmentToken",
    "Event",
    "LedgerEntry",
    "LedgerHead",
    "Metric",
    "Participation",
    "Round",
    "Run",
    "UTCDateTime",
]

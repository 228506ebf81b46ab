"""Initial schema: runs, clients, rounds, participations, metrics, events.

Revision ID: 0001
Revises:
Create Date: 2026-01-01 00:00:00

Written to match :mod:`fedplat.store.models` exactly (tests compare them with
Alembic's autogenerate). Vocabularies are spelled out here rather than imported:
a migration describes the schema as it was at this revision and must not change
when the application's constants do.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUN_STATUSES = ("pending", "running", "completed", "failed")
ROUND_STATUSES = ("open", "completed", "failed")
PARTICIPATION_STATUSES = (
    "selected",
    "downloaded",
    "succeeded",
    "rejected",
    "dropped",
    "late",
    "failed",
)
EVENT_LEVELS = ("info", "warning", "error")


def _in(column: str, values: tuple[str, ...]) -> str:
    quoted = ", ".join(f"'{v}'" for v in values)
    return f"{column} IN ({quoted})"


def _id(name: str, *, nullable: bool = False) -> sa.Column[str]:
    return sa.Column(name, sa.String(length=64), nullable=nullable)


def _ts(name: str, *, nullable: bool) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    """Create all tables and indexes."""
    op.create_table(
        "runs",
        _id("id"),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("config_json", sa.Text(), nullable=False),
        sa.Column("layout_json", sa.Text(), nullable=False),
        sa.Column("total_rounds", sa.Integer(), nullable=False),
        sa.Column("current_round", sa.Integer(), nullable=False),
        sa.Column("best_accuracy", sa.Double(), nullable=True),
        _ts("created_at", nullable=False),
        _ts("started_at", nullable=True),
        _ts("finished_at", nullable=True),
        sa.CheckConstraint(_in("status", RUN_STATUSES), name=op.f("ck_runs_status")),
        sa.CheckConstraint(
            "total_rounds >= 0", name=op.f("ck_runs_total_rounds_nonneg")
        ),
        sa.CheckConstraint(
            "current_round >= 0", name=op.f("ck_runs_current_round_nonneg")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
        sa.UniqueConstraint("name", name=op.f("uq_runs_name")),
    )
    op.create_index("ix_runs_created_at", "runs", ["created_at"])

    op.create_table(
        "clients",
        _id("run_id"),
        _id("id"),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        _ts("enrolled_at", nullable=False),
        _ts("last_seen", nullable=True),
        sa.Column("num_examples", sa.Integer(), nullable=False),
        sa.Column("info_json", sa.Text(), nullable=False),
        sa.CheckConstraint(
            "num_examples >= 0", name=op.f("ck_clients_num_examples_nonneg")
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.id"],
            name=op.f("fk_clients_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", "id", name=op.f("pk_clients")),
    )

    op.create_table(
        "rounds",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        _id("run_id"),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        _ts("started_at", nullable=False),
        _ts("finished_at", nullable=True),
        _ts("deadline_at", nullable=True),
        sa.Column("num_selected", sa.Integer(), nullable=False),
        sa.Column("num_succeeded", sa.Integer(), nullable=False),
        sa.Column("num_failed", sa.Integer(), nullable=False),
        sa.Column("accuracy", sa.Double(), nullable=True),
        sa.Column("loss", sa.Double(), nullable=True),
        sa.Column("model_version", sa.Integer(), nullable=False),
        sa.Column("checkpoint_path", sa.Text(), nullable=True),
        sa.Column("checkpoint_sha256", sa.String(length=64), nullable=True),
        sa.Column("bytes_up", sa.BigInteger(), nullable=False),
        sa.Column("bytes_down", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.CheckConstraint(
            _in("status", ROUND_STATUSES), name=op.f("ck_rounds_status")
        ),
        sa.CheckConstraint(
            "num_selected >= 0 AND num_succeeded >= 0 AND num_failed >= 0"
            " AND bytes_up >= 0 AND bytes_down >= 0",
            name=op.f("ck_rounds_counts_nonneg"),
        ),
        sa.CheckConstraint("number >= 1", name=op.f("ck_rounds_number_positive")),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.id"],
            name=op.f("fk_rounds_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rounds")),
        sa.UniqueConstraint("run_id", "number", name=op.f("uq_rounds_run_id_number")),
    )

    op.create_table(
        "participations",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        _id("run_id"),
        sa.Column("round_number", sa.Integer(), nullable=False),
        _id("client_id"),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("bytes_up", sa.BigInteger(), nullable=False),
        sa.Column("bytes_down", sa.BigInteger(), nullable=False),
        sa.Column("num_examples", sa.Integer(), nullable=False),
        sa.Column("duration_s", sa.Double(), nullable=True),
        sa.Column("train_loss", sa.Double(), nullable=True),
        sa.Column("weight", sa.Double(), nullable=True),
        sa.Column("flags_json", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        _ts("updated_at", nullable=False),
        sa.CheckConstraint(
            _in("status", PARTICIPATION_STATUSES),
            name=op.f("ck_participations_status"),
        ),
        sa.CheckConstraint(
            "bytes_up >= 0 AND bytes_down >= 0 AND num_examples >= 0",
            name=op.f("ck_participations_counts_nonneg"),
        ),
        sa.ForeignKeyConstraint(
            ["run_id", "client_id"],
            ["clients.run_id", "clients.id"],
            name=op.f("fk_participations_run_id_client_id_clients"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["run_id", "round_number"],
            ["rounds.run_id", "rounds.number"],
            name=op.f("fk_participations_run_id_round_number_rounds"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_participations")),
        sa.UniqueConstraint(
            "run_id",
            "round_number",
            "client_id",
            name=op.f("uq_participations_run_id_round_number_client_id"),
        ),
    )
    op.create_index(
        "ix_participations_run_id_client_id",
        "participations",
        ["run_id", "client_id"],
    )

    op.create_table(
        "metrics",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        _id("run_id"),
        sa.Column("round_number", sa.Integer(), nullable=True),
        _id("client_id", nullable=True),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("value", sa.Double(), nullable=False),
        _ts("created_at", nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.id"],
            name=op.f("fk_metrics_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_metrics")),
    )
    op.create_index("ix_metrics_run_id_name", "metrics", ["run_id", "name"])

    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        _id("run_id", nullable=True),
        sa.Column("round_number", sa.Integer(), nullable=True),
        _id("client_id", nullable=True),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("level", sa.String(length=32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("details_json", sa.Text(), nullable=False),
        _ts("created_at", nullable=False),
        sa.CheckConstraint(_in("level", EVENT_LEVELS), name=op.f("ck_events_level")),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.id"],
            name=op.f("fk_events_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    op.create_index("ix_events_run_id_kind", "events", ["run_id", "kind"])
    op.create_index("ix_events_created_at", "events", ["created_at"])


def downgrade() -> None:
    """Drop everything, children before parents."""
    op.drop_index("ix_events_created_at", table_name="events")
    op.drop_index("ix_events_run_id_kind", table_name="events")
    op.drop_table("events")
    op.drop_index("ix_metrics_run_id_name", table_name="metrics")
    op.drop_table("metrics")
    op.drop_index("ix_participations_run_id_client_id", table_name="participations")
    op.drop_table("participations")
    op.drop_table("rounds")
    op.drop_table("clients")
    op.drop_index("ix_runs_created_at", table_name="runs")
    op.drop_table("runs")

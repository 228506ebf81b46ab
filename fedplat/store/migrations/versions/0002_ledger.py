"""Contribution ledger: hash-chained entries and the signed chain head per run.

Revision ID: 0002
Revises: 0001
Create Date: 2026-01-02 00:00:00

Written to match :class:`fedplat.store.models.LedgerEntry` and
:class:`fedplat.store.models.LedgerHead` exactly (tests compare them with Alembic's
autogenerate). Only adds tables: nothing of revision 0001 changes.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``ledger_entries`` and ``ledger_heads``."""
    op.create_table(
        "ledger_entries",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("round_number", sa.Integer(), nullable=False),
        sa.Column("client_id", sa.String(length=64), nullable=False),
        sa.Column("payload_json", sa.Text(), nullable=False),
        sa.Column("prev_hash", sa.String(length=64), nullable=False),
        sa.Column("entry_hash", sa.String(length=64), nullable=False),
        sa.Column("signature", sa.String(length=128), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("seq >= 1", name=op.f("ck_ledger_entries_seq_positive")),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.id"],
            name=op.f("fk_ledger_entries_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ledger_entries")),
        sa.UniqueConstraint("run_id", "seq", name=op.f("uq_ledger_entries_run_id_seq")),
    )
    op.create_index(
        "ix_ledger_entries_run_id_client_id",
        "ledger_entries",
        ["run_id", "client_id"],
    )

    op.create_table(
        "ledger_heads",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("head_hash", sa.String(length=64), nullable=False),
        sa.Column("signature", sa.String(length=128), nullable=True),
        sa.Column("public_key_pem", sa.Text(), nullable=True),
        sa.Column("key_id", sa.String(length=64), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("seq >= 0", name=op.f("ck_ledger_heads_seq_nonneg")),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.id"],
            name=op.f("fk_ledger_heads_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_ledger_heads")),
    )


def downgrade() -> None:
    """Drop the ledger tables (revision 0001's tables are untouched)."""
    op.drop_table("ledger_heads")
    op.drop_index("ix_ledger_entries_run_id_client_id", table_name="ledger_entries")
    op.drop_table("ledger_entries")

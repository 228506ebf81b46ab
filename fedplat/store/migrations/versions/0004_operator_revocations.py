"""Operator revocations of the control API.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-28 00:00:00

Written to match :class:`fedplat.store.models.OperatorRevocation` exactly (tests
compare them with Alembic's autogenerate). Only adds a table.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``operator_revocations``."""
    op.create_table(
        "operator_revocations",
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("revoked_by", sa.String(length=255), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("fingerprint", name=op.f("pk_operator_revocations")),
    )


def downgrade() -> None:
    """Drop ``operator_revocations``."""
    op.drop_table("operator_revocations")

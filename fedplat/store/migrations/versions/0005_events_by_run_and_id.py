"""An index of a run's events by id, for reading a run's log in order.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-28 06:00:00

The control API's ``StreamLog`` pages through a run's events by id (and finds
where its tail starts by id); without this index every page sorts the run's
events. Written to match :class:`fedplat.store.models.Event` exactly (tests
compare them with Alembic's autogenerate). Only adds an index.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``ix_events_run_id_id``."""
    op.create_index("ix_events_run_id_id", "events", ["run_id", "id"], unique=False)


def downgrade() -> None:
    """Drop ``ix_events_run_id_id``."""
    op.drop_index("ix_events_run_id_id", table_name="events")

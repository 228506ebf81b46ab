"""Persistence of fedplat: runs, clients, rounds, participations, metrics, events
and the contribution ledger.

SQLite by default (a plain path), PostgreSQL (or any SQLAlchemy database) by URL.
The coordinator writes through :class:`Store`; the monitor opens the same database
with ``Store(url, migrate=False)`` and only reads. The schema is versioned with
Alembic (:func:`migrate`).
"""

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
from fedplat.store.repository import Store, StoreError
from fedplat.store.schema import current_revision, downgrade, head_revision, migrate
from fedplat.store.statuses import (
    CLIENT_STATUSES,
    EVENT_LEVELS,
    PARTICIPATION_STATUSES,
    ROUND_STATUSES,
    RUN_STATUSES,
    ClientStatus,
    EventLevel,
    ParticipationStatus,
    RoundStatus,
    RunStatus,
)

__all__ = [
    "CLIENT_STATUSES",
    "EVENT_LEVELS",
    "PARTICIPATION_STATUSES",
    "ROUND_STATUSES",
    "RUN_STATUSES",
    "ClientRecord",
    "ClientStatus",
    "EventLevel",
    "EventRecord",
    "LedgerEntryLike",
    "LedgerEntryRecord",
    "LedgerHeadLike",
    "LedgerHeadRecord",
    "MetricRecord",
    "ParticipationRecord",
    "ParticipationStatus",
    "RoundRecord",
    "RoundStatus",
    "RunRecord",
    "RunStatus",
    "Store",
    "StoreError",
    "current_revision",
    "downgrade",
    "head_revision",
    "migrate",
]

"""Persistence of fedplat: runs, clients, rounds, participations, metrics, events
and the contribution ledger.

SQLite by default (a plain path), PostgreSQL (or any SQLAlchemy database) by URL.
The coordinator writes through :class:`Store`; the monitor opens the same database
with ``Store(url, migrate=False)`` and only reads. The schema is versioned with
Alembic (:func:`migrate`).
"""

from fedplat.store.events import event_problem, metrics_problem
from fedplat.store.records import (
    ClientRecord,
    ContributionRecord,
    ContributionRow,
    EnrolmentTokenRecord,
    EventRecord,
    EventRow,
    LedgerEntryLike,
    LedgerEntryRecord,
    LedgerHeadLike,
    LedgerHeadRecord,
    MetricRecord,
    ParticipationRecord,
    ParticipationRow,
    RoundClose,
    RoundRecord,
    RunRecord,
    Verdict,
)
from fedplat.store.repository import Store, StoreError
from fedplat.store.rounds import participation_problem
from fedplat.store.runs import HEARTBEAT_SECONDS
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
    "HEARTBEAT_SECONDS",
    "PARTICIPATION_STATUSES",
    "ROUND_STATUSES",
    "RUN_STATUSES",
    "ClientRecord",
    "ClientStatus",
    "ContributionRecord",
    "ContributionRow",
    "EnrolmentTokenRecord",
    "EventLevel",
    "EventRecord",
    "EventRow",
    "LedgerEntryLike",
    "LedgerEntryRecord",
    "LedgerHeadLike",
    "LedgerHeadRecord",
    "MetricRecord",
    "ParticipationRecord",
    "ParticipationRow",
    "ParticipationStatus",
    "RoundClose",
    "RoundRecord",
    "RoundStatus",
    "RunRecord",
    "RunStatus",
    "Store",
    "StoreError",
    "Verdict",
    "current_revision",
    "downgrade",
    "event_problem",
    "head_revision",
    "metrics_problem",
    "migrate",
    "participation_problem",
]

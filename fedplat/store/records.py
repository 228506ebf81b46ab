"""Immutable results returned by :class:`fedplat.store.Store`.

They are plain frozen dataclasses detached from any database session, so they can
be passed between threads, cached by the monitor and compared in tests. JSON
columns arrive decoded (``config``, ``layout``, ``info``, ``flags``, ``details``);
each call returns fresh dictionaries, so mutating one never affects another.

The input shapes of a round's closing write (:class:`RoundClose` with its
:class:`ParticipationRow`, :class:`ContributionRow` and :class:`EventRow`) live
here too: a round is written once, in one transaction, and never rewritten.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from fedplat.ledger_record import LedgerEntryLike, LedgerHeadLike


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A run. ``current_round`` is the last *completed* round (0 before any)."""

    id: str
    name: str
    status: str
    config: dict[str, Any]
    layout: dict[str, Any]
    total_rounds: int
    current_round: int
    best_accuracy: float | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None = None
    phase: str | None = None
    live_clients: int | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class ClientRecord:
    """A client enrolled in a run; ``id`` is unique within the run."""

    run_id: str
    id: str
    name: str
    status: str
    enrolled_at: datetime
    last_seen: datetime | None
    num_examples: int
    info: dict[str, Any]
    public_key: str | None = None
    cert_fingerprint: str | None = None
    max_examples: int | None = None
    token_id: str | None = None
    revoked_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """A round; counts and byte totals are final once ``status`` is not open."""

    id: int
    run_id: str
    number: int
    status: str
    started_at: datetime
    finished_at: datetime | None
    deadline_at: datetime | None
    num_selected: int
    num_succeeded: int
    num_failed: int
    accuracy: float | None
    loss: float | None
    model_version: int
    checkpoint_path: str | None
    checkpoint_sha256: str | None
    bytes_up: int
    bytes_down: int
    reason: str | None
    num_aggregated: int = 0


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the aggregation rule did with one client's update.

    The one shape of a per-client outcome from the rule
    (:class:`fedplat.aggregators.ClientDecision`) to the monitor: ``weight`` is the
    row's effective weight in the aggregate (0 when excluded), ``selected``
    whether it contributed at all, ``score`` a rule-specific number, ``flags``
    short labels (``"excluded"``, ``"clipped"``, ``"dp-clipped"``, ...).
    """

    weight: float | None = None
    selected: bool | None = None
    score: float | None = None
    flags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ParticipationRecord:
    """One client's part in one round, including the aggregator's verdict."""

    id: int
    run_id: str
    round_number: int
    client_id: str
    status: str
    bytes_up: int
    bytes_down: int
    num_examples: int
    duration_s: float | None
    train_loss: float | None
    verdict: Verdict
    reason: str | None
    updated_at: datetime

    @property
    def weight(self) -> float | None:
        return self.verdict.weight


@dataclass(frozen=True, slots=True)
class ContributionRecord:
    """A client's contribution scores and flags in one round."""

    run_id: str
    round_number: int
    client_id: str
    score: float | None
    scores: dict[str, float]
    suspect: bool
    flags: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class EnrolmentTokenRecord:
    """An enrolment token as stored (its secret is never stored, only a hash)."""

    id: str
    run_name: str | None
    note: str | None
    max_examples: int | None
    created_at: datetime
    expires_at: datetime
    used_at: datetime | None
    used_run_id: str | None
    used_client_id: str | None
    revoked_at: datetime | None

    def state(self, now: datetime) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.used_at is not None:
            return "used"
        return "expired" if self.expires_at <= now else "valid"


@dataclass(frozen=True, slots=True)
class MetricRecord:
    """A named scalar, optionally tied to a round and/or a client."""

    id: int
    run_id: str
    round_number: int | None
    client_id: str | None
    name: str
    value: float
    created_at: datetime


@dataclass(frozen=True, slots=True)
class EventRecord:
    """An audit/log event; ``run_id`` is ``None`` for coordinator-wide events."""

    id: int
    run_id: str | None
    round_number: int | None
    client_id: str | None
    kind: str
    level: str
    message: str
    details: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class LedgerEntryRecord:
    """One stored entry of a run's contribution ledger, as written.

    ``payload_json`` is returned byte for byte as stored (not decoded): the
    entry's hash is computed over exactly this text.
    """

    id: int
    run_id: str
    seq: int
    round_number: int
    client_id: str
    payload_json: str
    prev_hash: str
    entry_hash: str
    signature: str | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class LedgerHeadRecord:
    """The stored, signed head of a run's ledger (``seq`` 0: empty ledger)."""

    run_id: str
    seq: int
    head_hash: str
    signature: str | None
    public_key_pem: str | None
    key_id: str | None
    updated_at: datetime


# ----------------------------------------------------------------- write shapes


@dataclass(frozen=True, slots=True)
class ParticipationRow:
    """One selected client's part in a closing round."""

    client_id: str
    status: str
    bytes_up: int = 0
    bytes_down: int = 0
    num_examples: int = 0
    duration_s: float | None = None
    train_loss: float | None = None
    verdict: Verdict = field(default_factory=Verdict)
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class ContributionRow:
    client_id: str
    score: float | None
    scores: dict[str, float]
    suspect: bool
    flags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class EventRow:
    kind: str
    message: str
    level: str = "info"
    round_number: int | None = None
    client_id: str | None = None
    details: dict[str, Any] | None = None


@dataclass(frozen=True)
class RoundClose:
    """Everything a round writes when it closes, in one transaction.

    ``run_status`` (``"completed"`` or ``"failed"``) also finishes the run;
    ``ledger`` appends contribution ledger entries with the new signed head.
    """

    status: Literal["completed", "failed"]
    participations: tuple[ParticipationRow, ...]
    accuracy: float | None = None
    loss: float | None = None
    checkpoint_path: str | None = None
    checkpoint_sha256: str | None = None
    reason: str | None = None
    metrics: dict[str, float] | None = None
    client_metrics: dict[str, dict[str, float]] | None = None
    contributions: tuple[ContributionRow, ...] = ()
    events: tuple[EventRow, ...] = ()
    ledger: tuple[tuple[LedgerEntryLike, ...], LedgerHeadLike] | None = None
    run_status: Literal["completed", "failed"] | None = None


__all__ = [
    "ClientRecord",
    "ContributionRecord",
    "ContributionRow",
    "EnrolmentTokenRecord",
    "EventRecord",
    "EventRow",
    "LedgerEntryLike",
    "LedgerEntryRecord",
    "LedgerHeadLike",
    "LedgerHeadRecord",
    "MetricRecord",
    "ParticipationRecord",
    "ParticipationRow",
    "RoundClose",
    "RoundRecord",
    "RunRecord",
    "Verdict",
]

"""Immutable results returned by :class:`fedplat.store.Store`.

They are plain frozen dataclasses detached from any database session, so they can
be passed between threads, cached by the monitor and compared in tests. JSON
columns arrive decoded (``config``, ``layout``, ``info``, ``flags``, ``details``);
each call returns fresh dictionaries, so mutating one never affects another.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol


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
    weight: float | None
    flags: dict[str, Any]
    reason: str | None
    updated_at: datetime


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


class LedgerEntryLike(Protocol):
    """What :meth:`fedplat.store.Store.append_ledger` needs of a new entry."""

    @property
    def seq(self) -> int: ...
    @property
    def round_number(self) -> int: ...
    @property
    def client_id(self) -> str: ...
    @property
    def payload_json(self) -> str: ...
    @property
    def prev_hash(self) -> str: ...
    @property
    def entry_hash(self) -> str: ...
    @property
    def signature(self) -> str | None: ...


class LedgerHeadLike(Protocol):
    """What :meth:`fedplat.store.Store.append_ledger` needs of the new head."""

    @property
    def seq(self) -> int: ...
    @property
    def head_hash(self) -> str: ...
    @property
    def signature(self) -> str | None: ...
    @property
    def public_key_pem(self) -> str | None: ...
    @property
    def key_id(self) -> str | None: ...


__all__ = [
    "ClientRecord",
    "EventRecord",
    "LedgerEntryLike",
    "LedgerEntryRecord",
    "LedgerHeadLike",
    "LedgerHeadRecord",
    "MetricRecord",
    "ParticipationRecord",
    "RoundRecord",
    "RunRecord",
]

"""ORM rows to the frozen records of :mod:`fedplat.store.records`."""

from __future__ import annotations

import json

from fedplat.store.models import (
    Client,
    Contribution,
    EnrolmentToken,
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
    ContributionRecord,
    EnrolmentTokenRecord,
    EventRecord,
    LedgerEntryRecord,
    LedgerHeadRecord,
    MetricRecord,
    ParticipationRecord,
    RoundRecord,
    RunRecord,
    Verdict,
)
from fedplat.store.validate import _decode

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
        heartbeat_at=row.heartbeat_at,
        phase=row.phase,
        live_clients=row.live_clients,
        reason=row.reason,
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
        public_key=row.public_key,
        cert_fingerprint=row.cert_fingerprint,
        max_examples=row.max_examples,
        token_id=row.token_id,
        revoked_at=row.revoked_at,
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
        num_aggregated=row.num_aggregated,
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
        verdict=Verdict(
            weight=row.weight,
            selected=row.selected,
            score=row.score,
            flags=tuple(json.loads(row.flags)),
        ),
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


def _contribution_record(row: Contribution) -> ContributionRecord:
    return ContributionRecord(
        run_id=row.run_id,
        round_number=row.round_number,
        client_id=row.client_id,
        score=row.score,
        scores=_decode(row.scores_json),
        suspect=bool(row.suspect),
        flags=tuple(json.loads(row.flags)),
    )


def _token_record(row: EnrolmentToken) -> EnrolmentTokenRecord:
    return EnrolmentTokenRecord(
        id=row.id,
        run_name=row.run_name,
        note=row.note,
        max_examples=row.max_examples,
        created_at=row.created_at,
        expires_at=row.expires_at,
        used_at=row.used_at,
        used_run_id=row.used_run_id,
        used_client_id=row.used_client_id,
        revoked_at=row.revoked_at,
    )

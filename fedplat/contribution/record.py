"""A round's ledger record: entries chained after the stored tail, a signed head,
and the round's cost metrics. Nothing is written here (the coordinator stores the
record with the round, in one transaction)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedplat.aggregators.base import ClientDecision
from fedplat.contribution.ledger import GENESIS_HASH, chain_entries, sign_head
from fedplat.contribution.results import ClientContribution, PendingRecord


@dataclass(frozen=True)
class LedgerTail:
    """Where the stored chain ends: the next entry is ``seq + 1``, linking to
    ``head_hash`` (:data:`~fedplat.contribution.ledger.GENESIS_HASH` when empty)."""

    seq: int = 0
    head_hash: str = GENESIS_HASH


@dataclass(frozen=True)
class RoundCostFacts:
    """The facts the round's metrics report."""

    evaluations: int
    seconds: float
    permutations: int
    truncated: bool
    utility_before: float | None
    utility_after: float | None


def round_metrics(
    facts: RoundCostFacts, clients: Sequence[ClientContribution]
) -> dict[str, float]:
    """``contribution.*`` round metrics (utilities only when both are known)."""
    metrics = {
        "contribution.utility_evaluations": float(facts.evaluations),
        "contribution.seconds": facts.seconds,
        "contribution.permutations": float(facts.permutations),
        "contribution.truncated": float(facts.truncated),
        "contribution.suspects": float(sum(c.suspect for c in clients)),
    }
    if facts.utility_before is not None and facts.utility_after is not None:
        metrics["contribution.utility_before"] = facts.utility_before
        metrics["contribution.utility_after"] = facts.utility_after
    return metrics


def entry_contents(
    round_number: int,
    attempt: int,
    clients: Sequence[ClientContribution],
    decisions: Sequence[ClientDecision],
) -> list[dict[str, Any]]:
    """One ledger entry's content per client: its accounting *as of* this round
    (row ``i`` of the round is ``clients[i]``; ``weight`` is the aggregator's)."""
    weight = {d.index: d.weight for d in decisions}
    return [
        {
            "round": round_number,
            "attempt": attempt,
            "client_id": c.client_id,
            "scores": c.scores,
            "credit": c.credit,
            "flags": list(c.flags),
            "suspect": c.suspect,
            "weight": weight.get(i),
            "cumulative": c.cumulative,
            "reward_share": c.reward_share,
            "reward": c.reward,
        }
        for i, c in enumerate(clients)
    ]


def pending_record(
    run_id: str,
    tail: LedgerTail,
    contents: list[dict[str, Any]],
    metrics: dict[str, float],
    signing_key: Ed25519PrivateKey | None,
) -> PendingRecord:
    """The entries chained after ``tail`` and the new head, signed with
    ``signing_key`` (unsigned when ``None``)."""
    if not contents:
        return PendingRecord((), None, metrics)
    entries = chain_entries(
        run_id,
        contents,
        start_seq=tail.seq + 1,
        prev_hash=tail.head_hash,
        signing_key=signing_key,
    )
    head = sign_head(run_id, entries[-1].seq, entries[-1].entry_hash, signing_key)
    return PendingRecord(tuple(entries), head, metrics)


__all__ = [
    "LedgerTail",
    "RoundCostFacts",
    "entry_contents",
    "pending_record",
    "round_metrics",
]

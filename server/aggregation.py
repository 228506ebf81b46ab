"""The aggregation step: the round's accepted updates -> the next global model.

A pure function of the accepted rows (or their running sum), the rule, the DP
plan and the server optimizer's state: pre-aggregators + rule (or the exact
weighted mean from a running sum) -> central DP noise -> server optimizer. It
returns the new weights, the aggregate, and one typed
:class:`~fedplat.store.Verdict` per accepted client. Central DP clipping already
happened per row at intake (:meth:`fedplat.uplink.server.UplinkPlan.clip_row`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from fedplat.aggregators import AggregationError, AggregationResult, Aggregator
from fedplat.server.accumulator import Accepted, Accumulator, RowStack, RunningSum
from fedplat.server.optimizers import ServerOptimizer

from fedplat.store import Verdict
from fedplat.uplink.server import UplinkPlan
from fedplat.vectors import all_finite


@dataclass(frozen=True)
class StepResult:
    """What one aggregation step produced."""

    weights: torch.Tensor  # [d] the new global model
    aggregate: torch.Tensor  # [d] the rule's output before noise and optimizer
    accepted: list[Accepted]  # in row (enrolment) order
    verdicts: dict[str, Verdict]
    # For contribution scoring (row mode only): the rows and their weights.
    stack: torch.Tensor | None = None
    row_weights: torch.Tensor | None = None
    result: AggregationResult | None = None


def needs_rows(aggregator: Aggregator, has_pre: bool, contribution: bool) -> bool:
    """Whether a round must keep every row (else a running sum suffices)."""
    return aggregator.name != "fedavg" or has_pre or contribution


def _from_rows(
    acc: RowStack, aggregator: Aggregator, weighted: bool, clipped: set[str]
) -> tuple[torch.Tensor, list[Accepted], dict[str, Verdict], StepResult]:
    stack, accepted = acc.take()
    weights = (
        torch.tensor([a.weight for a in accepted], dtype=torch.float64)
        if weighted
        else None
    )
    result = aggregator(stack, weights)
    verdicts = {}
    for d in result.decisions:
        cid = accepted[d.index].client_id
        flags = (*d.flags, *(("dp-clipped",) if cid in clipped else ()))
        verdicts[cid] = Verdict(d.weight, d.selected, d.score, flags)
    partial = StepResult(
        weights=stack.new_empty(0),
        aggregate=result.aggregate,
        accepted=accepted,
        verdicts=verdicts,
        stack=stack,
        row_weights=weights,
        result=result,
    )
    return result.aggregate, accepted, verdicts, partial


def _from_sum(
    acc: RunningSum, clipped: set[str]
) -> tuple[torch.Tensor, list[Accepted], dict[str, Verdict]]:
    accepted = acc.accepted()
    total = acc.total_weight
    if acc.sum is None or not accepted or total <= 0:
        raise AggregationError("no updates to aggregate")
    mean = (acc.sum / total).to(torch.float32)
    verdicts = {
        a.client_id: Verdict(
            a.weight / total,
            True,
            None,
            ("dp-clipped",) if a.client_id in clipped else (),
        )
        for a in accepted
    }
    return mean, accepted, verdicts


def aggregate_round(
    acc: Accumulator,
    *,
    aggregator: Aggregator,
    weighted: bool,
    plan: UplinkPlan,
    optimizer: ServerOptimizer,
    global_weights: torch.Tensor,
    round_number: int,
    clipped: set[str],
) -> StepResult:
    """Aggregate the round (raises :class:`AggregationError` when it cannot)."""
    partial: StepResult | None = None
    if isinstance(acc, RowStack):
        aggregate, accepted, verdicts, partial = _from_rows(
            acc, aggregator, weighted, clipped
        )
    else:
        aggregate, accepted, verdicts = _from_sum(acc, clipped)
    noised = plan.noise_mean(aggregate.to(torch.float32), len(accepted))
    new = optimizer.step(global_weights, noised, round_number)
    if not all_finite(new):
        raise AggregationError("aggregation produced non-finite weights")
    if partial is None:
        return StepResult(new, aggregate, accepted, verdicts)
    return StepResult(
        new,
        aggregate,
        accepted,
        verdicts,
        partial.stack,
        partial.row_weights,
        partial.result,
    )


__all__ = ["StepResult", "aggregate_round", "needs_rows"]

"""The aggregation step: the round's accepted updates -> the next global model.

A pure function of the accepted rows (or their running sum), the rule, the DP
plan and the server optimizer's state: pre-aggregators + rule (or the exact
mean from a running sum, de-sketched once when the sum is of sketches) -> server
optimizer. Under central DP the running sum of clipped updates (or sketches) is
released by DP-FedAvg's fixed-denominator estimator
(:meth:`fedplat.server.central_dp.CentralDP.release`): noise once on the sum,
divided by ``q N``, de-sketched after; the release is accounted when the round is
written. It returns the new weights, the aggregate, and one typed
:class:`~fedplat.store.Verdict` per accepted client (the shape the recorder
stores with the client's participation). Central DP clipping already
happened per row at intake (:meth:`fedplat.server.uplink_plan.UplinkPlan.clip_row`).

The round's bounds (:mod:`fedplat.server.bounds`) were applied by the
accumulator; here they become each client's verdict: ``"norm-bounded"`` (the
update was scaled down; with no score of the rule's own, ``score`` is the
update's norm as received) and ``"weight-capped"`` (a cap lowered its declared
example count), beside ``"dp-clipped"`` and the rule's own flags.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from fedplat.aggregators import AggregationError, AggregationResult, Aggregator
from fedplat.server.accumulator import (
    Accepted,
    Accumulator,
    MaskedSum,
    RowStack,
    RunningSum,
)
from fedplat.server.central_dp import Release
from fedplat.server.optimizers import ServerOptimizer
from fedplat.server.recorder import Verdict
from fedplat.server.uplink_plan import UplinkPlan

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
    # Central DP: the round's release, accounted when the round is written.
    release: Release | None = None


def needs_rows(aggregator: Aggregator, has_pre: bool, contribution: bool) -> bool:
    """Whether a round must keep every row (else a running sum suffices)."""
    return aggregator.name != "fedavg" or has_pre or contribution


def _flags(a: Accepted, clipped: set[str]) -> tuple[str, ...]:
    """The server's own flags on one accepted update (after the rule's)."""
    return (
        *(("dp-clipped",) if a.client_id in clipped else ()),
        *(("norm-bounded",) if a.norm_bounded else ()),
        *(("weight-capped",) if a.weight_capped else ()),
    )


def _verdict(a: Accepted, weight: float, clipped: set[str]) -> Verdict:
    """A verdict without a rule's decision (the running sum's)."""
    score = a.norm if a.bound is not None else None
    return Verdict(weight, True, score, _flags(a, clipped))


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
        a = accepted[d.index]
        score = d.score if d.score is not None or a.bound is None else a.norm
        flags = (*d.flags, *_flags(a, clipped))
        verdicts[a.client_id] = Verdict(d.weight, d.selected, score, flags)
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


def _verdicts(
    accepted: list[Accepted], weight: float, clipped: set[str]
) -> dict[str, Verdict]:
    return {a.client_id: _verdict(a, weight, clipped) for a in accepted}


def _from_sum(
    acc: RunningSum, clipped: set[str], plan: UplinkPlan, round_number: int
) -> tuple[torch.Tensor, list[Accepted], dict[str, Verdict]]:
    accepted = acc.accepted()
    total = acc.total_weight
    if acc.sum is None or not accepted or total <= 0:
        raise AggregationError("no updates to aggregate")
    # In place: the round's sum is freed when it closes, and a model-sized
    # allocation costs more here than the division.
    mean = acc.sum.div_(total).to(torch.float32)
    if acc.sketch_space:
        mean = plan.desketch(mean, round_number)
    if acc.weighted:
        verdicts = {
            a.client_id: _verdict(a, a.weight / total, clipped) for a in accepted
        }
    else:
        verdicts = _verdicts(accepted, 1.0 / len(accepted), clipped)
    return mean, accepted, verdicts


def _dp_release(
    acc: RunningSum, clipped: set[str], plan: UplinkPlan, round_number: int
) -> tuple[Release, list[Accepted], dict[str, Verdict]]:
    """DP-FedAvg's release of the clipped sum (an empty round releases noise)."""
    assert plan.central is not None
    accepted = acc.accepted()
    total = acc.sum if acc.sum is not None else torch.zeros(acc.d, dtype=torch.float64)
    unclipped = (
        acc.unclipped
        if isinstance(acc, MaskedSum) and acc.unclipped is not None
        else sum(1 for a in accepted if a.client_id not in clipped)
    )
    rel = plan.central.release(
        total,
        len(accepted),
        unclipped,
        plan.sketch_sum(round_number) if acc.sketch_space else None,
        rounding=acc.rounding if isinstance(acc, MaskedSum) else 0.0,
    )
    return rel, accepted, _verdicts(accepted, 1.0 / rel.expected, clipped)


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
    release: Release | None = None
    if isinstance(acc, RowStack):
        aggregate, accepted, verdicts, partial = _from_rows(
            acc, aggregator, weighted, clipped
        )
    elif plan.central is not None:
        release, accepted, verdicts = _dp_release(acc, clipped, plan, round_number)
        aggregate = release.mean
    else:
        acc.settle()  # rows still held for the round's norm bound
        aggregate, accepted, verdicts = _from_sum(acc, clipped, plan, round_number)
    new = optimizer.step(global_weights, aggregate.to(torch.float32), round_number)
    if not all_finite(new):
        raise AggregationError("aggregation produced non-finite weights")
    if partial is None:
        return StepResult(new, aggregate, accepted, verdicts, release=release)
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

"""Weighted federated averaging (McMahan et al., 2017)."""

from __future__ import annotations

import torch
from fedplat.aggregators.base import (
    AggregationResult,
    ClientDecision,
    StatelessAggregator,
    check_updates,
)


class FedAvg(StatelessAggregator):
    """``sum_i w_i x_i / sum_i w_i`` over the rows of ``updates [n, d]``."""

    name = "fedavg"

    def __call__(
        self, updates: torch.Tensor, weights: torch.Tensor | None = None
    ) -> AggregationResult:
        w = check_updates(updates, weights)
        # One GEMV: memory-bound, reads the stack once.
        agg = w.to(updates.dtype) @ updates
        decisions = [ClientDecision(index=i, weight=float(w[i])) for i in range(len(w))]
        return AggregationResult(aggregate=agg, decisions=decisions)

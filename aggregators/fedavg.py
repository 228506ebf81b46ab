"""Weighted federated averaging (McMahan et al., 2017)."""

from __future__ import annotations

import torch
from fedplat.aggregators.base import Rule, RuleOutput, uniform_report


class FedAvg(Rule):
    """``sum_i w_i x_i / sum_i w_i`` over the rows of ``updates [n, d]``.

    Examples
    --------
    >>> x = torch.tensor([[0.0, 2.0], [4.0, 6.0]])
    >>> FedAvg()(x, torch.tensor([1.0, 3.0])).aggregate  # 1/4 (0, 2) + 3/4 (4, 6)
    tensor([3., 5.])
    """

    name = "fedavg"
    # Every row of positive weight enters the sum, so a non-finite one shows in
    # the output: no separate pass over the stack to find it.
    propagates_non_finite = True

    def aggregate_rows(
        self, updates: torch.Tensor, weights: torch.Tensor
    ) -> RuleOutput:
        # One GEMV: memory-bound, reads the stack once.
        agg = weights.to(updates.dtype) @ updates
        return RuleOutput(agg, uniform_report(weights))

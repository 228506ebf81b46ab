"""Centered clipping (Karimireddy, He & Jaggi, ICML 2021, "Learning from history
for Byzantine robust optimization", Eq. (2)).

``v <- v + sum_i w_i * clip_tau(x_i - v)`` for ``iterations`` steps, where
``clip_tau(z) = z * min(1, tau / ||z||)``, starting from the previous round's
output (the reference point, kept in :meth:`state_dict`; zero in the first round,
as in the authors' code). The iterates stay affine combinations of the rows and
the reference point, so distances come from one Gram matrix of the
``n + 1`` vectors and the stack is read twice in total.
"""

from __future__ import annotations

import torch
from fedplat.aggregators.base import (
    AggregationError,
    RowReport,
    Rule,
    RuleOutput,
    check_float,
    check_int,
)
from fedplat.aggregators.kernels.distances import (
    accurate_gram,
    combination_sq_distances,
    require_finite,
)


class CenteredClipping(Rule):
    """Centered clipping with a reference point carried between rounds.

    Parameters
    ----------
    tau : float
        Clipping radius around the reference point (> 0). Default 10, the value
        of the authors' benchmark code (``--clip-tau``); tune it to the scale of
        the updates.
    iterations : int
        Clipping steps per round (default 3, as in the authors' benchmark).

    Decisions: ``weight`` is the row's coefficient in the output (the rest of the
    output is the reference point), ``score`` its distance to the point it was
    clipped around in the last step; rows farther than ``tau`` are ``"clipped"``.

    Examples
    --------
    Around the first reference point 0 with ``tau = 1``, (3, 4) (norm 5) is
    clipped to (0.6, 0.8) and (0.5, 0) is kept; the output is their mean, and
    the next round starts from it:

    >>> cc = CenteredClipping(tau=1.0, iterations=1)
    >>> cc(torch.tensor([[3.0, 4.0], [0.5, 0.0]])).aggregate
    tensor([0.5500, 0.4000])
    >>> cc.state_dict()["center"]
    tensor([0.5500, 0.4000])
    """

    name = "centered_clipping"

    def __init__(self, tau: float = 10.0, iterations: int = 3) -> None:
        self.tau = check_float("tau", tau, minimum=0.0, strict=True)
        self.iterations = check_int("iterations", iterations, minimum=1)
        self._center: torch.Tensor | None = None

    def aggregate_rows(
        self, updates: torch.Tensor, weights: torch.Tensor
    ) -> RuleOutput:
        n, d = updates.shape
        center = self._center
        if center is None:
            center = torch.zeros(d, dtype=updates.dtype, device=updates.device)
        elif center.shape != (d,):
            raise AggregationError(
                f"{self.name}: reference point has {center.shape[0]} entries, updates "
                f"have d={d}; reset the aggregator state for a new model"
            )
        g = accurate_gram(updates, extra=center[None])  # [n + 1, n + 1]
        require_finite(g, self.name)
        w = weights.to(torch.float64)
        # Coefficients over [x_1 .. x_n, reference]; they always sum to 1.
        coef = torch.zeros(n + 1, dtype=torch.float64)
        coef[n] = 1.0
        dist = torch.zeros(n, dtype=torch.float64)
        scale = torch.ones(n, dtype=torch.float64)
        for _ in range(self.iterations):
            dist = combination_sq_distances(g, coef)[:n].sqrt()
            scale = (self.tau / dist.clamp_min(1e-300)).clamp_max(1.0)
            step = w * scale  # v <- v + sum_i step_i (x_i - v)
            coef = coef * (1.0 - float(step.sum()))
            coef[:n] += step
        agg = coef[:n].to(updates.dtype) @ updates + float(coef[n]) * center
        report = RowReport(coef[:n], coef[:n] > 0, dist, {"clipped": scale < 1.0})
        return RuleOutput(agg, report)

    def commit(self, aggregate: torch.Tensor) -> None:
        self._center = aggregate.detach().clone()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {} if self._center is None else {"center": self._center.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        unknown = sorted(set(state) - {"center"})
        if unknown:
            raise AggregationError(f"{self.name}: unknown state keys {unknown}")
        center = state.get("center")
        self._center = None if center is None else center.detach().clone()

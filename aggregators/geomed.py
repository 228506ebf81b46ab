"""Geometric median by smoothed Weiszfeld iterations: RFA (Pillutla, Kakade &
Harchaoui, IEEE TSP 2022, "Robust aggregation for federated learning",
Algorithm 3).

Every Weiszfeld iterate is a convex combination ``v = sum_i c_i x_i`` of the rows,
so the iteration runs on the coefficient vector ``c`` ``[n]`` with distances
``||x_i - v||`` taken from one Gram matrix (:func:`accurate_gram`): the stack is read
once for the Gram matrix and once for the final combination, however many
iterations run.
"""

from __future__ import annotations

import math

import torch
from fedplat.aggregators.base import (
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


def weighted_median(values: torch.Tensor, weights: torch.Tensor) -> float:
    """The smallest value whose cumulative weight reaches half the total.

    Examples
    --------
    >>> weighted_median(torch.tensor([3.0, 1.0, 2.0]), torch.tensor([0.2, 0.3, 0.5]))
    2.0
    """
    order = torch.argsort(values, stable=True)
    cumulative = torch.cumsum(weights[order], dim=0)
    i = int(torch.searchsorted(cumulative, 0.5 * float(cumulative[-1])))
    return float(values[order[min(i, values.numel() - 1)]])


def smoothed_weiszfeld(
    g: torch.Tensor,
    alpha: torch.Tensor,
    nu: float,
    max_iter: int,
    tol: float,
) -> tuple[torch.Tensor, int]:
    """Coefficients ``[n]`` of the smoothed geometric median, and iterations run.

    Minimises ``sum_i alpha_i * max(nu, ||v - x_i||)``-smoothed distances
    (Pillutla et al. 2022, Eq. (8)) by the update
    ``beta_i = alpha_i / max(nu, ||v - x_i||)``, ``v <- sum beta_i x_i / sum beta_i``,
    starting from the weighted mean.

    Stopping rule. RFA's code stops when the objective changes by less than
    ``ftol`` times its value (``geometric_median_update``, ``ftol = 1e-6``). One
    far row dominates that objective, so a relative change of ``1e-6`` comes
    while the iterate still moves by far more than the spread of the other rows
    (a row at ``1e12`` left it off by ~2500 on a median of norm 12). Here the
    iteration stops once the iterate moves by at most ``tol`` times the
    ``alpha``-weighted median of the distances from the rows to it (at least
    ``nu``): a scale set by the majority of the weight, which a far row cannot
    inflate, and invariant to translating or scaling all rows. ``tol = 0`` runs
    ``max_iter`` updates.

    Parameters
    ----------
    g : torch.Tensor
        ``[n, n]`` Gram matrix around any origin, float64.
    alpha : torch.Tensor
        ``[n]`` non-negative weights summing to 1, float64.
    """
    coef = alpha.clone()
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007 - `it` is reported
        dist = combination_sq_distances(g, coef).sqrt()
        beta = alpha / dist.clamp_min(nu)
        new = beta / beta.sum()
        step = new - coef  # sums to 0: ||v_new - v||^2 = step^T G step
        moved = math.sqrt(max(0.0, float(step @ g @ step)))
        coef = new
        if moved <= tol * max(nu, weighted_median(dist, alpha)):
            break
    return coef, it


class GeometricMedian(Rule):
    """Geometric median (RFA) of the rows, weighted by the client weights.

    Parameters
    ----------
    nu : float
        Smoothing: distances below ``nu`` count as ``nu`` (avoids dividing by
        zero when the median sits on a row). Default ``1e-6``.
    max_iter : int
        Cap on Weiszfeld updates (default 100).
    tol : float
        Stop when an update moves the estimate by at most ``tol`` times the
        weighted median distance of the rows to it (default ``1e-6``; see
        :func:`smoothed_weiszfeld`).

    RFA is robust while the Byzantine clients hold under half the total weight.
    Decisions: ``weight`` is the final Weiszfeld coefficient of the row (the
    output is exactly ``sum_i weight_i x_i``), ``score`` its distance to the
    output; rows whose coefficient fell below half their client weight are
    ``"down-weighted"``.

    Examples
    --------
    On a line the geometric median is the median, 1 here (the mean is 11/3):

    >>> r = GeometricMedian()(torch.tensor([[0.0], [1.0], [10.0]]))
    >>> r.aggregate, [d.flags for d in r.decisions]
    (tensor([1.]), [('down-weighted',), (), ('down-weighted',)])
    """

    name = "geometric_median"

    def __init__(
        self, nu: float = 1e-6, max_iter: int = 100, tol: float = 1e-6
    ) -> None:
        self.nu = check_float("nu", nu, minimum=0.0, strict=True)
        self.max_iter = check_int("max_iter", max_iter, minimum=1)
        self.tol = check_float("tol", tol, minimum=0.0)

    def aggregate_rows(
        self, updates: torch.Tensor, weights: torch.Tensor
    ) -> RuleOutput:
        g = accurate_gram(updates)
        require_finite(g, self.name)
        alpha = weights.to(torch.float64)
        coef, _ = smoothed_weiszfeld(g, alpha, self.nu, self.max_iter, self.tol)
        agg = coef.to(updates.dtype) @ updates
        dist = combination_sq_distances(g, coef).sqrt()
        flags = {"down-weighted": coef < 0.5 * alpha}
        return RuleOutput(agg, RowReport(coef, coef > 0, dist, flags))

"""Geometric median by smoothed Weiszfeld iterations: RFA (Pillutla, Kakade &
Harchaoui, IEEE TSP 2022, "Robust aggregation for federated learning",
Algorithm 3).

Every Weiszfeld iterate is a convex combination ``v = sum_i c_i x_i`` of the rows,
so the iteration runs on the coefficient vector ``c`` ``[n]`` with distances
``||x_i - v||`` taken from one Gram matrix (:func:`accurate_gram`): the stack is read
once for the Gram matrix and once for the final combination, however many
iterations run.

Starting point. The paper's smoothed Weiszfeld algorithm decreases the smoothed
objective from any starting point (Pillutla et al. 2022, Algorithm 3 takes
``v^(0)`` as an input [R: their code starts from the weighted mean]). The
weighted mean converges only linearly when one far row holds nearly half the
weight: with a row at ``1e7`` holding 48% of it, 100 updates ended 500 times the
honest spread away. Here the iteration starts from the weighted mean or from the
rows near the row of lowest objective (:func:`starting_point`), whichever is
lower, so a far minority cannot drag the start away. A run that
still stops at ``max_iter`` reports ``converged = False`` (the result's
``diagnostics`` and an ``"unconverged"`` flag on every row), never silently.
"""

from __future__ import annotations

import math
from typing import NamedTuple

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
    sq_distances_from_gram,
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


def smoothed_distance(dist: torch.Tensor, nu: float) -> torch.Tensor:
    """The smoothed distance of Pillutla et al. (2022), Eq. (8): ``dist`` when
    ``dist >= nu``, else ``dist^2 / (2 nu) + nu / 2`` (same shape as ``dist``)."""
    return torch.where(dist >= nu, dist, dist * dist / (2.0 * nu) + 0.5 * nu)


def starting_point(g: torch.Tensor, alpha: torch.Tensor, nu: float) -> torch.Tensor:
    """Coefficients ``[n]`` of the Weiszfeld start: the weighted mean, or the
    weighted mean of the rows near the best row, whichever has the lower
    smoothed objective (ties keep the mean).

    The best row ``k`` has the lowest objective of all rows; "near" means within
    the ``alpha``-weighted median of the distances from ``x_k``, so the set
    holds at least half the weight and no row farther than the majority. A
    data point is never the start unless it holds half the weight (then it is
    the median): the smoothed update barely leaves a data point, so starting on
    one would stop there.

    ``g`` is a Gram matrix ``[n, n]`` (float64), ``alpha`` ``[n]`` weights summing
    to 1.
    """
    dist = sq_distances_from_gram(g).sqrt()
    k = int(torch.sort(smoothed_distance(dist, nu) @ alpha, stable=True).indices[0])
    near = alpha * (dist[k] <= weighted_median(dist[k], alpha))
    local = near / near.sum()

    def objective(coef: torch.Tensor) -> float:
        return float(
            alpha @ smoothed_distance(combination_sq_distances(g, coef).sqrt(), nu)
        )

    return local if objective(local) < objective(alpha) else alpha.clone()


class WeiszfeldResult(NamedTuple):
    """Outcome of :func:`smoothed_weiszfeld`."""

    coef: torch.Tensor  # [n] float64, sums to 1
    iterations: int
    converged: bool  # the stopping rule was met (False: stopped at max_iter)


def smoothed_weiszfeld(
    g: torch.Tensor,
    alpha: torch.Tensor,
    nu: float,
    max_iter: int,
    tol: float,
) -> WeiszfeldResult:
    """Coefficients ``[n]`` of the smoothed geometric median, iterations run, and
    whether the stopping rule was met.

    Minimises ``sum_i alpha_i * max(nu, ||v - x_i||)``-smoothed distances
    (Pillutla et al. 2022, Eq. (8)) by the update
    ``beta_i = alpha_i / max(nu, ||v - x_i||)``, ``v <- sum beta_i x_i / sum beta_i``,
    starting from :func:`starting_point`.

    Stopping rule. RFA's code stops when the objective changes by less than
    ``ftol`` times its value (``geometric_median_update``, ``ftol = 1e-6``). One
    far row dominates that objective, so a relative change of ``1e-6`` comes
    while the iterate still moves by far more than the spread of the other rows
    (a row at ``1e12`` left it off by ~2500 on a median of norm 12). Here the
    iteration stops once the iterate moves by at most ``tol`` times the
    ``alpha``-weighted median of the distances from the rows to it (at least
    ``nu``): a scale set by the majority of the weight, which a far row cannot
    inflate, and invariant to translating or scaling all rows. ``tol = 0`` runs
    ``max_iter`` updates (``converged`` only if the iterate stopped moving).

    Parameters
    ----------
    g : torch.Tensor
        ``[n, n]`` Gram matrix around any origin, float64.
    alpha : torch.Tensor
        ``[n]`` non-negative weights summing to 1, float64.
    """
    coef = starting_point(g, alpha, nu)
    it, converged = 0, False
    for it in range(1, max_iter + 1):  # noqa: B007 - `it` is reported
        dist = combination_sq_distances(g, coef).sqrt()
        beta = alpha / dist.clamp_min(nu)
        new = beta / beta.sum()
        step = new - coef  # sums to 0: ||v_new - v||^2 = step^T G step
        moved = math.sqrt(max(0.0, float(step @ g @ step)))
        coef = new
        if moved <= tol * max(nu, weighted_median(dist, alpha)):
            converged = True
            break
    return WeiszfeldResult(coef, it, converged)


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
    ``"down-weighted"``. The result's ``diagnostics`` hold ``converged`` and
    ``iterations``; a run stopped by ``max_iter`` also flags every row
    ``"unconverged"`` (a fact about the round, recorded with each verdict).

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
        run = smoothed_weiszfeld(g, alpha, self.nu, self.max_iter, self.tol)
        coef = run.coef
        agg = coef.to(updates.dtype) @ updates
        dist = combination_sq_distances(g, coef).sqrt()
        flags = {"down-weighted": coef < 0.5 * alpha}
        if not run.converged:
            flags["unconverged"] = torch.ones_like(coef, dtype=torch.bool)
        diagnostics = {"converged": run.converged, "iterations": run.iterations}
        report = RowReport(coef, coef > 0, dist, flags)
        return RuleOutput(agg, report, diagnostics)

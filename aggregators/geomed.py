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
)


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
    starting from the weighted mean, until the objective changes by at most
    ``tol`` times its value or ``max_iter`` updates have run.

    Parameters
    ----------
    g : torch.Tensor
        ``[n, n]`` Gram matrix (plain or centered), float64.
    alpha : torch.Tensor
        ``[n]`` non-negative weights summing to 1, float64.
    """
    coef = alpha.clone()
    objective = math.inf
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007 - `it` is reported
        dist = combination_sq_distances(g, coef).sqrt()
        new_objective = float(alpha @ dist)
        beta = alpha / dist.clamp_min(nu)
        coef = beta / beta.sum()
        if abs(objective - new_objective) <= tol * new_objective:
            break
        objective = new_objective
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
        Stop when the objective changes by at most ``tol`` times its value
        (default ``1e-6``).

    RFA is robust while the Byzantine clients hold under half the total weight.
    Decisions: ``weight`` is the final Weiszfeld coefficient of the row (the
    output is exactly ``sum_i weight_i x_i``), ``score`` its distance to the
    output; rows whose coefficient fell below half their client weight are
    ``"down-weighted"``.
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
        alpha = weights.to(torch.float64)
        coef, _ = smoothed_weiszfeld(g, alpha, self.nu, self.max_iter, self.tol)
        agg = coef.to(updates.dtype) @ updates
        dist = combination_sq_distances(g, coef).sqrt()
        flags = {"down-weighted": coef < 0.5 * alpha}
        return RuleOutput(agg, RowReport(coef, coef > 0, dist, flags))

"""Adaptive bounds on what one client can do to a weighted mean: norm and weight.

**Norm bounding.** Sun, Kairouz, Suresh & McMahan (2019), "Can You Really
Backdoor Federated Learning?" (arXiv 1911.07963, Section 4, "norm
thresholding"), clip every update before averaging: ``u_i <- u_i * min(1, B /
||u_i||)``. Their ``B`` is a constant; here it is relative, so that nothing is
tuned to a model's scale: ``B = m * med(R)``, ``m >= 1`` a multiplier and
``med`` the *lower* median (the ``ceil(k / 2)``-th smallest of ``k`` values) of a
reference set ``R`` of update norms (:func:`norm_bound`, :func:`bound_scales`).

*Why a minority cannot raise the bound.* Adding values to a set can only lower
its order statistics, and adding ``f`` of them lowers each by at most ``f``
places: if ``R`` holds ``h`` honest norms ``x_(1) <= ... <= x_(h)`` and ``f < k / 2``
others (any values, ``+inf`` included), its lower median lies between
``x_(ceil(k/2) - f)`` and ``x_(ceil(k/2))``. So ``B <= m * x_(ceil(k/2))``: at most
``m`` times an honest norm, whatever the attackers send. Every bounded row has
norm ``<= B``, so a weighted mean of bounded rows has norm ``<= B`` too, and
attackers holding a weight share ``s`` move it by at most ``2 s B`` away from
the mean of the honest rows alone (``(s (A - H))`` with ``||A||, ||H|| <= B``).
Honest rows are scaled only when their norm exceeds ``m`` times the median: the
multiplier is the slack left to honest spread.

**Weight bounding.** A weighted mean trusts each client's declared example
count; caps per client (the enrolment token's, the run's) are fixed numbers
that say nothing of the other clients. :func:`weight_cap` adds a relative cap,
``C = k * max(1, med(d))`` over the declared counts ``d`` of the round's
selected clients, with the same argument: attackers fewer than half of them
cannot raise ``med(d)`` above an honest count. At least ``floor(n/2) + 1 - f``
honest clients then weigh ``>= med(d)`` each and an attacker at most ``k``
times that, so ``f`` attackers among ``n`` hold a weight share of at most
``f k / (f k + floor(n/2) + 1 - f)`` (:func:`max_attacker_share`); with equal
honest clients one attacker holds ``k / (k + n - 1)``.

Pure functions over small tensors (norms ``[k]``, counts ``[n]``), float64.
"""

from __future__ import annotations

import math

import torch
from fedplat.aggregators.base import AggregationError, check_float


def median_low(values: torch.Tensor) -> float:
    """The lower median of ``values`` ``[k]``: its ``ceil(k / 2)``-th smallest.

    Examples
    --------
    >>> median_low(torch.tensor([1.0, 1000.0, 2.0, 1.0]))
    1.0
    >>> median_low(torch.tensor([3.0, 1.0, 2.0]))
    2.0
    """
    if values.numel() == 0:
        raise AggregationError("the median of no values is undefined")
    v = values.reshape(-1).to(torch.float64)
    # torch.median returns the lower of the two middle values for even k.
    return float(v.median())


def norm_bound(reference: torch.Tensor, multiplier: float) -> float:
    """``B = multiplier * median_low(reference)`` for reference norms ``[k]``.

    Examples
    --------
    >>> norm_bound(torch.tensor([1.0, 1.0, 2.0, 1000.0]), 3.0)
    3.0
    """
    m = check_float("multiplier", multiplier, minimum=1.0)
    if not bool(torch.isfinite(reference).all()) or bool((reference < 0).any()):
        raise AggregationError("reference norms must be finite and non-negative")
    return m * median_low(reference)


def bound_scales(norms: torch.Tensor, bound: float) -> torch.Tensor:
    """Each row's factor ``min(1, bound / ||u_i||)`` ``[n]`` float64 (a zero row
    keeps factor 1).

    Parameters
    ----------
    norms : torch.Tensor
        ``[n]`` L2 norms of the rows, finite and non-negative.
    bound : float
        ``B >= 0`` (:func:`norm_bound`).

    Examples
    --------
    >>> bound_scales(torch.tensor([1.0, 1.0, 2.0, 1000.0, 0.0]), 3.0)
    tensor([1.0000, 1.0000, 1.0000, 0.0030, 1.0000], dtype=torch.float64)
    """
    if not math.isfinite(bound) or bound < 0:
        raise AggregationError(f"the norm bound must be finite and >= 0, got {bound}")
    n = norms.to(torch.float64)
    return torch.where(n > bound, bound / n.clamp_min(1e-300), torch.ones_like(n))


def weight_cap(declared: torch.Tensor, multiplier: float) -> float:
    """``C = multiplier * max(1, median_low(declared))`` over the declared
    example counts ``[n]`` of a round's selected clients (a median of 0, clients
    that declared nothing, counts as 1: they weigh alike).

    Examples
    --------
    >>> weight_cap(torch.tensor([100, 120, 10**12, 80]), 3.0)
    300.0
    >>> weight_cap(torch.tensor([0, 0, 50]), 3.0)
    3.0
    """
    m = check_float("multiplier", multiplier, minimum=1.0)
    return m * max(1.0, median_low(declared.to(torch.float64)))


def max_attacker_share(n: int, f: int, multiplier: float) -> float:
    """The largest weight share ``f`` attackers among ``n`` selected clients can
    hold under :func:`weight_cap` (module docstring), for ``2 f < n``.

    Examples
    --------
    >>> max_attacker_share(10, 1, 3.0)  # 3 / (3 + 5)
    0.375
    >>> round(max_attacker_share(100, 1, 3.0), 4)
    0.0566
    """
    if not 0 <= 2 * f < n:
        raise AggregationError(f"the bound needs 2f < n, got n={n}, f={f}")
    fk = f * check_float("multiplier", multiplier, minimum=1.0)
    return fk / (fk + n // 2 + 1 - f)


__all__ = [
    "bound_scales",
    "max_attacker_share",
    "median_low",
    "norm_bound",
    "weight_cap",
]

"""Coordinate-wise rules: median, trimmed mean, MeaMed.

Each coordinate is aggregated independently from its sorted column of client
values. The maths of each rule is one function of the sorted values ``s`` of a
column (``s[r]`` is the ``r``-th smallest value, one tensor over a block of
columns); :func:`fedplat.aggregators.kernels.order_stats.reduce_columns` sorts
the columns fast and applies it. Client weights are validated but not used: an
order statistic that counted a client's claimed example count could be moved by
a single Byzantine client claiming a huge count.

Per-client decisions: ``score`` is the fraction of coordinates where the client's
value was kept (inside the median pair, the untrimmed range, the MeaMed window),
``weight`` its share of all kept entries, ``"down-weighted"`` marks clients kept
less than half as often as average.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from fedplat.aggregators.base import (
    Rule,
    RuleOutput,
    check_int,
    participation_report,
    require,
)
from fedplat.aggregators.kernels.order_stats import (
    ColumnReduction,
    Coordinatewise,
    reduce_columns,
)

# (aggregate, lowest kept value, highest kept value), each [S]
Kept = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def median_of_sorted(s: Sequence[torch.Tensor]) -> Kept:
    """The middle value; for even ``n`` the mean of the two middle values."""
    n = len(s)
    lo, hi = (n - 1) // 2, n // 2
    med = s[lo] if lo == hi else 0.5 * (s[lo] + s[hi])
    return med, s[lo], s[hi]


def trimmed_mean_of_sorted(s: Sequence[torch.Tensor], trim: int) -> Kept:
    """The mean of ``s[trim], ..., s[n - trim - 1]``."""
    kept = s[trim : len(s) - trim]
    total = kept[0]
    for v in kept[1:]:
        total = total + v
    return total / len(kept), kept[0], kept[-1]


def _wide(v: torch.Tensor) -> torch.Tensor:
    # Window choices compare sums of two values: in float64 they are exact for
    # float32 inputs of similar magnitude, so near-ties are decided as exactly as
    # in a float64 reference instead of at float32's 6e-8.
    return v.to(torch.float64)


def meamed_of_sorted(s: Sequence[torch.Tensor], f: int) -> Kept:
    """The mean of the ``keep = n - f`` values closest to the median.

    Those values form a window ``s[start : start + keep]`` of the sorted column.
    Sliding the window from ``start = i`` to ``i + 1`` swaps ``s[i]`` for
    ``s[i + keep]``, a gain exactly when ``s[i + keep] - med < med - s[i]``, i.e.
    ``s[i] + s[i + keep] < 2 med``. The left side grows with ``i``, so the gains
    come first and ``start`` is their count; an equal distance keeps the smaller
    value. (Minimising the window's largest distance instead is not the same:
    ``[0, 0, 1, 1.5, 1.6]`` with ``f = 1`` has two windows of largest distance
    1, and only ``[0, 1, 1.5, 1.6]`` holds the four closest values.)

    The mean sums only the rows inside the window, so an excluded value, however
    large, contributes an exact zero (a running sum of the windows would carry
    its rounding error into the result).
    """
    n = len(s)
    keep = n - f
    lo, hi = (n - 1) // 2, n // 2
    if f == 0:
        return trimmed_mean_of_sorted(s, 0)
    twice_median = _wide(s[lo]) + _wide(s[hi])
    start = (_wide(s[0]) + _wide(s[keep]) < twice_median).long()
    for i in range(1, f):
        start = start + (_wide(s[i]) + _wide(s[i + keep]) < twice_median).long()
    total = torch.zeros_like(s[0])
    first, last = s[0], s[keep - 1]
    for r in range(n):
        if f <= r < keep:  # inside every window
            total = total + s[r]
        else:
            inside = (start <= r) & (start > r - keep)
            total = total + torch.where(inside, s[r], 0.0)
    for i in range(1, f + 1):
        first = torch.where(start == i, s[i], first)
        last = torch.where(start == i, s[i + keep - 1], last)
    return total / keep, first, last


def coordinate_median(x: torch.Tensor, track: bool = True) -> Coordinatewise:
    """Coordinate-wise median of ``x`` ``[n, d]`` (:func:`median_of_sorted`)."""
    n = x.shape[0]
    ranks = tuple(sorted({(n - 1) // 2, n // 2}))
    return reduce_columns(
        x, ColumnReduction(("median", n), ranks, median_of_sorted), track
    )


def coordinate_trimmed_mean(
    x: torch.Tensor, trim: int, track: bool = True
) -> Coordinatewise:
    """Mean of the ``n - 2*trim`` middle values of every column of ``x``
    ``[n, d]``; requires ``0 <= 2*trim < n``."""
    n = x.shape[0]
    if not 0 <= 2 * trim < n:
        raise ValueError(f"trimmed mean needs 0 <= 2*trim < n, got trim={trim}, n={n}")

    def reduce(s: Sequence[torch.Tensor]) -> Kept:
        return trimmed_mean_of_sorted(s, trim)

    ranks = tuple(range(trim, n - trim))
    key = ("trimmed_mean", n, trim)
    return reduce_columns(x, ColumnReduction(key, ranks, reduce), track)


def coordinate_meamed(x: torch.Tensor, f: int, track: bool = True) -> Coordinatewise:
    """MeaMed of every column of ``x`` ``[n, d]`` (:func:`meamed_of_sorted`);
    requires ``0 <= f < n``."""
    n = x.shape[0]
    if not 0 <= f < n:
        raise ValueError(f"MeaMed needs 0 <= f < n, got f={f}, n={n}")

    def reduce(s: Sequence[torch.Tensor]) -> Kept:
        return meamed_of_sorted(s, f)

    return reduce_columns(x, ColumnReduction(("meamed", n, f), None, reduce), track)


class CoordinateMedian(Rule):
    """Coordinate-wise median (Yin et al., ICML 2018, "Byzantine-robust distributed
    learning: towards optimal statistical rates", Eq. (3)).

    ``updates [n, d] -> [d]``; for even ``n`` the mean of the two middle values
    (numpy's convention, not ``torch.median``'s lower median). Robust while fewer
    than half the clients are Byzantine; needs no ``f``.

    Examples
    --------
    >>> x = torch.tensor([[1.0, 10.0], [2.0, 20.0], [100.0, -5.0]])
    >>> CoordinateMedian()(x).aggregate
    tensor([ 2., 10.])
    """

    name = "median"

    def aggregate_rows(
        self, updates: torch.Tensor, weights: torch.Tensor
    ) -> RuleOutput:
        res = coordinate_median(updates)
        return RuleOutput(res.aggregate, participation_report(res.kept))


class TrimmedMean(Rule):
    """Coordinate-wise trimmed mean (Yin et al. 2018, Eq. (4)).

    Per coordinate, drop the ``f`` largest and ``f`` smallest values and average
    the remaining ``n - 2f``. Needs ``2f < n`` (checked at call time).

    Parameters
    ----------
    f : int
        Values trimmed on each side (the number of Byzantine clients tolerated).

    Examples
    --------
    >>> x = torch.tensor([[1.0], [2.0], [3.0], [4.0], [100.0]])
    >>> TrimmedMean(f=1)(x).aggregate  # mean of 2, 3, 4
    tensor([3.])
    """

    name = "trimmed_mean"

    def __init__(self, f: int) -> None:
        self.f = check_int("f", f)

    def aggregate_rows(
        self, updates: torch.Tensor, weights: torch.Tensor
    ) -> RuleOutput:
        n = updates.shape[0]
        require(2 * self.f < n, self.name, "2f < n", f=self.f, n=n)
        res = coordinate_trimmed_mean(updates, self.f)
        return RuleOutput(res.aggregate, participation_report(res.kept))


class MeaMed(Rule):
    """Mean around the median (Xie, Koyejo & Gupta 2018, "Generalized
    Byzantine-tolerant SGD", Definition 5, "MeaMed").

    Per coordinate, the mean of the ``n - f`` values closest to the median
    (:func:`meamed_of_sorted`); of two values at the same distance the smaller
    is kept. Needs ``2f < n`` (checked at call time). The Flag Aggregator paper
    uses it as a baseline.

    Parameters
    ----------
    f : int
        Number of values dropped per coordinate.

    Examples
    --------
    The median of ``0, 0, 1, 1.5, 1.6`` is 1; the four closest values are
    1, 1.5, 1.6 and one 0:

    >>> x = torch.tensor([[0.0], [0.0], [1.0], [1.5], [1.6]])
    >>> MeaMed(f=1)(x).aggregate  # (0 + 1 + 1.5 + 1.6) / 4
    tensor([1.0250])
    """

    name = "meamed"

    def __init__(self, f: int) -> None:
        self.f = check_int("f", f)

    def aggregate_rows(
        self, updates: torch.Tensor, weights: torch.Tensor
    ) -> RuleOutput:
        n = updates.shape[0]
        require(2 * self.f < n, self.name, "2f < n", f=self.f, n=n)
        res = coordinate_meamed(updates, self.f)
        return RuleOutput(res.aggregate, participation_report(res.kept))

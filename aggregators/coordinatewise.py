"""Coordinate-wise rules: median, trimmed mean, MeaMed.

Each coordinate is aggregated independently from the sorted column of client
values (see :mod:`fedplat.aggregators.kernels.order_stats` for the fast column sort).
Client weights are validated but not used: an order statistic that counted a
client's claimed example count could be moved by a single Byzantine client
claiming a huge count.

Per-client decisions: ``score`` is the fraction of coordinates where the client's
value was kept (inside the median pair, the untrimmed range, the MeaMed window),
``weight`` its share of all kept entries, ``"down-weighted"`` marks clients kept
less than half as often as average.
"""

from __future__ import annotations

import torch
from fedplat.aggregators.base import (
    Rule,
    RuleOutput,
    check_int,
    participation_report,
    require,
)
from fedplat.aggregators.kernels.order_stats import (
    coordinate_meamed,
    coordinate_median,
    coordinate_trimmed_mean,
)


class CoordinateMedian(Rule):
    """Coordinate-wise median (Yin et al., ICML 2018, "Byzantine-robust distributed
    learning: towards optimal statistical rates", Eq. (3)).

    ``updates [n, d] -> [d]``; for even ``n`` the mean of the two middle values.
    Robust while fewer than half the clients are Byzantine; needs no ``f``.
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

    Per coordinate, the mean of the ``n - f`` values closest to the median; ties
    in distance go to the smaller values. Needs ``2f < n`` (checked at call time).
    The Flag Aggregator paper uses it as a baseline.

    Parameters
    ----------
    f : int
        Number of values dropped per coordinate.
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

"""Krum and Multi-Krum (Blanchard et al., NeurIPS 2017; El Mhamdi et al., ICML 2018).

All pairwise distances come from one Gram matrix
(:func:`fedplat.aggregators.kernels.distances.pairwise_sq_distances`), so the cost
is one GEMM plus one GEMV for the average, whatever ``n``.
"""

from __future__ import annotations

import math

import torch
from fedplat.aggregators.base import (
    RowReport,
    Rule,
    RuleOutput,
    check_int,
    require,
)
from fedplat.aggregators.kernels.distances import pairwise_sq_distances


def krum_scores(sq_dist: torch.Tensor, neighbours: int) -> torch.Tensor:
    """Krum score of every row (Blanchard et al. 2017, Sec. 4).

    ``score(i) = sum of the squared distances from x_i to its ``neighbours``
    closest other rows``; the paper uses ``neighbours = n - f - 2``.

    Parameters
    ----------
    sq_dist : torch.Tensor
        ``[n, n]`` squared distances (diagonal ignored).
    neighbours : int
        How many nearest other rows enter the score, ``1 <= neighbours <= n - 1``.

    Returns
    -------
    torch.Tensor
        ``[n]`` scores, same dtype as ``sq_dist``.
    """
    d = sq_dist.clone()
    d.fill_diagonal_(math.inf)
    return d.topk(neighbours, dim=1, largest=False).values.sum(dim=1)


def lowest(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices ``[k]`` of the ``k`` smallest scores, ties broken by lower index."""
    return torch.sort(scores, stable=True).indices[:k]


class MultiKrum(Rule):
    """Multi-Krum: average the ``m`` rows with the lowest Krum scores.

    Parameters
    ----------
    f : int
        Number of Byzantine clients tolerated. Needs ``n >= 2f + 3`` (Blanchard et
        al.: ``2f + 2 < n``), checked at call time.
    m : int or None
        Rows averaged; ``None`` means ``n - f`` (El Mhamdi et al. 2018, as in
        ByzFL). Must satisfy ``1 <= m <= n`` at call time.

    The average is unweighted (a client's claimed weight cannot buy it a larger
    share). Decisions: ``score`` is the Krum score, ``weight`` ``1/m`` for the
    selected rows, others are flagged ``"excluded"``.

    Examples
    --------
    With ``f = 0`` every score sums the ``n - 2 = 2`` nearest squared distances:
    0 -> 1 + 4, 1 -> 1 + 1, 2 -> 1 + 4, 10 -> 64 + 81. The two lowest are rows 1
    and 0 (a tie with row 2 goes to the lower index):

    >>> x = torch.tensor([[0.0], [1.0], [2.0], [10.0]])
    >>> r = MultiKrum(f=0, m=2)(x)
    >>> r.aggregate, [d.score for d in r.decisions]
    (tensor([0.5000]), [5.0, 2.0, 5.0, 145.0])
    """

    name = "multi_krum"

    def __init__(self, f: int, m: int | None = None) -> None:
        self.f = check_int("f", f)
        self.m = None if m is None else check_int("m", m, minimum=1)

    def selection(self, updates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Selected row indices ``[m]`` and Krum scores ``[n]`` (float64)."""
        n = updates.shape[0]
        require(n >= 2 * self.f + 3, self.name, "n >= 2f + 3", f=self.f, n=n)
        m = n - self.f if self.m is None else self.m
        require(m <= n, self.name, "m <= n", m=m, n=n)
        scores = krum_scores(pairwise_sq_distances(updates), n - self.f - 2)
        return lowest(scores, m), scores

    def aggregate_rows(
        self, updates: torch.Tensor, weights: torch.Tensor
    ) -> RuleOutput:
        n = updates.shape[0]
        chosen, scores = self.selection(updates)
        m = chosen.numel()
        coef = torch.zeros(n, dtype=torch.float64)
        coef[chosen] = 1.0 / m
        if m == 1:
            agg = updates[int(chosen[0])].clone()
        else:
            agg = coef.to(updates.dtype) @ updates
        selected = coef > 0
        report = RowReport(coef, selected, scores, {"excluded": ~selected})
        return RuleOutput(agg, report)


class Krum(MultiKrum):
    """Krum (Blanchard et al. 2017): the single row with the lowest Krum score.

    Multi-Krum with ``m = 1``. Needs ``n >= 2f + 3``.

    Examples
    --------
    >>> x = torch.tensor([[0.0], [1.0], [2.0], [10.0]])  # scores 5, 2, 5, 145
    >>> r = Krum(f=0)(x)
    >>> r.aggregate, [d.selected for d in r.decisions]
    (tensor([1.]), [False, True, False, False])
    """

    name = "krum"

    def __init__(self, f: int) -> None:
        super().__init__(f, m=1)

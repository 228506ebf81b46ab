"""Bulyan (El Mhamdi, Guerraoui & Rouault, ICML 2018, "The hidden vulnerability of
distributed learning in Byzantium", Sec. 4).

1. Selection: ``theta = n - 2f`` times, run Krum on the rows not yet selected and
   move the winner to the selection set. The pairwise distances are computed once
   (one Gram matrix) and reused by every round of the loop; only ``[n, n]``-sized
   work is repeated.
2. Aggregation: per coordinate, the mean of the ``beta = theta - 2f`` selected
   values closest to their median (MeaMed over the selection).

Needs ``n >= 4f + 3``.
"""

from __future__ import annotations

import torch
from fedplat.aggregators.base import (
    RowReport,
    Rule,
    RuleOutput,
    check_int,
    require,
)
from fedplat.aggregators.coordinatewise import coordinate_meamed
from fedplat.aggregators.kernels.distances import pairwise_sq_distances
from fedplat.aggregators.krum import krum_scores


def bulyan_selection(
    sq_dist: torch.Tensor, f: int, theta: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Recursive Krum selection (Bulyan step 1).

    Parameters
    ----------
    sq_dist : torch.Tensor
        ``[n, n]`` squared distances.
    f : int
        Byzantine clients tolerated.
    theta : int
        Rows to select.

    Returns
    -------
    tuple of torch.Tensor
        Selected indices ``[theta]`` in selection order, and the Krum scores of
        the first round ``[n]``.
    """
    n = sq_dist.shape[0]
    remaining = torch.arange(n)
    chosen: list[int] = []
    first_scores = torch.empty(0)
    for _ in range(theta):
        r = remaining.numel()
        sub = sq_dist[remaining][:, remaining]
        # Krum with the remaining set: r - f - 2 neighbours, at least one.
        scores = krum_scores(sub, min(r - 1, max(1, r - f - 2)))
        if not chosen:
            first_scores = scores
        best = int(torch.sort(scores, stable=True).indices[0])
        chosen.append(int(remaining[best]))
        remaining = torch.cat([remaining[:best], remaining[best + 1 :]])
    return torch.tensor(chosen, dtype=torch.int64), first_scores


class Bulyan(Rule):
    """Bulyan over Krum.

    Parameters
    ----------
    f : int
        Byzantine clients tolerated; needs ``n >= 4f + 3`` at call time.

    Decisions: ``score`` is the first-round Krum score; rows outside the selection
    set are ``"excluded"``; ``weight`` is a selected row's share of the entries
    kept by the coordinate-wise step (``"down-weighted"`` when under half the
    average).

    Examples
    --------
    ``n = 7``, ``f = 1``: Krum picks ``theta = 5`` rows one by one (2, 1, 3, 0, 4:
    never 50 or -50), then per coordinate MeaMed keeps the ``beta = 3`` values
    closest to their median 2, i.e. 1, 2, 3:

    >>> x = torch.tensor([[0.0], [1.0], [2.0], [3.0], [4.0], [50.0], [-50.0]])
    >>> r = Bulyan(f=1)(x)
    >>> r.aggregate, [d.selected for d in r.decisions]
    (tensor([2.]), [True, True, True, True, True, False, False])
    """

    name = "bulyan"

    def __init__(self, f: int) -> None:
        self.f = check_int("f", f)

    def aggregate_rows(
        self, updates: torch.Tensor, weights: torch.Tensor
    ) -> RuleOutput:
        n = updates.shape[0]
        f = self.f
        require(n >= 4 * f + 3, self.name, "n >= 4f + 3", f=f, n=n)
        theta = n - 2 * f
        chosen, scores = bulyan_selection(pairwise_sq_distances(updates), f, theta)
        res = coordinate_meamed(updates[chosen], 2 * f)
        kept = torch.zeros(n, dtype=torch.float64)
        kept[chosen] = res.kept
        total = float(kept.sum())
        weight = kept / total if total > 0 else kept
        selected = torch.zeros(n, dtype=torch.bool)
        selected[chosen] = True
        flags = {
            "excluded": ~selected,
            "down-weighted": selected & (weight < 0.5 / theta),
        }
        return RuleOutput(res.aggregate, RowReport(weight, selected, scores, flags))

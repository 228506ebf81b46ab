"""Spread of the models across nodes."""

from __future__ import annotations

import math

import torch

__all__ = ["consensus_distance"]


def consensus_distance(x: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """Root-mean-square distance of the models to their average.

    ``sqrt(1/n * sum_i ||x_i - x_bar||^2)``, the consensus distance of Kong et al.
    (ICML 2021, "Consensus control for decentralized deep learning", eq. 3, whose
    square is ``Xi^2``). It is 0 exactly when all models agree and grows when a
    partition lets groups drift apart.

    Parameters
    ----------
    x : torch.Tensor
        ``[n, d]`` stacked models.
    mask : torch.Tensor, optional
        bool ``[n]``: only these rows count (e.g. live nodes).

    Returns
    -------
    float
        ``nan`` when no row is selected.
    """
    rows = x if mask is None else x[mask]
    if rows.shape[0] == 0:
        return math.nan
    r = rows.to(torch.float64)
    return float(((r - r.mean(dim=0)) ** 2).sum(dim=1).mean().sqrt())

"""Push-sum gossip for directed or changing links (Kempe, Dobra & Gehrke 2003).

Each node ``i`` holds a value ``x_i`` ``[d]`` and a scalar weight ``w_i``. In a
step it splits both equally among itself and its current out-neighbours; every
node sums what it receives. The de-biased estimate ``z_i = x_i / w_i`` converges
to the average of the initial ``x`` on any strongly connected directed graph, even
when the graph changes between steps, because the split matrix ``P`` is
column-stochastic: total mass ``sum_i x_i`` and ``sum_i w_i`` are conserved
(no node needs to know its in-degree, unlike Metropolis-Hastings).

For learning we follow Stochastic Gradient Push (Assran et al., ICML 2019,
Algorithm 1): local training runs on ``z_i``, and its change is added to ``x_i``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

__all__ = [
    "PushSumShare",
    "PushSumState",
    "push_sum_estimate",
    "push_sum_matrix",
    "push_sum_share",
    "push_sum_step",
]


def push_sum_matrix(
    adj_out: torch.Tensor, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Column-stochastic split matrix of one push-sum step.

    Parameters
    ----------
    adj_out : torch.Tensor
        bool ``[n, n]``: ``adj_out[i, j]`` means ``i`` sends to ``j`` (need not be
        symmetric; the diagonal is ignored).
    dtype : torch.dtype

    Returns
    -------
    torch.Tensor
        ``P`` ``[n, n]`` with ``P[j, i] = 1 / (out_i + 1)`` for ``j`` in
        ``out(i) ∪ {i}``; each column sums to 1, so ``x <- P @ x`` conserves mass.
    """
    if adj_out.dim() != 2 or adj_out.shape[0] != adj_out.shape[1]:
        raise ValueError(f"adjacency must be [n, n], got {tuple(adj_out.shape)}")
    a = adj_out.to(torch.bool).clone()
    n = a.shape[0]
    a |= torch.eye(n, dtype=torch.bool)
    share = 1.0 / a.sum(dim=1).to(dtype)  # [n]: 1 / (out_i + 1)
    return torch.where(a, share[:, None], torch.zeros((), dtype=dtype)).T


@dataclass(frozen=True, eq=False)
class PushSumState:
    """Push-sum numerators ``x`` ``[n, d]`` and weights ``w`` ``[n]``."""

    x: torch.Tensor
    w: torch.Tensor

    def __post_init__(self) -> None:
        if self.x.dim() != 2 or self.w.shape != (self.x.shape[0],):
            raise ValueError(
                f"push-sum state needs x [n, d] and w [n], got "
                f"{tuple(self.x.shape)} and {tuple(self.w.shape)}"
            )

    @classmethod
    def start(cls, x: torch.Tensor) -> PushSumState:
        """Initial state: ``x`` as given, every weight 1."""
        return cls(x.clone(), torch.ones(x.shape[0], dtype=torch.float64))

    @property
    def estimate(self) -> torch.Tensor:
        """``z = x / w`` ``[n, d]``."""
        return push_sum_estimate(self.x, self.w)


def push_sum_step(p: torch.Tensor, state: PushSumState) -> PushSumState:
    """``x <- P x``, ``w <- P w`` for a column-stochastic ``P`` ``[n, n]``."""
    if p.shape != (state.x.shape[0], state.x.shape[0]):
        raise ValueError(f"P {tuple(p.shape)} does not match {state.x.shape[0]} nodes")
    return PushSumState(p.to(state.x.dtype) @ state.x, p.to(state.w.dtype) @ state.w)


def push_sum_estimate(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """De-biased estimate ``x / w`` (``[n, d] / [n] -> [n, d]``, ``x``'s dtype).

    Raises
    ------
    ValueError
        If a weight is not strictly positive (a node that lost all its mass
        cannot estimate anything).
    """
    if bool((w <= 0).any()):
        raise ValueError("push-sum weights must be > 0")
    return x / w.to(x.dtype)[:, None]


class PushSumShare(NamedTuple):
    """One share of a peer's push-sum mass: numerator ``x`` ``[d]`` and weight."""

    x: torch.Tensor
    w: float


def push_sum_share(x: torch.Tensor, w: float, out_degree: int) -> PushSumShare:
    """The share one peer keeps and sends to each of ``out_degree`` neighbours.

    Parameters
    ----------
    x : torch.Tensor
        The peer's numerator ``[d]``.
    w : float
        The peer's weight.
    out_degree : int
        Number of neighbours it sends to this step.

    Returns
    -------
    PushSumShare
        ``x / (k + 1)`` and ``w / (k + 1)``.
    """
    if out_degree < 0:
        raise ValueError(f"out_degree must be >= 0, got {out_degree}")
    k = out_degree + 1
    return PushSumShare(x / k, w / k)

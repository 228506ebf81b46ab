"""Mixing matrices for neighbourhood averaging over an undirected graph.

Every function takes the graph as a boolean adjacency matrix ``adj`` ``[n, n]``
(``adj[i, j]`` = an edge between ``i`` and ``j``; the diagonal is ignored) and
returns a weight matrix ``W`` ``[n, n]`` such that one gossip step over the stacked
models ``X`` ``[n, d]`` is ``X <- W @ X`` (row ``i`` holds the weights node ``i``
gives to itself and its neighbours). Entries outside ``N(i) ∪ {i}`` are zero, so
a node only ever uses models it can actually receive.

Dead or isolated nodes are rows/columns without edges: their row is ``e_i`` (they
keep their model), which is what a peer does when it hears from nobody.

The ``*_row`` variants compute one row from what a single peer knows (its own
degree or data size and its neighbours'), for the real peer process; a test checks
they equal the rows of the matrix forms. Two of them (:func:`metropolis_hastings_row`,
:func:`data_weighted_row`) rest on what each neighbour *declares* about itself in
its model header (degree, example count), which a compromised member may choose
freely: they serve only the legacy rules a configuration names explicitly. The
default rule, ClippedGossip (:mod:`fedplat.gossip.mixing.clipped`), uses none of
it.
"""

from __future__ import annotations

import torch

__all__ = [
    "check_adjacency",
    "data_weighted",
    "data_weighted_row",
    "metropolis_hastings",
    "metropolis_hastings_row",
    "mix",
    "mix_public",
    "mix_row",
    "uniform",
    "uniform_row",
]


def check_adjacency(adj: torch.Tensor, *, symmetric: bool = True) -> torch.Tensor:
    """Validate ``adj`` ``[n, n]`` and return it as bool without self-loops.

    Raises
    ------
    ValueError
        If ``adj`` is not square, or not symmetric when ``symmetric`` is set.
    """
    if adj.dim() != 2 or adj.shape[0] != adj.shape[1]:
        raise ValueError(f"adjacency must be square [n, n], got {tuple(adj.shape)}")
    a = adj.to(torch.bool).clone()
    a.fill_diagonal_(False)
    if symmetric and not bool((a == a.T).all()):
        raise ValueError("adjacency of an undirected graph must be symmetric")
    return a


def metropolis_hastings(
    adj: torch.Tensor, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Metropolis-Hastings weights (Xiao & Boyd 2004, "Fast linear iterations").

    ``W[i, j] = 1 / (1 + max(deg_i, deg_j))`` for each edge, ``W[i, i] = 1 -
    sum_j W[i, j]``. ``W`` is symmetric and doubly stochastic for any undirected
    graph, so repeated mixing converges to the plain average of all models of a
    connected component, while each node needs only its neighbours' degrees.

    Parameters
    ----------
    adj : torch.Tensor
        bool ``[n, n]``, symmetric.
    dtype : torch.dtype
        Float dtype of the result (float64 keeps row sums at 1 to ~1e-16).

    Returns
    -------
    torch.Tensor
        ``[n, n]`` weights, symmetric, rows and columns summing to 1.
    """
    a = check_adjacency(adj)
    deg = a.sum(dim=1).to(dtype)
    w = 1.0 / (1.0 + torch.maximum(deg[:, None], deg[None, :]))
    w = torch.where(a, w, torch.zeros((), dtype=dtype))
    w.diagonal().copy_(1.0 - w.sum(dim=1))
    return w


def data_weighted(
    adj: torch.Tensor, sizes: torch.Tensor, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """DecAvg weights: neighbourhood average weighted by local data size.

    ``W[i, j] = |D_j| / sum_{k in N(i) ∪ {i}} |D_k|`` for ``j in N(i) ∪ {i}``
    (Palmieri et al. 2023; the FedAvg weighting applied to a neighbourhood, not
    checked against the paper's text). Rows sum to 1; columns in general do not, so
    the network average drifts toward well-connected data-rich nodes, as in the
    paper. A node with no data (a relay) gets weight 0 in every average it takes
    part in, but still forwards knowledge: its own row averages its neighbours. A
    row whose whole neighbourhood holds no data keeps its own model.

    Parameters
    ----------
    adj : torch.Tensor
        bool ``[n, n]``, symmetric.
    sizes : torch.Tensor
        ``[n]`` non-negative local dataset sizes.
    dtype : torch.dtype

    Returns
    -------
    torch.Tensor
        ``[n, n]`` row-stochastic weights.
    """
    a = check_adjacency(adj)
    s = sizes.to(dtype).reshape(-1)
    if s.numel() != a.shape[0]:
        raise ValueError(f"sizes has {s.numel()} entries for {a.shape[0]} nodes")
    if bool((s < 0).any()) or not bool(torch.isfinite(s).all()):
        raise ValueError("sizes must be finite and non-negative")
    hood = a | torch.eye(a.shape[0], dtype=torch.bool)
    w = torch.where(hood, s[None, :].expand_as(hood), torch.zeros((), dtype=dtype))
    total = w.sum(dim=1, keepdim=True)
    empty = total.squeeze(1) == 0
    w = w / torch.where(total == 0, torch.ones((), dtype=dtype), total)
    w[empty] = 0.0
    idx = torch.nonzero(empty).reshape(-1)
    w[idx, idx] = 1.0
    return w


def uniform(adj: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Plain neighbourhood average: ``W[i, j] = 1 / (deg_i + 1)`` on ``N(i) ∪ {i}``.

    The data-weighted rule with equal sizes. Row-stochastic only.
    """
    return data_weighted(adj, torch.ones(adj.shape[0], dtype=dtype), dtype)


def mix(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """One gossip step ``W @ X``: ``[n, n] x [n, d] -> [n, d]`` in ``x``'s dtype.

    The product runs in ``w``'s (usually float64) precision only for the small
    ``[n, n]`` factor; ``x`` stays float32 so the cost is one ``n x n x d`` GEMM.
    """
    if w.dim() != 2 or x.dim() != 2 or w.shape[1] != x.shape[0]:
        raise ValueError(
            f"cannot mix weights {tuple(w.shape)} with models {tuple(x.shape)}"
        )
    return w.to(x.dtype) @ x


def mix_public(w: torch.Tensor, x: torch.Tensor, public: torch.Tensor) -> torch.Tensor:
    """One linear gossip step when nodes send public copies of their models.

    ``x_i <- W_ii x_i + sum_{j != i} W_ij public_j``: each node's own share stays
    exact, its neighbours' shares are what they sent (``[n, n], [n, d], [n, d]
    -> [n, d]``). With ``public = x`` this is :func:`mix`.
    """
    diag = torch.diagonal(w).to(x.dtype)[:, None]
    return mix(w, public) + diag * (x - public)


# ----------------------------------------------------------------- one peer's row


def metropolis_hastings_row(
    own_degree: int, neighbour_degrees: torch.Tensor
) -> torch.Tensor:
    """Row ``i`` of :func:`metropolis_hastings` from local knowledge.

    The neighbours' degrees are what they declared: a liar can only lower its
    own weight (its degree is counted at least as this peer's own), but its
    model enters unclipped, so one compromised member moves this peer as far
    as it likes. Used by the ``metropolis_hastings`` rule only when a
    configuration names it.

    Parameters
    ----------
    own_degree : int
        Current number of live neighbours of this peer.
    neighbour_degrees : torch.Tensor
        ``[k]`` degrees the ``k`` neighbours declared with their models.

    Returns
    -------
    torch.Tensor
        float64 ``[k + 1]``: entry 0 is the weight of the peer's own model.
    """
    nd = neighbour_degrees.to(torch.float64).reshape(-1)
    if bool((nd < 1).any()):
        raise ValueError("a neighbour's degree must be >= 1 (it has this peer)")
    w = 1.0 / (1.0 + torch.clamp(nd, min=float(own_degree)))
    return torch.cat([(1.0 - w.sum()).reshape(1), w])


def data_weighted_row(own_size: float, neighbour_sizes: torch.Tensor) -> torch.Tensor:
    """Row ``i`` of :func:`data_weighted`: ``[k + 1]`` weights, entry 0 for self.

    ``neighbour_sizes`` are the example counts the neighbours declared: one that
    declares 10^12 examples takes nearly all of the row. Used by the ``decavg``
    rule only when a configuration names it.
    """
    s = torch.cat(
        [
            torch.tensor([float(own_size)], dtype=torch.float64),
            neighbour_sizes.to(torch.float64).reshape(-1),
        ]
    )
    if bool((s < 0).any()) or not bool(torch.isfinite(s).all()):
        raise ValueError("sizes must be finite and non-negative")
    total = s.sum()
    if total == 0:
        out = torch.zeros_like(s)
        out[0] = 1.0
        return out
    return s / total


def uniform_row(k: int) -> torch.Tensor:
    """``[k + 1]`` equal weights ``1 / (k + 1)``."""
    return torch.full((k + 1,), 1.0 / (k + 1), dtype=torch.float64)


def check_row_inputs(
    weights: torch.Tensor, own: torch.Tensor, neighbours: torch.Tensor
) -> int:
    """The number ``k`` of neighbour models, after checking that ``neighbours``
    is ``[k, d]`` for ``own`` ``[d]`` and ``weights`` holds ``k + 1`` values
    (ValueError otherwise): what every row-wise mixing rule takes."""
    if neighbours.dim() != 2 or neighbours.shape[1:] != own.shape:
        raise ValueError(
            f"neighbours {tuple(neighbours.shape)} do not match own model "
            f"{tuple(own.shape)}"
        )
    k = int(neighbours.shape[0])
    if weights.numel() != k + 1:
        raise ValueError(f"{weights.numel()} weights for 1 + {k} models")
    return k


def mix_row(
    weights: torch.Tensor, own: torch.Tensor, neighbours: torch.Tensor
) -> torch.Tensor:
    """``weights[0] * own + sum_j weights[j + 1] * neighbours[j]``.

    Parameters
    ----------
    weights : torch.Tensor
        ``[k + 1]``.
    own : torch.Tensor
        ``[d]``.
    neighbours : torch.Tensor
        ``[k, d]`` (``k`` may be 0).

    Returns
    -------
    torch.Tensor
        ``[d]`` in ``own``'s dtype.
    """
    check_row_inputs(weights, own, neighbours)
    stacked = torch.cat([own.reshape(1, -1), neighbours], dim=0)
    return weights.to(own.dtype) @ stacked

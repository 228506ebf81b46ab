"""ClippedGossip: mixing that bounds what any one neighbour can do to a model.

He, Karimireddy & Jaggi, "Byzantine-robust decentralized learning via
ClippedGossip" (arXiv 2202.01545). Node ``i`` moves toward each neighbour by at
most a radius ``tau_i``::

    x_i <- x_i + sum_{j in N(i)} W_ij * CLIP(x_j - x_i, tau_i)
    CLIP(z, tau) = z * min(1, tau / ||z||)

so a neighbour that sends an arbitrarily large (or cleverly opposite) model
moves ``x_i`` by at most ``W_ij * tau_i``, whatever it sent. With ``tau_i = inf``
this is plain gossip ``x_i <- sum_j W_ij x_j`` (rows of ``W`` sum to 1).

**Radius rule** (:func:`clipping_radius`). The paper's analysis sets ``tau_i``
from the honest neighbours' expected distances and the Byzantine weight
``delta_i``, which a node cannot observe; its experiments use an adaptive radius.
We follow the authors' reference code (github.com/epfml/
byzantine-robust-decentralized-optimizer, ``codes/aggregator.py``,
``SelfCenteredClipping`` with ``tau=None``): ``tau_i`` is the second largest of
the distances ``||x_j - x_i||`` to the neighbours, i.e. the single farthest
neighbour is clipped down to the distance of the next one, and with one
neighbour nothing is clipped. We generalise it to a fraction ``delta`` of the
neighbours' mixing weight: order the neighbours by decreasing distance, mark the
longest prefix whose weight is at most ``delta`` of the row's neighbour weight,
and take ``tau_i`` as the largest distance *not* marked. With ``k`` equally
weighted neighbours this clips the ``floor(delta * k)`` farthest ones; with
``delta * k = 1`` it is exactly the reference code's rule. The generalisation is
ours, not the paper's text.

Why it bounds a Byzantine neighbour: if the neighbours that lie hold at most
``delta`` of the neighbour weight, ``tau_i`` is at most the largest *honest*
distance (the first unmarked neighbour is honest, or comes after an honest one
in the order, or the liars alone would form a longer markable prefix), so each
liar moves ``x_i`` by at most ``W_ij`` times an honest distance. With one
neighbour, or more liars than ``delta`` of the weight, there is no honest
reference and nothing is guaranteed: the paper's tolerance also needs a small
``delta_i`` on every node.

**Weights** (:func:`own_degree_row`). ``W_ij = 1 / (deg_i + 1)`` for each
neighbour, ``deg_i`` being the number of live neighbours node ``i`` counts
itself. Metropolis-Hastings (``1 / (1 + max(deg_i, deg_j))``, doubly
stochastic, as in the reference code) needs ``deg_j``, which a real peer only
learns from the neighbour's own header, and DecAvg needs its declared example
count: a member that lies about either steers its weight. ``1 / (deg_i + 1)``
needs nothing from the neighbour; it is the largest weight Metropolis-Hastings
could give any neighbour, the same for all of them, so a liar gets exactly what
an honest neighbour gets. The price is that ``W`` is only row-stochastic: the
network's consensus weighs node ``j`` by about ``deg_j + 1`` instead of
equally, which on IID data changes nothing and on skewed data leans toward
well-connected nodes (as DecAvg leans toward data-rich ones).

The default ``delta = 1/2`` clips the farthest half of the neighbour weight: on a
ring (two neighbours) one Byzantine neighbour is clipped to the honest one's
distance, which is the case the live benchmark measures. The radius is chosen
afresh every round from the models of that round only, so it needs no history.
"""

from __future__ import annotations

import torch

from fedplat.gossip.mixing.weights import check_row_inputs

__all__ = [
    "DEFAULT_CLIP_FRACTION",
    "clip",
    "clipped_gossip",
    "clipped_gossip_row",
    "clipping_radius",
    "own_degree_row",
]

#: ``delta``: the share of a node's neighbour weight that may be clipped.
DEFAULT_CLIP_FRACTION = 0.5

#: Slack on the cumulative weight share, so that ``k`` equal float weights
#: summing to exactly ``delta`` count as within it.
_SHARE_TOLERANCE = 1e-9


def _check_fraction(fraction: float) -> float:
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"clip fraction must be in [0, 1), got {fraction}")
    return float(fraction)


def clip(
    z: torch.Tensor, tau: torch.Tensor, norms: torch.Tensor | None = None
) -> torch.Tensor:
    """``CLIP(z, tau) = z * min(1, tau / ||z||)`` row by row.

    Parameters
    ----------
    z : torch.Tensor
        ``[m, d]`` differences.
    tau : torch.Tensor
        ``[m]`` non-negative radii (``inf``: no clipping).
    norms : torch.Tensor, optional
        ``[m]`` float64 ``||z||`` if already computed.

    Returns
    -------
    torch.Tensor
        ``[m, d]`` in ``z``'s dtype, each row of norm at most its ``tau``. A row
        whose norm is not finite (a float32 difference that overflowed) becomes
        zero: its direction is lost, and only a model of magnitude ~1e38, which
        no honest peer holds, can produce it.
    """
    if norms is None:
        norms = torch.linalg.vector_norm(z, dim=1, dtype=torch.float64)
    t = tau.to(torch.float64)
    # min(1, tau / ||z||), written to give 1 for ||z|| = 0 and 0 for ||z|| = inf.
    scale = torch.where(norms <= t, torch.ones_like(norms), t / norms)
    scale = torch.where(torch.isfinite(norms), scale, torch.zeros_like(scale))
    out = z * scale.to(z.dtype)[:, None]
    return torch.where(torch.isfinite(norms)[:, None], out, torch.zeros_like(out))


def clipping_radius(
    dist: torch.Tensor,
    weights: torch.Tensor,
    fraction: float = DEFAULT_CLIP_FRACTION,
) -> torch.Tensor:
    """``tau_i`` for ``m`` nodes at once: the weighted rule of the module docstring.

    Parameters
    ----------
    dist : torch.Tensor
        ``[m, k]`` distances ``||x_j - x_i||`` (``inf`` allowed) of each node's
        neighbours, padded arbitrarily where ``weights`` is 0.
    weights : torch.Tensor
        ``[m, k]`` mixing weights ``W_ij > 0`` of those neighbours, 0 on padding.
    fraction : float
        ``delta`` in ``[0, 1)``.

    Returns
    -------
    torch.Tensor
        float64 ``[m]``: the largest distance left after the farthest neighbours
        holding at most ``delta`` of the row's neighbour weight are set aside;
        0 for a node without neighbours.

    Examples
    --------
    Two equal neighbours at distances 1 and 100: the farther one is clipped to 1.

    >>> clipping_radius(torch.tensor([[1.0, 100.0]]), torch.tensor([[0.25, 0.25]]))
    tensor([1.], dtype=torch.float64)
    """
    delta = _check_fraction(fraction)
    if dist.shape != weights.shape or dist.dim() != 2:
        raise ValueError(
            f"dist {tuple(dist.shape)} and weights {tuple(weights.shape)} "
            "must both be [m, k]"
        )
    if dist.shape[1] == 0:
        return torch.zeros(dist.shape[0], dtype=torch.float64)
    w = weights.to(torch.float64)
    if bool((w < 0).any()) or not bool(torch.isfinite(w).all()):
        raise ValueError("neighbour weights must be finite and non-negative")
    real = w > 0
    # Padding sorts last: -inf is below every real distance (including 0).
    d = torch.where(real, dist.to(torch.float64), -torch.inf)
    d_sorted, order = torch.sort(d, dim=1, descending=True, stable=True)
    total = w.sum(dim=1, keepdim=True)
    share = torch.cumsum(w.gather(1, order), dim=1) / total.clamp_min(1e-300)
    # The marked prefix: farthest neighbours whose cumulative share <= delta.
    # Shares only grow along a row, so counting them finds the prefix length;
    # the last real neighbour has share 1 > delta, so the count stays in range.
    within = (share <= delta + _SHARE_TOLERANCE) & real.gather(1, order)
    marked = within.sum(dim=1, keepdim=True)
    tau = d_sorted.gather(1, marked.clamp_max(d.shape[1] - 1)).squeeze(1)
    return torch.where(total.squeeze(1) > 0, tau, torch.zeros_like(tau))


def own_degree_row(own_degree: int, k: int) -> torch.Tensor:
    """``[k + 1]`` weights from this peer's own degree only: ``1 / (D + 1)`` each.

    ``D = max(own_degree, k)`` (the live neighbours this peer counts itself,
    at least the ``k`` whose models it mixes); entry 0, the peer's own model,
    takes the rest, so a neighbour whose model did not arrive leaves its share
    with the peer instead of handing it to the others. Nothing a neighbour says
    about itself (degree, example count) enters: see :func:`clipped_gossip`.
    """
    if k < 0 or own_degree < 0:
        raise ValueError(f"degrees must be >= 0, got own {own_degree}, k {k}")
    each = 1.0 / (max(own_degree, k) + 1)
    row = torch.full((k + 1,), each, dtype=torch.float64)
    row[0] = 1.0 - k * each
    return row


def clipped_gossip_row(
    weights: torch.Tensor,
    own: torch.Tensor,
    neighbours: torch.Tensor,
    fraction: float = DEFAULT_CLIP_FRACTION,
) -> torch.Tensor:
    """One peer's ClippedGossip step: ``own + sum_j w_j CLIP(nb_j - own, tau)``.

    Parameters
    ----------
    weights : torch.Tensor
        ``[k + 1]``; entry 0 (the peer's own weight) is implied by the others and
        not used, as in the paper's update.
    own : torch.Tensor
        ``[d]`` the peer's model (exact).
    neighbours : torch.Tensor
        ``[k, d]`` the models its neighbours sent (``k`` may be 0).
    fraction : float
        ``delta`` of :func:`clipping_radius`.

    Returns
    -------
    torch.Tensor
        ``[d]`` in ``own``'s dtype.
    """
    k = check_row_inputs(weights, own, neighbours)
    if k == 0:
        return own.clone()
    w = weights.reshape(-1)[1:].to(torch.float64)
    diff = neighbours - own.reshape(1, -1)
    norms = torch.linalg.vector_norm(diff, dim=1, dtype=torch.float64)
    tau = clipping_radius(norms.reshape(1, -1), w.reshape(1, -1), fraction)
    step = clip(diff, tau.expand(k), norms)
    return own + (w.to(own.dtype)[:, None] * step).sum(dim=0)


def clipped_gossip(
    w: torch.Tensor,
    x: torch.Tensor,
    public: torch.Tensor | None = None,
    fraction: float = DEFAULT_CLIP_FRACTION,
) -> torch.Tensor:
    """ClippedGossip for every node at once: ``[n, n], [n, d] -> [n, d]``.

    Row ``i`` equals :func:`clipped_gossip_row` with ``w[i]``'s neighbour entries
    (a test checks it). Work and memory are one ``[E, d]`` difference per
    directed edge ``E``, not ``[n, n, d]``.

    Parameters
    ----------
    w : torch.Tensor
        ``[n, n]`` mixing weights; off-diagonal entries > 0 are the edges, the
        diagonal is implied (``1 - sum_j W_ij``) and not used.
    x : torch.Tensor
        ``[n, d]`` each node's own, exact model.
    public : torch.Tensor, optional
        ``[n, d]`` what each node sends its neighbours (default ``x``; a
        compressed link's public copy, or a Byzantine node's message).
    fraction : float
        ``delta`` of :func:`clipping_radius`.

    Returns
    -------
    torch.Tensor
        ``[n, d]`` in ``x``'s dtype.
    """
    n = x.shape[0]
    if w.shape != (n, n) or x.dim() != 2:
        raise ValueError(f"cannot mix weights {tuple(w.shape)} with {tuple(x.shape)}")
    pub = x if public is None else public
    if pub.shape != x.shape:
        raise ValueError(f"public {tuple(pub.shape)} does not match {tuple(x.shape)}")
    off = w.to(torch.float64).clone()
    off.fill_diagonal_(0.0)
    rows, cols = torch.nonzero(off > 0, as_tuple=True)  # row-major: rows sorted
    if rows.numel() == 0:
        return x.clone()
    we = off[rows, cols]  # [E]
    diff = pub[cols] - x[rows]  # [E, d]
    norms = torch.linalg.vector_norm(diff, dim=1, dtype=torch.float64)
    # Pad each node's edges into a row of an [n, k_max] table for the radius.
    deg = torch.bincount(rows, minlength=n)
    pos = torch.arange(rows.numel()) - (torch.cumsum(deg, 0) - deg)[rows]
    k_max = int(deg.max())
    dist_t = torch.zeros(n, k_max, dtype=torch.float64)
    w_t = torch.zeros(n, k_max, dtype=torch.float64)
    dist_t[rows, pos] = norms
    w_t[rows, pos] = we
    tau = clipping_radius(dist_t, w_t, fraction)  # [n]
    step = clip(diff, tau[rows], norms) * we.to(x.dtype)[:, None]
    return x.index_add(0, rows, step)

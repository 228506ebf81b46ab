"""NoLoCo-style gossip: each round every node averages with one random peer.

NoLoCo (Kolehmainen et al. 2025, arXiv 2506.10911) replaces DiLoCo's all-reduce
by averaging inside random groups of ``n = 2`` replicas drawn from a permutation
of all ranks (``sparse_optimizer_c.py`` in jkolehm/noloco). On a communication
graph a node can only pair with a neighbour, so :func:`random_pairs` draws a
random matching of the graph's edges: with a complete graph this is the paper's
random pairing.

Two update rules over the pairs:

* :func:`pair_average` - plain pairwise averaging (randomised gossip, Boyd et al.
  2006);
* :func:`noloco_outer_step` - the paper's outer step with momentum and the
  consensus pull ``alpha * (mean(phi) - phi_i)``, in the reference code's form.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = [
    "NoLoCoState",
    "noloco_local_step",
    "noloco_outer_step",
    "pair_average",
    "random_pairs",
]


def random_pairs(adj: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A random matching of an undirected graph.

    Nodes are visited in a random order; an unmatched node picks a uniformly
    random unmatched neighbour, if it has one. Every edge can be chosen, and a
    node is in at most one pair per round, as with NoLoCo's groups of two.

    Parameters
    ----------
    adj : torch.Tensor
        bool ``[n, n]``, symmetric.
    generator : torch.Generator
        Source of randomness (seed it per round to repeat a run).

    Returns
    -------
    torch.Tensor
        int64 ``[n]``: ``partner[i]`` is ``i``'s peer this round, or ``i`` itself
        if it stays alone; ``partner[partner[i]] == i``.
    """
    a = adj.to(torch.bool).clone()
    n = a.shape[0]
    a.fill_diagonal_(False)
    partner = torch.arange(n)
    free = torch.ones(n, dtype=torch.bool)
    for i in torch.randperm(n, generator=generator).tolist():
        if not free[i]:
            continue
        cand = torch.nonzero(a[i] & free).reshape(-1)
        if cand.numel() == 0:
            continue
        j = int(cand[torch.randint(cand.numel(), (1,), generator=generator)])
        partner[i], partner[j] = j, i
        free[i] = free[j] = False
    return partner


def pair_average(partner: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``x_i <- (x_i + x_partner(i)) / 2`` for every node (``[n, d] -> [n, d]``).

    Unpaired nodes (``partner[i] == i``) keep their model. The sum of all models
    is conserved, so the network average does not move.
    """
    return 0.5 * (x + x[partner])


class NoLoCoState(NamedTuple):
    """Per-node NoLoCo variables, each ``[n, d]``.

    Attributes
    ----------
    theta : torch.Tensor
        Inner (trained) weights.
    phi : torch.Tensor
        Outer weights at the last synchronisation.
    momentum : torch.Tensor
        Outer momentum ``m``.
    """

    theta: torch.Tensor
    phi: torch.Tensor
    momentum: torch.Tensor


def noloco_outer_step(
    state: NoLoCoState,
    partner: torch.Tensor,
    alpha: float = 0.7,
    beta: float = 0.5,
    *,
    consensus: bool = True,
) -> NoLoCoState:
    """NoLoCo's outer step inside each pair (arXiv 2506.10911).

    With ``G`` the group of ``i`` (itself and its partner, or itself alone)::

        g_bar   = mean_{j in G} (theta_j - phi_j)
        phi_bar = mean_{j in G} phi_j
        m_i     <- beta * m_i + alpha * g_bar + alpha * (phi_bar - phi_i)
        phi_i   <- phi_i + m_i
        theta_i <- phi_i

    which is the reference code's ``m += (beta - 1) m + lr * mean_g + lr *
    (mean - p_old)`` (``outer_step`` in ``sparse_optimizer_c.py``). The defaults
    are the paper's ``alpha = 0.7``, ``beta = 0.5``. ``consensus=False`` drops the
    ``phi_bar - phi_i`` term: the ablation that lets replicas drift apart.

    Parameters
    ----------
    state : NoLoCoState
        ``theta``, ``phi``, ``momentum``, each ``[n, d]``.
    partner : torch.Tensor
        int64 ``[n]`` from :func:`random_pairs`.
    alpha, beta : float
        Outer learning rate and momentum.
    consensus : bool
        Keep the consensus pull (the paper's modified Nesterov term).

    Returns
    -------
    NoLoCoState
        New tensors; ``theta == phi`` afterwards.
    """
    theta, phi, m = state
    delta = theta - phi
    g_bar = 0.5 * (delta + delta[partner])
    phi_bar = 0.5 * (phi + phi[partner])
    m_new = beta * m + alpha * g_bar
    if consensus:
        m_new = m_new + alpha * (phi_bar - phi)
    phi_new = phi + m_new
    return NoLoCoState(phi_new.clone(), phi_new, m_new)


def noloco_local_step(
    theta_mean: torch.Tensor,
    phi: torch.Tensor,
    momentum: torch.Tensor,
    alpha: float = 0.7,
    beta: float = 0.5,
) -> NoLoCoState:
    """One node's NoLoCo outer step from the mean of its group's inner weights.

    Since ``g_bar = mean(theta) - phi_bar``, the two terms of the update add up to
    ``alpha * (mean(theta) - phi_i)``: a peer needs only its partner's current
    ``theta``, not its ``phi`` (what a real peer pulls).

    Parameters
    ----------
    theta_mean : torch.Tensor
        ``[d]`` mean of ``theta`` over the group (the peer and its partner).
    phi, momentum : torch.Tensor
        ``[d]`` the peer's outer weights and momentum.
    alpha, beta : float

    Returns
    -------
    NoLoCoState
        The peer's new ``theta == phi`` and ``momentum``, each ``[d]``.
    """
    m = beta * momentum + alpha * (theta_mean - phi)
    new_phi = phi + m
    return NoLoCoState(new_phi.clone(), new_phi, m)

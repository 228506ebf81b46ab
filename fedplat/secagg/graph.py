"""Who masks with whom: the complete graph (SecAgg) or a random Harary graph (SecAgg+).

SecAgg (Bonawitz et al., CCS 2017) masks every pair of clients: each client
expands ``n - 1`` pairwise masks and holds shares from all others. SecAgg+ (Bell,
Bonawitz, Gascon, Lepoint & Raykova, CCS 2020) replaces the complete graph by a
sparse ``k``-regular one with ``k = O(log n)``: a Harary graph ``H(n, k)``
(nodes on a ring, each linked to the ``k/2`` nearest on either side) whose node
labels are randomly permuted, so no one can choose their neighbours.

The graph is a pure function of the round's roster (the sorted ids that
advertised keys) and a public seed, so every client rebuilds it and checks that
the server sent it exactly its neighbours' keys. The permutation is a
Fisher-Yates shuffle driven by AES-CTR output (not NumPy's generators, whose
streams may change between NumPy versions and would split the parties' graphs).

:func:`harary_parameters` picks ``k`` and the Shamir threshold ``t`` from the
three conditions of Bell et al.'s semi-honest analysis, each bounded by a union
bound: (1) after removing the corrupt and dropped clients the graph stays
connected (else the server learns partial sums of the components), which for a
Harary graph needs ``k/2`` consecutive removed nodes in two places of the ring;
(2) no client has ``t`` or more corrupt neighbours (they could pool its shares);
(3) every client keeps at least ``t`` surviving neighbours (else its masks cannot
be removed). Neighbour counts are hypergeometric. Failure probabilities:
``2^-sigma`` for (1)+(2) (security), ``2^-eta`` for (3) (correctness), with
``sigma = 40`` and ``eta = 20`` by default (the values of Google's open-source
SecAgg+ parameter search).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedplat.secagg.crypto import MaskExpander
from fedplat.secagg.errors import SecAggError

__all__ = [
    "GraphParameters",
    "harary_parameters",
    "neighbours",
    "shuffle",
    "threshold_for",
]

_SMALL = 1e-12


def shuffle(items: Sequence[int], seed: bytes) -> list[int]:
    """A uniform random permutation of ``items``, a pure function of ``seed``."""
    n = len(items)
    out = list(items)
    if n < 2:
        return out
    key = hashlib.sha256(b"fedplat-secagg-graph" + seed).digest()
    # Two 64-bit draws per swap leave room for rejections (probability < 2^-40
    # per draw for n < 2^24); more are drawn if the buffer runs out.
    words = MaskExpander(4 * n).expand(key).view(np.uint64).copy()
    pos = 0
    for i in range(n - 1, 0, -1):
        bound = i + 1
        limit = (1 << 64) - ((1 << 64) % bound)
        while True:
            if pos == words.size:
                key = hashlib.sha256(key).digest()
                words = MaskExpander(4 * n).expand(key).view(np.uint64).copy()
                pos = 0
            r = int(words[pos])
            pos += 1
            if r < limit:
                break
        j = r % bound
        out[i], out[j] = out[j], out[i]
    return out


def neighbours(
    roster: Sequence[int], degree: int | None, seed: bytes
) -> dict[int, tuple[int, ...]]:
    """Each client's neighbours (sorted), excluding itself.

    Parameters
    ----------
    roster : sequence of int
        Distinct client ids (the clients that advertised keys).
    degree : int or None
        ``k`` (even) for a random Harary graph; ``None`` for the complete graph.
        A roster of at most ``k + 1`` clients is complete either way.
    seed : bytes
        The round's public graph seed.
    """
    ids = sorted(roster)
    if len(set(ids)) != len(ids):
        raise SecAggError("roster ids must be distinct")
    n = len(ids)
    if degree is None or n <= degree + 1:
        return {u: tuple(v for v in ids if v != u) for u in ids}
    if degree < 2 or degree % 2:
        raise SecAggError(f"Harary degree must be even and >= 2, got {degree}")
    ring = shuffle(ids, seed)
    half = degree // 2
    out = {}
    for p, u in enumerate(ring):
        near = {ring[(p + o) % n] for o in range(-half, half + 1) if o}
        out[u] = tuple(sorted(near))
    return out


@dataclass(frozen=True)
class GraphParameters:
    """``degree`` ``k`` and Shamir ``threshold`` ``t`` for a round of ``clients``."""

    clients: int
    degree: int
    threshold: int


def _log_comb(a: int, b: int) -> float:
    return math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(a - b + 1)


def _hypergeom(population: int, successes: int, draws: int) -> list[float]:
    """P(X = j), j = 0..draws, for draws without replacement."""
    out = []
    for j in range(draws + 1):
        if j > successes or draws - j > population - successes:
            out.append(0.0)
            continue
        out.append(
            math.exp(
                _log_comb(successes, j)
                + _log_comb(population - successes, draws - j)
                - _log_comb(population, draws)
            )
        )
    return out


def _disconnect_log_prob(n: int, k: int, bad: int) -> float:
    """Log union bound on a random ``H(n, k)`` losing connectivity when ``bad``
    uniformly placed nodes are removed: two disjoint runs of ``k/2`` removed
    nodes (``k`` specific nodes all bad) at one of fewer than ``n^2/2`` places."""
    if k > bad:
        return -math.inf
    pairs = math.log(n) + math.log(max(1, n - k - 1)) - math.log(2)
    return pairs + _log_comb(bad, k) - _log_comb(n, k)


def harary_parameters(
    clients: int,
    dropout_rate: float,
    corrupt_rate: float = 0.0,
    *,
    sigma: float = 40.0,
    eta: float = 20.0,
) -> GraphParameters:
    """The smallest even degree (and its threshold) meeting the three conditions.

    Parameters
    ----------
    clients : int
        ``n``, the round's participants.
    dropout_rate : float
        Largest fraction of clients expected to drop during the round.
    corrupt_rate : float
        Largest fraction of clients that may collude with the server.
    sigma, eta : float
        Security and correctness parameters (failure probabilities
        ``2^-sigma`` and ``2^-eta`` over the random graph).

    Returns
    -------
    GraphParameters
        With ``degree = clients - 1`` (complete graph) when no sparser graph works.
    """
    corrupt, dropped, sec, cor = _counts(
        clients, dropout_rate, corrupt_rate, sigma, eta
    )
    for k in range(2, clients - 1, 2):
        bad = corrupt + dropped
        if _disconnect_log_prob(clients, k, bad) >= -(sigma + 1) * math.log(2):
            continue
        t = _threshold(clients, k, corrupt, dropped, sec, cor)
        if t is not None:
            return GraphParameters(clients, k, t)
    return GraphParameters(
        clients,
        clients - 1,
        threshold_for(
            clients, clients - 1, dropout_rate, corrupt_rate, sigma=sigma, eta=eta
        ),
    )


def threshold_for(
    clients: int,
    degree: int,
    dropout_rate: float,
    corrupt_rate: float = 0.0,
    *,
    sigma: float = 40.0,
    eta: float = 20.0,
) -> int:
    """The smallest threshold meeting conditions (2) and (3) for a given degree
    (``degree = clients - 1`` is SecAgg's complete graph)."""
    if not 2 <= degree < clients:
        raise SecAggError(f"degree must be in [2, {clients}), got {degree}")
    corrupt, dropped, sec, cor = _counts(
        clients, dropout_rate, corrupt_rate, sigma, eta
    )
    t = _threshold(clients, degree, corrupt, dropped, sec, cor)
    if t is None:
        raise SecAggError(
            f"no threshold for {clients} clients of degree {degree} meets the "
            f"security (corrupt rate {corrupt_rate}) and dropout ({dropout_rate}) "
            "targets"
        )
    return t


def _counts(
    clients: int, dropout_rate: float, corrupt_rate: float, sigma: float, eta: float
) -> tuple[int, int, float, float]:
    if clients < 3:
        raise SecAggError(f"need at least 3 clients, got {clients}")
    if not 0.0 <= dropout_rate < 1.0 or not 0.0 <= corrupt_rate < 1.0:
        raise SecAggError("dropout_rate and corrupt_rate must be in [0, 1)")
    if dropout_rate + corrupt_rate > 0.9:
        raise SecAggError("dropout_rate + corrupt_rate must be <= 0.9")
    corrupt = math.floor(corrupt_rate * clients + _SMALL)
    dropped = math.floor(dropout_rate * clients + _SMALL)
    # Per event and per client (union bound over the n clients).
    return corrupt, dropped, 2.0 ** -(sigma + 1) / clients, 2.0**-eta / clients


def _threshold(
    n: int, k: int, corrupt: int, dropped: int, sec: float, cor: float
) -> int | None:
    # Neighbours are k of the n - 1 others.
    p_corrupt = _hypergeom(n - 1, corrupt, k)
    p_alive = _hypergeom(n - 1, n - 1 - dropped, k)
    # t_lo: P(corrupt neighbours >= t_lo) <= sec.
    tail, t_lo = 0.0, k + 1
    for j in range(k, -1, -1):
        tail += p_corrupt[j]
        if tail > sec:
            break
        t_lo = j
    # t_hi: P(surviving neighbours < t_hi) <= cor.
    head, t_hi = 0.0, 0
    for j in range(k + 1):
        if head + p_alive[j] > cor:
            t_hi = j
            break
        head += p_alive[j]
    else:
        t_hi = k
    t = max(t_lo, 2)
    return t if t <= t_hi else None

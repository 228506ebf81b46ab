"""Shapley values of one round: exact enumeration and GTG-Shapley.

The game: players are the round's ``n`` clients, ``U(S)`` the utility of the model
aggregated from ``S``'s updates (:mod:`fedplat.contribution.utility`). The Shapley
value of client ``i`` is the mean, over all orderings of the clients, of
``U(P_i ∪ {i}) - U(P_i)`` with ``P_i`` the clients before ``i``.

:func:`exact_shapley` enumerates all ``2**n`` coalitions (the reference for tests;
small ``n`` only). :func:`gtg_shapley` is GTG-Shapley (Liu, Chen, Yu et al., "GTG-
Shapley: Efficient and Accurate Participant Contribution Evaluation in Federated
Learning", ACM TIST 2022) as used by Buyukates, He et al. (arXiv 2302.14031),
cross-checked against FedML's ``gtg_shapley_value.py`` (docs/contribution.md lists
where fedplat differs):

* between-round truncation: ``|U(N) - U(∅)| <= 0.01`` gives every client 0;
* within-round truncation: once a permutation's running value ``v`` is within
  0.001 of ``U(N)``, the remaining marginal contributions are 0 (no evaluation);
* guided permutations: each client in turn goes first, the others in random
  order, so every client's "alone" contribution is measured equally often;
* stop when at least 30 permutations are done (and every client led at least
  once) and the last 10 running means moved by less than 5 % (relative).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

#: ``U(S)`` for a set of client indices.
SubsetValue = Callable[[Sequence[int]], float]

#: Exact enumeration costs ``2**n`` utility evaluations; refuse beyond this.
EXACT_MAX_CLIENTS = 16


@dataclass(frozen=True)
class GTGSettings:
    """Hyper-parameters of :func:`gtg_shapley` (defaults: the module docstring's).

    Attributes
    ----------
    round_truncation
        Between-round truncation: all values are 0 when
        ``|U(N) - U(∅)| <= round_truncation``.
    within_truncation
        Within-round truncation: marginal contributions are 0 once the running
        value is closer than this to ``U(N)``.
    min_permutations
        Do not stop before this many permutations (raised to ``n`` so every
        client leads at least once).
    window
        Number of most recent running means the convergence test looks at.
    tolerance
        Converged when each of the last ``window`` running means differs from
        the latest by at most this fraction (L1 norm over clients).
    max_permutations
        Hard cap on permutations (cost bound when the test never passes).
    """

    round_truncation: float = 0.01
    within_truncation: float = 0.001
    min_permutations: int = 30
    window: int = 10
    tolerance: float = 0.05
    max_permutations: int = 500

    def __post_init__(self) -> None:
        if not (self.round_truncation >= 0 and self.within_truncation >= 0):
            raise ValueError("truncation thresholds must be >= 0")
        if self.min_permutations < 1 or self.window < 1:
            raise ValueError("min_permutations and window must be >= 1")
        if not self.tolerance > 0:
            raise ValueError("tolerance must be > 0")
        if self.max_permutations < self.min_permutations:
            raise ValueError("max_permutations must be >= min_permutations")


@dataclass(frozen=True)
class GTGResult:
    """Outcome of :func:`gtg_shapley`.

    Attributes
    ----------
    values
        ``[n]`` float64 estimated Shapley values.
    permutations
        Permutations sampled (0 when the round was truncated).
    round_truncated
        The between-round truncation applied: every value is 0.
    converged
        The convergence test passed (``False``: stopped at ``max_permutations``).
    """

    values: torch.Tensor
    permutations: int
    round_truncated: bool
    converged: bool


def exact_shapley(value: SubsetValue, n: int) -> torch.Tensor:
    """Shapley values by enumerating every coalition.

    ``phi_i = sum_{S ⊆ N \\ {i}} |S|! (n - |S| - 1)! / n! * (U(S ∪ {i}) - U(S))``.

    Parameters
    ----------
    value
        ``U(S)``; called once for each of the ``2**n`` subsets (``U(∅)`` too).
    n
        Number of clients, ``1 <= n <= 16``.

    Returns
    -------
    torch.Tensor
        ``[n]`` float64 Shapley values; they sum to ``U(N) - U(∅)``.
    """
    if not 1 <= n <= EXACT_MAX_CLIENTS:
        raise ValueError(f"exact Shapley needs 1 <= n <= {EXACT_MAX_CLIENTS}, got {n}")
    size = 1 << n
    members = [[i for i in range(n) if mask >> i & 1] for mask in range(size)]
    v = np.array([value(m) for m in members], dtype=np.float64)
    card = np.array([len(m) for m in members])
    # Coalition weight |S|! (n-|S|-1)! / n! for |S| = 0 .. n-1.
    w = np.array(
        [math.factorial(s) * math.factorial(n - s - 1) for s in range(n)],
        dtype=np.float64,
    ) / math.factorial(n)
    masks = np.arange(size)
    phi = np.zeros(n, dtype=np.float64)
    for i in range(n):
        without = masks[(masks >> i & 1) == 0]
        phi[i] = float(np.sum(w[card[without]] * (v[without | (1 << i)] - v[without])))
    return torch.from_numpy(phi)


def gtg_shapley(
    value: SubsetValue,
    n: int,
    full_value: float,
    settings: GTGSettings | None = None,
    rng: np.random.Generator | None = None,
) -> GTGResult:
    """GTG-Shapley estimate of one round's Shapley values.

    Parameters
    ----------
    value
        ``U(S)``; ``value([])`` must be ``U(∅)``, the global model's utility before
        the round. Callers should memoise it (subsets recur across permutations).
    n
        Number of clients, ``>= 1``.
    full_value
        ``U(N)``, the utility after aggregating every update of the round.
    settings
        Truncation and convergence rules (defaults: the module docstring's).
    rng
        Source of the random tails of the guided permutations.

    Returns
    -------
    GTGResult
        ``values`` ``[n]``; each permutation's marginals telescope, so they sum to
        ``U(N) - U(∅)`` up to ``within_truncation``.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    s = settings or GTGSettings()
    gen = rng if rng is not None else np.random.default_rng()
    empty_value = float(value([]))
    # Step 2: a round that barely moved the model is not worth valuing.
    if abs(full_value - empty_value) <= s.round_truncation:
        return GTGResult(torch.zeros(n, dtype=torch.float64), 0, True, True)

    total = np.zeros(n, dtype=np.float64)
    means: list[np.ndarray] = []
    min_perms = max(s.min_permutations, n)
    converged = False
    done = 0
    while done < s.max_permutations and not converged:
        # Step 4: one cycle of guided permutations, each client leading once.
        for lead in range(n):
            rest = gen.permutation([i for i in range(n) if i != lead])
            order = [lead, *(int(i) for i in rest)]
            total += _marginals(value, order, empty_value, full_value, s)
            done += 1
            means.append(total / done)
            if done >= s.max_permutations:
                break
        # Step 5, checked after whole cycles so leads stay balanced.
        converged = done >= min_perms and _stable(means, s.window, s.tolerance)
    return GTGResult(torch.from_numpy(total / done), done, False, converged)


def _marginals(
    value: SubsetValue,
    order: list[int],
    empty_value: float,
    full_value: float,
    s: GTGSettings,
) -> np.ndarray:
    out = np.zeros(len(order), dtype=np.float64)
    prev = empty_value
    for j, client in enumerate(order):
        # Step 3: within-round truncation; the rest of the permutation adds ~0.
        if abs(full_value - prev) < s.within_truncation:
            break
        cur = full_value if j == len(order) - 1 else float(value(order[: j + 1]))
        out[client] = cur - prev
        prev = cur
    return out


def _stable(means: list[np.ndarray], window: int, tolerance: float) -> bool:
    """Whether the last ``window`` running means agree with the latest.

    FedML averages ``|m_t,i - m_last,i| / |m_last,i|`` over clients; a client
    whose value is ~0 (a free-rider) makes that ratio explode and the test never
    passes. The L1 ratio used here, ``||m_t - m_last||_1 / ||m_last||_1``, is the
    same average weighted by ``|m_last,i|``.
    """
    if len(means) < window:
        return False
    last = means[-1]
    scale = float(np.abs(last).sum())
    if scale == 0.0:
        return all(not np.any(m) for m in means[-window:])
    return all(
        float(np.abs(m - last).sum()) <= tolerance * scale for m in means[-window:]
    )

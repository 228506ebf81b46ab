"""The coalition utility ``U(S)`` of one round, evaluated lazily and cached.

As in GTG-Shapley (Liu et al., ACM TIST 2022): the utility of a subset ``S`` of
the round's clients is the held-out score (accuracy by default) of the global model
obtained by aggregating only ``S``'s updates; ``U(∅)`` is that of the global model
before the round. Every scorer of a round shares one :class:`SubsetUtility`, so a
coalition evaluated by GTG-Shapley is free for leave-one-out (and vice versa), and
the evaluation count is the round's cost.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from fedplat.metrics import LOWER_IS_BETTER

#: ``(updates [k, d], weights [k] | None) -> new global weights [d]``.
AggregateFn = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]
#: ``global weights [d] -> utility`` (e.g. held-out accuracy in ``[0, 1]``).
UtilityFn = Callable[[torch.Tensor], float]


class UtilityError(RuntimeError):
    """The aggregate or utility callable failed or returned a non-finite value."""


class SubsetUtility:
    """``U(S)`` over the rows of one round's update stack, memoised by subset.

    Parameters
    ----------
    updates
        ``[n, d]`` decoded client updates, row ``i`` = client ``i``.
    weights
        ``[n]`` non-negative aggregation weights (e.g. example counts), or
        ``None``. A subset gets its own rows' weights; the aggregate function
        renormalises them.
    aggregate_fn
        Returns the global weights ``[d]`` after aggregating a subset. It must not
        mutate server state (optimizer moments, aggregator state).
    utility
        Utility of global weights ``[d]``.
    empty_value
        ``U(∅)``, the utility of the global model before the round.

    Attributes
    ----------
    evaluations
        Number of calls to ``utility`` so far (cache misses).
    seconds
        Wall time spent in ``aggregate_fn`` and ``utility``.
    full_global
        The global weights ``[d]`` aggregated from every update, once ``U(N)``
        was evaluated here (not when it was given with :meth:`remember`).
    """

    def __init__(
        self,
        updates: torch.Tensor,
        weights: torch.Tensor | None,
        aggregate_fn: AggregateFn,
        utility: UtilityFn,
        empty_value: float,
    ) -> None:
        if updates.dim() != 2:
            raise ValueError(f"updates must be [n, d], got {list(updates.shape)}")
        self.n = int(updates.shape[0])
        if weights is not None and weights.shape != (self.n,):
            raise ValueError(f"weights must be [{self.n}], got {list(weights.shape)}")
        self._updates = updates
        self._weights = weights
        self._aggregate_fn = aggregate_fn
        self._utility = utility
        self._cache: dict[tuple[int, ...], float] = {(): _finite(empty_value, "U(∅)")}
        self.evaluations = 0
        self.seconds = 0.0
        self.full_global: torch.Tensor | None = None

    @property
    def empty_value(self) -> float:
        """``U(∅)``."""
        return self._cache[()]

    def remember(self, subset: Iterable[int], value: float) -> None:
        """Seed the cache (e.g. with ``U(N)`` the caller already evaluated)."""
        self._cache[self._key(subset)] = _finite(value, "utility")

    def __call__(self, subset: Iterable[int]) -> float:
        """``U(S)`` for the clients (row indices) in ``subset``."""
        key = self._key(subset)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        index = torch.tensor(key, dtype=torch.long)
        t0 = time.perf_counter()
        try:
            w = None if self._weights is None else self._weights[index]
            new_global = self._aggregate_fn(self._updates[index], w)
            value = self._utility(new_global)
        except Exception as exc:  # any user callable: report, never guess
            raise UtilityError(f"utility of subset {list(key)} failed: {exc}") from exc
        finally:
            self.seconds += time.perf_counter() - t0
        self.evaluations += 1
        if len(key) == self.n:
            self.full_global = new_global
        value = _finite(value, f"utility of subset {list(key)}")
        self._cache[key] = value
        return value

    def _key(self, subset: Iterable[int]) -> tuple[int, ...]:
        key = tuple(sorted({int(i) for i in subset}))
        if key and (key[0] < 0 or key[-1] >= self.n):
            raise ValueError(f"subset {list(key)} out of range for {self.n} clients")
        return key


def _finite(value: float, what: str) -> float:
    out = float(value)
    if not math.isfinite(out):
        raise UtilityError(f"{what} is not finite: {out}")
    return out


def make_utility_from_metric(
    evaluate: Callable[[torch.Tensor], Any], metric: str = "accuracy"
) -> UtilityFn:
    """Adapt an evaluator to a utility function: the named value of its result.

    ``evaluate(weights)`` returns an object with ``value(name) -> float`` (the
    coordinator's ``Evaluator`` does). Values where lower is better
    (:data:`fedplat.metrics.LOWER_IS_BETTER`: loss, MAE, ...) are negated, so a
    larger utility is always a better model. NaN becomes an error.
    """
    sign = -1.0 if metric in LOWER_IS_BETTER else 1.0

    def utility(weights: torch.Tensor) -> float:
        value = float(evaluate(weights).value(metric))
        if math.isnan(value):
            raise UtilityError(f"utility {metric!r} is NaN (empty held-out set?)")
        return sign * value

    return utility

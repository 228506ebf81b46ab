"""Explicit registry of contribution scorers.

A scorer maps one round's :class:`RoundGame` to a score per client. Scorers that
need the coalition utility (``uses_utility``) only run on rounds where the
accountant evaluates it (``contribution.every``); the others run every round.

Built in:

``gtg_shapley``
    GTG-Shapley (:func:`fedplat.contribution.shapley.gtg_shapley`), the default
    primary score (Buyukates, He et al., arXiv 2302.14031).
``exact_shapley``
    Exact Shapley by enumeration (``2**n`` evaluations; small rounds only).
``leave_one_out``
    ``U(N) - U(N \\ {i})`` (``n`` evaluations).
``cosine``
    Cosine of each update to the round's robust aggregate (no evaluations).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from fedplat.contribution.loo import leave_one_out
from fedplat.contribution.shapley import GTGSettings, exact_shapley, gtg_shapley
from fedplat.contribution.similarity import cosine_to_reference
from fedplat.contribution.utility import SubsetUtility
from fedplat.registry import Registry


@dataclass(frozen=True)
class RoundGame:
    """Everything a scorer may use about one round.

    Attributes
    ----------
    updates
        ``[n, d]`` decoded updates (row ``i`` = client ``i``).
    reference
        ``[d]`` robust aggregate (or coordinate median) of the round.
    value
        ``U(S)``, or ``None`` on rounds where utilities are not evaluated.
    full_value
        ``U(N)``, or ``None`` with ``value``.
    gtg
        GTG-Shapley settings.
    rng
        Randomness for sampling scorers (seeded per run and round).
    """

    updates: torch.Tensor
    reference: torch.Tensor
    value: SubsetUtility | None
    full_value: float | None
    gtg: GTGSettings = field(default_factory=GTGSettings)
    rng: np.random.Generator = field(default_factory=np.random.default_rng)

    @property
    def n(self) -> int:
        return int(self.updates.shape[0])

    def utility(self) -> tuple[SubsetUtility, float]:
        """``(U, U(N))``; raises if this round has no utility."""
        if self.value is None or self.full_value is None:
            raise ValueError("this round has no utility evaluations")
        return self.value, self.full_value


@dataclass(frozen=True)
class ScorerOutput:
    """Scores ``values [n]`` (float64) and scalar facts about the computation."""

    values: torch.Tensor
    info: dict[str, float] = field(default_factory=dict)


Scorer = Callable[[RoundGame], ScorerOutput]


@dataclass(frozen=True)
class ScorerSpec:
    """A registered scorer: the callable and whether it needs utilities."""

    fn: Scorer
    uses_utility: bool

    def __call__(self, game: RoundGame) -> ScorerOutput:
        return self.fn(game)


_SCORERS: Registry[ScorerOutput] = Registry("scorer", ValueError)


def register_scorer(name: str, fn: Scorer, *, uses_utility: bool) -> None:
    """Add a scorer under ``name``; registering a name twice is an error."""
    _SCORERS.register(name, ScorerSpec(fn, uses_utility))


def available_scorers() -> list[str]:
    """Registered scorer names."""
    return _SCORERS.available()


def get_scorer(name: str) -> ScorerSpec:
    """The scorer registered as ``name``; an unknown name lists the valid ones."""
    spec = _SCORERS.get(name)
    assert isinstance(spec, ScorerSpec)
    return spec


def _gtg(game: RoundGame) -> ScorerOutput:
    value, full = game.utility()
    res = gtg_shapley(value, game.n, full, game.gtg, game.rng)
    return ScorerOutput(
        res.values,
        {
            "permutations": float(res.permutations),
            "round_truncated": float(res.round_truncated),
            "converged": float(res.converged),
        },
    )


def _exact(game: RoundGame) -> ScorerOutput:
    value, _ = game.utility()
    return ScorerOutput(exact_shapley(value, game.n))


def _loo(game: RoundGame) -> ScorerOutput:
    value, full = game.utility()
    return ScorerOutput(leave_one_out(value, game.n, full))


def _cosine(game: RoundGame) -> ScorerOutput:
    return ScorerOutput(cosine_to_reference(game.updates, game.reference))


register_scorer("gtg_shapley", _gtg, uses_utility=True)
register_scorer("exact_shapley", _exact, uses_utility=True)
register_scorer("leave_one_out", _loo, uses_utility=True)
register_scorer("cosine", _cosine, uses_utility=False)

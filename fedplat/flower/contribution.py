"""Optional contribution scores of a round's clients inside the Flower strategy.

The scorers are fedplat's (:mod:`fedplat.contribution`): GTG-Shapley (Liu et al.,
ACM TIST 2022), leave-one-out and exact Shapley value coalitions with a utility
``U(S)``; cosine compares each update with the round's robust aggregate and
needs no utility. As in fedplat's coordinator, the model a coalition ``S``
would have produced is the global model plus the (weighted) FedAvg of ``S``'s
updates, and ``U(∅)`` is the utility of the global model before the round.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from flwr.app import ArrayRecord

from fedplat.aggregators import FedAvg
from fedplat.contribution import GTGSettings, SubsetUtility, UtilityError
from fedplat.contribution.scorers import RoundGame, get_scorer

__all__ = ["ContributionScoring", "RoundScores"]

log = logging.getLogger("fedplat.flower")


@dataclass(frozen=True)
class RoundScores:
    """Scores ``[n]`` (float64) per scorer name, and what they cost."""

    values: dict[str, torch.Tensor]
    evaluations: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class ContributionScoring:
    """Which scorers run each round, and the utility they value coalitions by.

    Parameters
    ----------
    utility : callable
        ``ArrayRecord -> float``: the utility of a global model, e.g. its
        accuracy on the server's validation data. Required by every scorer
        but ``cosine``.
    scorers : tuple of str
        Registered scorer names (``gtg_shapley``, ``leave_one_out``,
        ``exact_shapley``, ``cosine``).
    gtg : GTGSettings
        GTG-Shapley's truncation and convergence settings.
    seed : int
        Seeds GTG-Shapley's permutations (per round).
    """

    utility: Callable[[ArrayRecord], float] | None = None
    scorers: tuple[str, ...] = ("gtg_shapley",)
    gtg: GTGSettings = field(default_factory=GTGSettings)
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.scorers:
            raise ValueError("contribution scoring needs at least one scorer")
        specs = [get_scorer(name) for name in self.scorers]  # unknown: ValueError
        if self.utility is None and any(s.uses_utility for s in specs):
            raise ValueError(
                f"scorers {list(self.scorers)} need a utility function "
                "(ArrayRecord -> float)"
            )

    def score(
        self,
        server_round: int,
        updates: torch.Tensor,
        weights: torch.Tensor | None,
        global_vec: torch.Tensor,
        aggregate: torch.Tensor,
        to_arrays: Callable[[torch.Tensor], ArrayRecord],
    ) -> RoundScores | None:
        """Scores of the ``n`` rows of ``updates`` ``[n, d]``; ``None`` (logged)
        when the utility function fails."""
        value: SubsetUtility | None = None
        full: float | None = None
        try:
            if any(get_scorer(name).uses_utility for name in self.scorers):
                value = self._coalitions(updates, weights, global_vec, to_arrays)
                full = value(range(updates.shape[0]))
            game = RoundGame(
                updates=updates,
                reference=aggregate,
                value=value,
                full_value=full,
                gtg=self.gtg,
                rng=np.random.default_rng([self.seed, server_round]),
            )
            values = {name: get_scorer(name)(game).values for name in self.scorers}
        except UtilityError as exc:
            log.warning("round %d: no contribution scores: %s", server_round, exc)
            return None
        if value is None:
            return RoundScores(values)
        return RoundScores(values, value.evaluations, value.seconds)

    def _coalitions(
        self,
        updates: torch.Tensor,
        weights: torch.Tensor | None,
        global_vec: torch.Tensor,
        to_arrays: Callable[[torch.Tensor], ArrayRecord],
    ) -> SubsetUtility:
        utility = self.utility
        assert utility is not None  # checked in __post_init__
        mean = FedAvg()

        def coalition_model(u: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
            return global_vec + mean(u, w).aggregate.to(torch.float32)

        def utility_of(vec: torch.Tensor) -> float:
            return float(utility(to_arrays(vec)))

        try:
            empty = utility_of(global_vec)
        except Exception as exc:  # a user callable: report, never guess
            raise UtilityError(f"utility of the global model failed: {exc}") from exc
        return SubsetUtility(updates, weights, coalition_model, utility_of, empty)

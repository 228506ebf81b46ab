"""Valuing one round: its inputs checked, the coalition utility and the scorers.

Every utility-based scorer of a round shares one cached coalition utility
(:class:`~fedplat.contribution.utility.SubsetUtility`); its setup and the scorer
loop live here. A failing evaluator or scorer never stops the round: the failure
is reported in ``errors`` and the round goes on with what did run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedplat.aggregators.coordinatewise import coordinate_median
from fedplat.contribution.config import ContributionSection
from fedplat.contribution.results import ContributionError
from fedplat.contribution.scorers import RoundGame, get_scorer
from fedplat.contribution.shapley import GTGSettings
from fedplat.contribution.utility import AggregateFn, SubsetUtility, UtilityFn

log = logging.getLogger("fedplat.contribution")


@dataclass(frozen=True)
class Coalitions:
    """The round's coalition utility, or why there is none.

    Attributes
    ----------
    value
        ``U(S)`` (cached), or ``None`` when the round is not valued or the
        evaluator failed.
    full_value
        ``U(N)`` with ``value``.
    setup_evaluations, setup_seconds
        The evaluation of ``U(∅)`` when it had to be computed here.
    errors
        The evaluator's failure, if any.
    """

    value: SubsetUtility | None = None
    full_value: float | None = None
    setup_evaluations: int = 0
    setup_seconds: float = 0.0
    errors: tuple[str, ...] = ()

    @property
    def evaluations(self) -> int:
        """Utility evaluations so far (call after the scorers ran)."""
        used = 0 if self.value is None else self.value.evaluations
        return self.setup_evaluations + used

    @property
    def seconds(self) -> float:
        used = 0.0 if self.value is None else self.value.seconds
        return self.setup_seconds + used

    def reusable(self, round_number: int) -> tuple[int, torch.Tensor, float] | None:
        """``(round, global [d] aggregated from every update, U(N))``: the next
        round's ``U(∅)`` if the coordinator's new global is that same model."""
        value, full = self.value, self.full_value
        if value is None or value.full_global is None or full is None:
            return None
        return round_number, value.full_global, full


def coalition_utility(
    cfg: ContributionSection,
    round_number: int,
    updates: torch.Tensor,
    weights: torch.Tensor | None,
    global_before: torch.Tensor,
    aggregate_fn: AggregateFn,
    utility: UtilityFn,
    empty: float | None,
    full: float | None,
) -> Coalitions:
    """The round's ``U(S)`` over ``updates [n, d]`` with ``U(∅)`` = ``empty``
    (evaluated on ``global_before [d]`` when ``None``) and ``U(N)`` = ``full``
    (evaluated when ``None``); none on rounds ``cfg`` does not value (only
    rounds 1, 1 + every, ... are, and only if a scorer uses utilities)."""
    valued = cfg.uses_utility and (round_number - 1) % cfg.every == 0
    if not valued or updates.shape[0] == 0:
        return Coalitions()
    evals, seconds = 0, 0.0
    try:
        if empty is None:
            t0 = time.perf_counter()
            empty = float(utility(global_before))
            evals, seconds = 1, time.perf_counter() - t0
        value = SubsetUtility(updates, weights, aggregate_fn, utility, empty)
        everyone = range(int(updates.shape[0]))
        if full is not None:
            value.remember(everyone, full)
        return Coalitions(value, value(everyone), evals, seconds)
    except Exception as exc:  # the caller's evaluator: never crash
        log.warning("round %d: no contribution valuation: %s", round_number, exc)
        return Coalitions(None, None, evals, seconds, (f"utility: {exc}",))


@dataclass(frozen=True)
class Scoring:
    """The scorers' output of one round.

    Attributes
    ----------
    scores
        Scorer name -> ``[n]`` float64 scores (only scorers that ran and
        returned finite values of the right shape).
    permutations
        GTG-Shapley permutations sampled.
    truncated
        GTG-Shapley's between-round truncation zeroed the round.
    errors
        Scorers skipped or failed, with the reason.
    """

    scores: dict[str, torch.Tensor]
    permutations: int = 0
    truncated: bool = False
    errors: tuple[str, ...] = ()


def round_game(
    cfg: ContributionSection,
    gtg: GTGSettings,
    round_number: int,
    attempt: int,
    updates: torch.Tensor,
    aggregate: torch.Tensor | None,
    coalitions: Coalitions,
) -> RoundGame:
    """The game the scorers see; the reference of ``cosine`` is the round's
    robust ``aggregate [d]``, else the coordinate median of ``updates`` (for an
    even ``n`` the mean of the two middle values, as the median rule)."""
    d = int(updates.shape[1])
    reference = (
        aggregate.to(updates.dtype)
        if aggregate is not None and aggregate.shape == (d,)
        else coordinate_median(updates, track=False).aggregate
    )
    return RoundGame(
        updates=updates,
        reference=reference,
        value=coalitions.value,
        full_value=coalitions.full_value,
        gtg=gtg,
        # Seeded per run, round and attempt: a retried round samples anew.
        rng=np.random.default_rng([cfg.seed, round_number, attempt]),
    )


def run_scorers(
    cfg: ContributionSection, game: RoundGame, round_number: int
) -> Scoring:
    """Run ``cfg.scorers`` on ``game``; utility-based ones only if it has utilities."""
    n = game.n
    scores: dict[str, torch.Tensor] = {}
    errors: list[str] = []
    permutations, truncated = 0, False
    for name in cfg.scorers:
        spec = get_scorer(name)
        if spec.uses_utility and game.value is None:
            continue
        if name == "exact_shapley" and n > cfg.exact_max_clients:
            errors.append(
                f"exact_shapley skipped: {n} clients > exact_max_clients "
                f"{cfg.exact_max_clients}"
            )
            continue
        try:
            out = spec.fn(game)
        except Exception as exc:  # a scorer must never crash the round
            log.exception("round %d: scorer %s failed", round_number, name)
            errors.append(f"{name}: {exc}")
            continue
        if out.values.shape != (n,) or not bool(torch.isfinite(out.values).all()):
            errors.append(f"{name}: returned invalid scores")
            continue
        scores[name] = out.values.double()
        if name == "gtg_shapley":
            permutations = int(out.info.get("permutations", 0))
            truncated = bool(out.info.get("round_truncated", 0))
    return Scoring(scores, permutations, truncated, tuple(errors))


def check_inputs(
    round_number: int,
    client_ids: Sequence[str],
    updates: torch.Tensor,
    weights: torch.Tensor | None,
    global_before: torch.Tensor,
) -> int:
    """``n``, the number of updates, once the inputs are consistent.

    Raises
    ------
    ContributionError
        On a bad round number, shape, dtype, duplicate id or non-finite update.
    """
    if isinstance(round_number, bool) or round_number < 1:
        raise ContributionError(f"round_number must be >= 1, got {round_number}")
    if updates.dim() != 2 or not torch.is_floating_point(updates):
        raise ContributionError(
            f"updates must be a float [n, d] tensor, got {updates.dtype} "
            f"{list(updates.shape)}"
        )
    n, d = int(updates.shape[0]), int(updates.shape[1])
    if len(client_ids) != n or len(set(client_ids)) != n:
        raise ContributionError(
            f"need {n} distinct client ids for {n} updates, got {len(client_ids)}"
        )
    if weights is not None and weights.shape != (n,):
        raise ContributionError(f"weights must be [{n}], got {list(weights.shape)}")
    if global_before.shape != (d,):
        raise ContributionError(
            f"global_before must be [{d}], got {list(global_before.shape)}"
        )
    if n and not bool(torch.isfinite(updates).all()):
        raise ContributionError("updates must be finite")
    return n


__all__ = [
    "Coalitions",
    "Scoring",
    "check_inputs",
    "coalition_utility",
    "round_game",
    "run_scorers",
]

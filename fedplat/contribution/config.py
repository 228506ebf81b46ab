"""The ``contribution`` section of a run file (validated, unknown keys rejected).

Example (YAML)::

    contribution:
      enabled: true
      scorers: [gtg_shapley, cosine]
      primary: gtg_shapley
      every: 1                 # value coalitions on rounds 1, 1 + every, ...
      budget: 1000.0
      utility: accuracy        # or loss, auc, f1, mae, ... (a value of the evaluation)
      utility_max_examples: 2000
      key_path: runs/ledger_ed25519.pem
      gtg: {round_truncation: 0.01, within_truncation: 0.001}
      flags: {outlier_z: 3.5, strikes: 2}
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from fedplat.config import Strict
from fedplat.contribution.flags import FlagThresholds
from fedplat.contribution.scorers import available_scorers, get_scorer
from fedplat.contribution.shapley import EXACT_MAX_CLIENTS, GTGSettings


class GTGSection(Strict):
    """GTG-Shapley rules (:mod:`fedplat.contribution.shapley`); defaults as there."""

    round_truncation: float = Field(default=0.01, ge=0, allow_inf_nan=False)
    within_truncation: float = Field(default=0.001, ge=0, allow_inf_nan=False)
    min_permutations: int = Field(default=30, ge=1)
    window: int = Field(default=10, ge=1)
    tolerance: float = Field(default=0.05, gt=0, allow_inf_nan=False)
    max_permutations: int = Field(default=500, ge=1)

    @model_validator(mode="after")
    def _check(self) -> GTGSection:
        if self.max_permutations < self.min_permutations:
            raise ValueError(
                f"max_permutations ({self.max_permutations}) must be >= "
                f"min_permutations ({self.min_permutations})"
            )
        return self

    def settings(self) -> GTGSettings:
        return GTGSettings(**self.model_dump())


class FlagSection(Strict):
    """Flag thresholds (see :mod:`fedplat.contribution.flags`)."""

    outlier_z: float = Field(default=3.5, gt=0, allow_inf_nan=False)
    min_clients: int = Field(default=5, ge=3)
    zero_norm: float = Field(default=1e-6, ge=0, allow_inf_nan=False)
    replay_cosine: float = Field(default=0.999, gt=0, le=1)
    random_sigmas: float = Field(default=4.0, ge=0, allow_inf_nan=False)
    # Rounds with free-rider flags after which a client's reward is forfeited.
    strikes: int = Field(default=2, ge=1)
    sketch_width: int = Field(default=1024, ge=16, le=1 << 16)

    def thresholds(self) -> FlagThresholds:
        return FlagThresholds(
            outlier_z=self.outlier_z,
            min_clients=self.min_clients,
            zero_norm=self.zero_norm,
            replay_cosine=self.replay_cosine,
            random_sigmas=self.random_sigmas,
        )


class ContributionSection(Strict):
    """Contribution accounting of a run.

    Attributes
    ----------
    enabled
        Off by default: valuation costs utility evaluations every round.
    scorers
        Which scorers run (``gtg_shapley``, ``exact_shapley``, ``leave_one_out``,
        ``cosine``); they share the round's cached coalition utilities.
    primary
        The scorer whose scores accumulate into rewards and score outliers.
    every
        Utility-based scorers run on rounds ``1, 1 + every, 1 + 2 every, ...``;
        the primary score of other rounds counts as 0. ``cosine`` runs always.
    budget
        Total reward split among clients (:mod:`fedplat.contribution.rewards`).
    seed
        Seeds GTG-Shapley's permutations (with the round number) and the flags'
        count sketch.
    exact_max_clients
        ``exact_shapley`` is skipped on rounds with more clients (``2**n`` cost).
    utility
        The evaluation value a coalition's utility is (``accuracy``, ``loss``, or
        any value of ``evaluation.metrics`` such as ``auc`` or ``mae``); values
        where lower is better (``loss``, ``mae``, ``mse``, ``rmse``) are negated so
        that a larger utility is always a better model.
    utility_max_examples
        Advice to the coordinator: evaluate coalitions on at most this many
        held-out examples (``None``: the whole held-out set).
    key_path
        The coordinator's Ed25519 PEM key (created 0600 if absent); ``None``
        keeps an unsigned (hash-chained only) ledger.
    """

    enabled: bool = False
    scorers: list[str] = Field(default_factory=lambda: ["gtg_shapley", "cosine"])
    primary: str = "gtg_shapley"
    every: int = Field(default=1, ge=1)
    budget: float = Field(default=1000.0, ge=0, allow_inf_nan=False)
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    exact_max_clients: int = Field(default=10, ge=1, le=EXACT_MAX_CLIENTS)
    utility: str = Field(default="accuracy", min_length=1)
    utility_max_examples: int | None = Field(default=2000, ge=1)
    key_path: str | None = "runs/ledger_ed25519.pem"
    gtg: GTGSection = GTGSection()
    flags: FlagSection = FlagSection()

    @field_validator("scorers")
    @classmethod
    def _known_scorers(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("name at least one scorer")
        if len(set(value)) != len(value):
            raise ValueError(f"duplicate scorers in {value}")
        for name in value:
            if name not in available_scorers():
                raise ValueError(
                    f"unknown scorer {name!r}; available: {available_scorers()}"
                )
        return value

    @model_validator(mode="after")
    def _check_primary(self) -> ContributionSection:
        if self.primary not in self.scorers:
            raise ValueError(
                f"primary scorer {self.primary!r} must be one of scorers {self.scorers}"
            )
        return self

    @property
    def uses_utility(self) -> bool:
        """Whether any configured scorer evaluates coalition utilities."""
        return any(get_scorer(s).uses_utility for s in self.scorers)

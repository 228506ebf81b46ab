"""A privacy budget: the accountant plus a ceiling the run may not pass.

The round driver asks :meth:`PrivacyBudget.preview` before it opens a round
(refusing a round whose release would pass the budget) and calls
:meth:`PrivacyBudget.spend` when the round releases its noised aggregate; the
returned :class:`RoundPrivacy` is what the recorder stores per round (epsilon spent
so far and this round's share of it). A round of Poisson sampling that happens to
sample nobody still releases a noised model and is still accounted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedplat.privacy.accountant import AccountantKind, PrivacyAccountant
from fedplat.privacy.clipping import PrivacyError

__all__ = ["PrivacyBudget", "PrivacyBudgetExceeded", "RoundPrivacy"]


class PrivacyBudgetExceeded(PrivacyError):
    """The next release would spend more than the configured epsilon."""


@dataclass(frozen=True)
class RoundPrivacy:
    """Privacy of the run after one more release.

    Attributes
    ----------
    epsilon : float
        Total epsilon spent (at ``delta``) including this release.
    epsilon_round : float
        Increase due to this release (epsilons do not add up exactly under RDP
        composition; this is the difference of the totals).
    delta : float
    noise_multiplier, sample_rate : float
        What the accountant was told for this release.
    """

    epsilon: float
    epsilon_round: float
    delta: float
    noise_multiplier: float
    sample_rate: float


class PrivacyBudget:
    """Tracks spending against ``(epsilon, delta)`` and refuses to pass it.

    Parameters
    ----------
    epsilon : float or None
        The run's budget (None: account without a ceiling).
    delta : float
    accountant : {"rdp", "prv"}
        Opacus accountant doing the composition.
    """

    def __init__(
        self, epsilon: float | None, delta: float, accountant: AccountantKind = "rdp"
    ) -> None:
        if epsilon is not None and not 0.0 < epsilon < math.inf:
            raise PrivacyError(f"epsilon budget must be finite and > 0, got {epsilon}")
        if not 0.0 < delta < 1.0:
            raise PrivacyError(f"delta must be in (0, 1), got {delta}")
        self.epsilon = None if epsilon is None else float(epsilon)
        self.delta = float(delta)
        self._acc = PrivacyAccountant(accountant)
        self._spent = 0.0  # cached: one accountant evaluation per release
        self._preview: tuple[tuple[int, float, float], RoundPrivacy] | None = None

    @property
    def spent(self) -> float:
        """Epsilon spent so far."""
        return self._spent

    @property
    def releases(self) -> int:
        return self._acc.steps

    def preview(self, *, noise_multiplier: float, sample_rate: float) -> RoundPrivacy:
        """What one more release would bring the total to (nothing recorded).

        The answer is cached until the next :meth:`spend`, so the round driver's
        question before a round and the spend at its close cost one accountant
        evaluation together."""
        key = (self.releases, float(noise_multiplier), float(sample_rate))
        if self._preview is not None and self._preview[0] == key:
            return self._preview[1]
        before = self.spent
        trial = PrivacyAccountant(self._acc.kind)
        trial.load_state_dict(self._acc.state_dict())
        trial.step(noise_multiplier=noise_multiplier, sample_rate=sample_rate)
        after = trial.get_epsilon(self.delta)
        out = RoundPrivacy(
            after, after - before, self.delta, noise_multiplier, sample_rate
        )
        self._preview = (key, out)
        return out

    def spend(self, *, noise_multiplier: float, sample_rate: float) -> RoundPrivacy:
        """Record one release; refuse (and record nothing) if it passes the budget.

        Raises
        ------
        PrivacyBudgetExceeded
            With the epsilon the release would have reached.
        """
        nxt = self.preview(noise_multiplier=noise_multiplier, sample_rate=sample_rate)
        if self.epsilon is not None and nxt.epsilon > self.epsilon:
            raise PrivacyBudgetExceeded(
                f"release {self.releases + 1} would spend epsilon {nxt.epsilon:.4g} "
                f"> budget {self.epsilon:g} (delta {self.delta:g})"
            )
        self._acc.step(noise_multiplier=noise_multiplier, sample_rate=sample_rate)
        self._spent = nxt.epsilon
        return nxt

    def state_dict(self) -> dict[str, Any]:
        """JSON-able: the budget and the accountant's history."""
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "accountant": self._acc.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict` taken with the same budget."""
        if set(state) != {"epsilon", "delta", "accountant"}:
            raise PrivacyError(f"bad budget state keys {sorted(state)}")
        eps = None if state["epsilon"] is None else float(state["epsilon"])
        if (eps, float(state["delta"])) != (
            self.epsilon,
            self.delta,
        ):
            raise PrivacyError(
                f"state is for budget ({state['epsilon']}, {state['delta']}), "
                f"this is ({self.epsilon}, {self.delta})"
            )
        self._acc.load_state_dict(state["accountant"])
        self._preview = None
        self._spent = self._acc.get_epsilon(self.delta)

"""Adaptive clipping (Andrew, Thakkar, McMahan & Ramaswamy, NeurIPS 2021).

Instead of a hand-tuned clip norm ``C``, track the ``gamma``-quantile of the
clients' update norms privately. Each round every participant reports the bit
``b_i = 1[||Delta_i|| <= C]``; the server releases the noised count and moves
``C`` geometrically towards the quantile (the paper's geometric update):

    b_bar = (sum_i (b_i - 1/2) + N(0, sigma_b^2)) / m + 1/2,
    C <- C * exp(-eta_C * (b_bar - gamma)),

with ``m = q N`` the expected number of clients. Centring the bits at 1/2 makes the
count's add/remove sensitivity 1/2 (as in TensorFlow Privacy's
``QuantileAdaptiveClipSumQuery``). The paper's defaults: ``gamma = 0.5``,
``eta_C = 0.2``, ``sigma_b = m / 20``.

**Noise correction.** Releasing the count costs privacy too. The two Gaussian
releases of a round (the sum with multiplier ``z_Delta``, the count with
``sigma_b`` at sensitivity 1/2) compose exactly like one Gaussian release with
multiplier ``z``, where ``z^-2 = z_Delta^-2 + (2 sigma_b)^-2``. So, for the ``z``
the accountant is calibrated with, the sum must use the larger
``z_Delta = (z^-2 - (2 sigma_b)^-2)^-1/2`` (:func:`adaptive_noise_multiplier`),
and the accountant keeps being told ``z``. Both releases are post-processed into
the next round's ``C``, which is public.

Under secure aggregation the bit rides along: a client appends ``b_i`` to its
vector and the server gets ``sum_i b_i`` (and the count) from the masked sum.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from fedplat.privacy.clipping import PrivacyError

__all__ = ["AdaptiveClip", "adaptive_noise_multiplier"]


def adaptive_noise_multiplier(noise_multiplier: float, count_noise_std: float) -> float:
    """``z_Delta``: the sum's multiplier so that sum + count together spend ``z``.

    Raises
    ------
    PrivacyError
        If ``2 sigma_b <= z``: the count alone would already spend the budget.
    """
    z, sb = noise_multiplier, count_noise_std
    if not 0.0 < z < math.inf or not 0.0 < sb < math.inf:
        raise PrivacyError(
            "noise multiplier and count noise std must be finite and > 0"
        )
    rest = z**-2 - (2.0 * sb) ** -2
    if rest <= 0.0:
        raise PrivacyError(
            f"count noise std {sb} is too small for noise multiplier {z}: "
            "need 2 * count_noise_std > noise_multiplier"
        )
    return rest**-0.5


class AdaptiveClip:
    """The clip norm ``C`` and its private geometric update.

    Parameters
    ----------
    initial_clip : float
        ``C_0``.
    expected_clients : float
        ``m = q N``.
    target_quantile : float
        ``gamma``: fraction of updates that should end up unclipped.
    learning_rate : float
        ``eta_C``: ``C`` changes by at most a factor ``exp(eta_C)`` per round.
    count_noise_std : float, optional
        ``sigma_b``; default ``m / 20`` (the paper's recommendation).
    """

    def __init__(
        self,
        *,
        initial_clip: float,
        expected_clients: float,
        target_quantile: float = 0.5,
        learning_rate: float = 0.2,
        count_noise_std: float | None = None,
    ) -> None:
        if not 0.0 < initial_clip < math.inf:
            raise PrivacyError(
                f"initial_clip must be finite and > 0, got {initial_clip}"
            )
        if not 0.0 < expected_clients < math.inf:
            raise PrivacyError("expected_clients must be finite and > 0")
        if not 0.0 <= target_quantile <= 1.0:
            raise PrivacyError(
                f"target_quantile must be in [0, 1], got {target_quantile}"
            )
        if not 0.0 < learning_rate < math.inf:
            raise PrivacyError(f"learning_rate must be > 0, got {learning_rate}")
        std = expected_clients / 20.0 if count_noise_std is None else count_noise_std
        if not 0.0 < std < math.inf:
            raise PrivacyError(f"count_noise_std must be finite and > 0, got {std}")
        self.clip = float(initial_clip)
        self.expected_clients = float(expected_clients)
        self.target_quantile = float(target_quantile)
        self.learning_rate = float(learning_rate)
        self.count_noise_std = float(std)

    def sum_noise_multiplier(self, noise_multiplier: float) -> float:
        """``z_Delta`` for the sum when the run is calibrated to ``z``."""
        return adaptive_noise_multiplier(noise_multiplier, self.count_noise_std)

    def unclipped_fraction(
        self, unclipped: int, count: int, *, generator: torch.Generator
    ) -> float:
        """``b_bar``: the noised fraction of clients whose norm was ``<= C``."""
        if not 0 <= unclipped <= count:
            raise PrivacyError(f"need 0 <= unclipped <= count, got {unclipped}/{count}")
        noise = float(torch.randn((), generator=generator, dtype=torch.float64))
        centred = (unclipped - 0.5 * count) + self.count_noise_std * noise
        return centred / self.expected_clients + 0.5

    def update(
        self, unclipped: int, count: int, *, generator: torch.Generator
    ) -> float:
        """Move ``C`` after a round in which ``unclipped`` of ``count`` clients had
        norm ``<= C``; returns the new clip norm."""
        b_bar = self.unclipped_fraction(unclipped, count, generator=generator)
        return self.step_towards(b_bar)

    def step_towards(self, b_bar: float) -> float:
        """The geometric update for an already released fraction ``b_bar``."""
        self.clip *= math.exp(-self.learning_rate * (b_bar - self.target_quantile))
        return self.clip

    def state_dict(self) -> dict[str, Any]:
        """JSON-able: the current clip and the (checked) hyperparameters."""
        return {
            "clip": self.clip,
            "expected_clients": self.expected_clients,
            "target_quantile": self.target_quantile,
            "learning_rate": self.learning_rate,
            "count_noise_std": self.count_noise_std,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict` of an identically configured object."""
        keys = set(self.state_dict())
        if set(state) != keys:
            raise PrivacyError(f"adaptive clip state keys must be {sorted(keys)}")
        for k in keys - {"clip"}:
            if float(state[k]) != getattr(self, k):
                raise PrivacyError(
                    f"state has {k}={state[k]}, this object {getattr(self, k)}"
                )
        clip = float(state["clip"])
        if not 0.0 < clip < math.inf:
            raise PrivacyError(f"bad clip {clip} in state")
        self.clip = clip

"""Central DP-FedAvg at the coordinator: one sampled Gaussian release per round.

McMahan, Ramage, Talwar & Zhang, "Learning Differentially Private Recurrent
Language Models", ICLR 2018, Algorithm 1, with Poisson sampling at rate ``q``
(:mod:`fedplat.privacy.sampling`, done by the round driver): every accepted
update is clipped to ``C`` at intake (:meth:`CentralDP.clip_row`; a sketch is
clipped in sketch space), the clipped updates are summed, Gaussian noise of std
``z_sum C`` is added **once to the sum** and the sum is divided by the fixed
``m = q N`` (:func:`fedplat.privacy.dp_fedavg_release`). With a sketch
compressor the sum is the sum of the clients' sketches and is de-sketched after
the noise (post-processing).

``N`` is the population the rate is defined on: ``privacy.population`` when set,
otherwise the clients enrolled (not revoked) when the run's first round opens.
It is fixed for the run (kept in the checkpoint). Clients enrolling later are
sampled with probability ``q`` like everyone else; clients that are offline or
revoked are sampled with probability 0. Both only lower a client's inclusion
probability, so accounting at ``q`` stays an upper bound; the estimator is then
biased by (clients that can take part) / ``N``, which the server learning rate
absorbs. ``N`` is treated as public, as in the paper.

Adaptive clipping (Andrew, Thakkar, McMahan & Ramaswamy, NeurIPS 2021): each
accepted update contributes the bit ``b_i = 1[||Delta_i|| <= C]`` (here the
coordinator measures it when it clips; under secure aggregation the client
appends it to its masked vector). The noised count of unclipped updates is a
second Gaussian release: the run is calibrated and accounted with ``z``, and the
sum is noised with the larger ``z_sum`` that makes both releases together spend
exactly ``z`` (:meth:`fedplat.privacy.AdaptiveClip.sum_noise_multiplier`). The
next round's ``C`` is post-processing of the released count.

A round's release (:meth:`CentralDP.release`) does not change any state; only
:meth:`CentralDP.spend`, called when the round is written, charges the budget and
moves ``C``, so a round that fails after aggregating leaves no trace.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from fedplat.server.config import ConfigError, RunConfig

from fedplat.compression.sketch import AMSSketch, CountSketch, GaussianSketch
from fedplat.compression.wire import SketchSpec, sketch_payload
from fedplat.privacy import (
    AdaptiveClip,
    PrivacyBudget,
    PrivacyError,
    RoundPrivacy,
    dp_fedavg_release,
    dp_sketch_release,
    expected_clients,
    make_noise_generator,
    noise_multiplier_for,
    secure_seed,
)

__all__ = [
    "METRIC_EPSILON",
    "METRIC_EPSILON_UNBOUNDED",
    "METRIC_MAX_EPSILON",
    "CentralDP",
    "Release",
    "SketchSum",
    "Sketcher",
    "epsilon_metrics",
]

Sketcher = CountSketch | GaussianSketch | AMSSketch

#: Metric written when the budget stops a run (read by the monitor).
METRIC_MAX_EPSILON = "privacy.max_epsilon"
#: Epsilon spent so far (at the run's delta), stored every round under DP.
METRIC_EPSILON = "privacy.epsilon"
#: Stored (value 1) instead of :data:`METRIC_EPSILON` in a round whose epsilon the
#: accountant reports as infinite: the privacy loss is unbounded from then on.
METRIC_EPSILON_UNBOUNDED = "privacy.epsilon_unbounded"


def epsilon_metrics(epsilon: float) -> dict[str, float]:
    """The store keeps finite numbers only: an epsilon the accountant cannot
    bound is recorded as a flag, never as a stand-in number."""
    if math.isfinite(epsilon):
        return {METRIC_EPSILON: epsilon}
    return {METRIC_EPSILON_UNBOUNDED: 1.0}


@dataclass(frozen=True)
class SketchSum:
    """What de-sketches a round's summed sketches: the run's sketcher, the
    round's spec (seed, round) and the model's ``d``."""

    sketcher: Sketcher
    spec: SketchSpec
    d: int


@dataclass(frozen=True)
class Release:
    """One round's noised aggregate, before it is accounted.

    Attributes
    ----------
    mean : torch.Tensor
        float32 ``[d]``: ``(sum + noise) / m`` (de-sketched when sketched).
    count : int
        Accepted updates in the sum.
    unclipped : int
        Of those, updates with norm ``<= clip_norm`` (not released itself).
    clip_norm : float
        ``C`` of this round.
    next_clip : float
        ``C`` of the next round (``clip_norm`` without adaptive clipping).
    unclipped_fraction : float or None
        The released (noised) fraction ``b_bar``; None without adaptive clipping.
    noise_std : float
        Std of the noise on each value of the sum.
    expected : float
        ``m = q N``.
    """

    mean: torch.Tensor
    count: int
    unclipped: int
    clip_norm: float
    next_clip: float
    unclipped_fraction: float | None
    noise_std: float
    expected: float


class CentralDP:
    """The coordinator's DP-FedAvg state: ``z``, ``N``, budget, clip norm."""

    def __init__(self, cfg: RunConfig) -> None:
        p, sel = cfg.privacy, cfg.selection
        assert p.mode == "central" and sel.rate is not None  # RunConfig checks
        self.rate = float(sel.rate)
        self.delta = p.delta
        try:
            self.z = p.noise_multiplier or noise_multiplier_for(
                float(p.epsilon or 0.0),
                p.delta,
                cfg.run.rounds,
                self.rate,
                accountant=p.accountant,
            )
            self.budget = PrivacyBudget(p.ceiling, p.delta, p.accountant)
        except PrivacyError as exc:
            raise ConfigError(f"privacy: {exc}") from exc
        self.clip = p.clip_norm
        self._adaptive_cfg = p.adaptive_clip
        self.adaptive: AdaptiveClip | None = None
        self.population: int | None = None
        self._noise = make_noise_generator(secure_seed())
        if p.population is not None:
            try:
                self.fix_population(p.population)
            except PrivacyError as exc:
                raise ConfigError(f"privacy: {exc}") from exc

    # ------------------------------------------------------------ population
    def fix_population(self, enrolled: int) -> None:
        """Fix ``N`` (once; later calls keep the first value).

        Raises
        ------
        PrivacyError
            When adaptive clipping's count noise is too small for ``z`` at this
            ``m`` (``2 sigma_b <= z``).
        """
        if self.population is not None:
            return
        n = max(1, int(enrolled))
        a = self._adaptive_cfg
        adaptive = None
        if a is not None:
            adaptive = AdaptiveClip(
                initial_clip=self.clip,
                expected_clients=expected_clients(n, self.rate),
                target_quantile=a.target_quantile,
                learning_rate=a.learning_rate,
                count_noise_std=a.count_noise_std,
            )
            adaptive.sum_noise_multiplier(self.z)  # raises when impossible
        self.population, self.adaptive = n, adaptive

    @property
    def expected(self) -> float:
        """``m = q N``."""
        assert self.population is not None, "fix_population() first"
        return expected_clients(self.population, self.rate)

    @property
    def sum_multiplier(self) -> float:
        """``z_sum``: ``z`` itself, or larger when the count is released too."""
        if self.adaptive is None:
            return self.z
        return self.adaptive.sum_noise_multiplier(self.z)

    # ------------------------------------------------------------ per round
    def clip_row(self, row: torch.Tensor, norm: float) -> bool:
        """Clip one accepted update ``[d]`` (or sketch ``[b]``) of L2 norm ``norm``
        to ``C`` in place; True when it was clipped (``b_i = 0``)."""
        if norm <= self.clip:
            return False
        row.mul_(self.clip / norm)
        return True

    def release(
        self,
        total: torch.Tensor,
        count: int,
        unclipped: int,
        sketch: SketchSum | None = None,
        rounding: float = 0.0,
    ) -> Release:
        """Noise the sum ``total`` and divide by ``m``: ``[d]`` updates
        (:func:`dp_fedavg_release`), or the sum of ``[b]`` sketches, noised in
        sketch space and de-sketched (:func:`dp_sketch_release`, each sketch was
        clipped: norm bound 1).

        ``rounding``: how far one contribution may have moved after clipping,
        in L2 (secure aggregation's fixed-point rounding,
        :meth:`fedplat.secagg.FixedPoint.sensitivity` minus its clip norm); the
        noise is calibrated to the sensitivity ``C + rounding``, what one
        client's contribution to the released sum can actually be."""
        if not (math.isfinite(rounding) and rounding >= 0.0):
            raise ValueError(f"rounding must be finite and >= 0, got {rounding}")
        m, z, g = self.expected, self.sum_multiplier, self._noise
        c = self.clip + rounding
        if sketch is None:
            rel = dp_fedavg_release(
                total, count, expected=m, clip_norm=c, noise_multiplier=z, generator=g
            )
        else:
            rel = dp_sketch_release(
                sketch_payload(sketch.spec, sketch.d, total.to(torch.float32)),
                count,
                sketcher=sketch.sketcher,
                expected=m,
                clip_norm=c,
                noise_multiplier=z,
                generator=g,
            )
        mean = rel.mean
        next_clip, b_bar = self.clip, None
        if self.adaptive is not None:
            b_bar = self.adaptive.unclipped_fraction(
                unclipped, count, generator=self._noise
            )
            # The geometric step on a copy: C moves only when the round is spent.
            next_clip = copy.copy(self.adaptive).step_towards(b_bar)
        return Release(
            mean.to(torch.float32),
            count,
            unclipped,
            self.clip,
            next_clip,
            b_bar,
            rel.noise_std,
            rel.denominator,
        )

    def preview(self) -> RoundPrivacy:
        """What the next release would bring epsilon to (nothing recorded)."""
        return self.budget.preview(noise_multiplier=self.z, sample_rate=self.rate)

    def spend(self, rel: Release) -> dict[str, float]:
        """Account the release (raises ``PrivacyBudgetExceeded``), move ``C``;
        returns the round's metrics."""
        spent = self.budget.spend(noise_multiplier=self.z, sample_rate=self.rate)
        self.clip = rel.next_clip
        if self.adaptive is not None:
            self.adaptive.clip = rel.next_clip
        m = {
            **epsilon_metrics(spent.epsilon),
            "privacy.delta": self.delta,
            "privacy.noise_multiplier": self.z,
            "privacy.sum_noise_multiplier": self.sum_multiplier,
            "privacy.sample_rate": self.rate,
            "privacy.expected_clients": rel.expected,
            "privacy.clip_norm": rel.clip_norm,
        }
        if math.isfinite(spent.epsilon_round):
            m["privacy.epsilon_round"] = spent.epsilon_round
        if self.budget.epsilon is not None:
            m[METRIC_MAX_EPSILON] = self.budget.epsilon
        if rel.unclipped_fraction is not None:
            m["privacy.unclipped_fraction"] = rel.unclipped_fraction
        return m

    # ------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """JSON-able: ``N``, ``C``, the budget's history (not the noise seed)."""
        return {
            "population": self.population,
            "clip": self.clip,
            "budget": self.budget.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if set(state) != {"population", "clip", "budget"}:
            raise PrivacyError(f"bad central DP state keys {sorted(state)}")
        if state["population"] is not None:
            self.population = None
            self.fix_population(int(state["population"]))
        clip = float(state["clip"])
        if not 0.0 < clip < math.inf:
            raise PrivacyError(f"bad clip norm {clip} in state")
        self.clip = clip
        if self.adaptive is not None:
            self.adaptive.clip = clip
        self.budget.load_state_dict(state["budget"])

"""The coordinator half of the uplink contract: compression and privacy of uploads.

:class:`UplinkPlan` is built once per run from the config. It tells clients (the
uplink part of every :class:`~fedplat.uplink.task.TaskConfig`) which compressor
and privacy layer to apply, hands the intake the run's decoder for non-dense
payloads (:mod:`fedplat.uplink.decode`), and for central DP clips rows and noises
the mean. It also owns the privacy accountant whose (epsilon, delta) is stored
every round.
"""

from __future__ import annotations

import json
import math

import torch

from fedplat.compression import (
    CompressionError,
    Payload,
    PayloadError,
    create_compressor,
    derive_seed,
)
from fedplat.privacy import (
    GaussianMechanism,
    PrivacyAccountant,
    PrivacyError,
    clip_rows,
    make_noise_generator,
    noise_multiplier_for,
    secure_seed,
)
from fedplat.server.config import ConfigError, RunConfig
from fedplat.uplink.task import (
    CompressionSpec,
    PrivacySpec,
    TaskConfig,
    TrainingSettings,
)
from fedplat.vectors import Layout

#: Epsilon spent so far (at the run's delta), stored every round under DP.
METRIC_EPSILON = "privacy.epsilon"
#: Stored (value 1) instead of :data:`METRIC_EPSILON` in a round whose epsilon the
#: accountant reports as infinite: the privacy loss is unbounded from then on.
METRIC_EPSILON_UNBOUNDED = "privacy.epsilon_unbounded"


class UplinkPlan:
    """Compression + privacy settings of a run, and the coordinator's side of them."""

    def __init__(self, cfg: RunConfig, layout: Layout) -> None:
        self.cfg = cfg
        self.layout = layout
        c = cfg.compression
        try:
            self.compressor = create_compressor(c.name, layout=layout, **c.params)
        except (CompressionError, ValueError) as exc:
            raise ConfigError(f"compression: {exc}") from exc
        # Sketch matrices are rebuilt from (seed, round): one seed per run, public.
        self.seed = derive_seed(cfg.run.seed, 0, "compression") % (1 << 63)
        p = cfg.privacy
        self.mode = p.mode
        self.sigma: float | None = None
        self.accountant: PrivacyAccountant | None = None
        if p.mode != "none":
            try:
                self.sigma = p.noise_multiplier or noise_multiplier_for(
                    float(p.epsilon or 0.0),
                    p.delta,
                    cfg.run.rounds,
                    self._planned_sample_rate(),
                    accountant=p.accountant,
                )
            except PrivacyError as exc:
                raise ConfigError(f"privacy: {exc}") from exc
            self.accountant = PrivacyAccountant(p.accountant)
            self.mechanism = GaussianMechanism(self.sigma, p.clip_norm)
            self._noise = make_noise_generator(secure_seed())

    def _planned_sample_rate(self) -> float:
        if self.mode == "local":
            return 1.0
        # Calibrate for the largest rate a round can have: selected / min_available.
        sel = self.cfg.selection
        return min(1.0, sel.clients_per_round / sel.min_available)

    def task_config(self, seed: int) -> TaskConfig:
        """The task config of one client's round (``seed``: its training seed)."""
        c, t = self.cfg.compression, self.cfg.client_training
        privacy = None
        if self.mode in ("local", "central"):
            assert self.sigma is not None
            privacy = PrivacySpec(self.mode, self.cfg.privacy.clip_norm, self.sigma)
        return TaskConfig(
            training=TrainingSettings(
                epochs=t.epochs,
                batch_size=t.batch_size,
                lr=t.lr,
                optimizer=t.optimizer,
                momentum=t.momentum,
                max_steps=t.max_steps,
            ),
            compression=CompressionSpec(c.name, json.loads(json.dumps(c.params))),
            compression_seed=self.seed,
            privacy=privacy,
            seed=seed,
        )

    def decode(self, payload: Payload) -> torch.Tensor:
        """A non-dense payload -> ``[d]`` float32 (the run's compressor)."""
        try:
            return self.compressor.decode(payload).to(torch.float32)
        except CompressionError as exc:
            raise PayloadError(str(exc)) from exc

    # -------------------------------------------------------------- central DP
    def clip_row(self, row: torch.Tensor, norm: float) -> bool:
        """Enforce the clip norm on one accepted row in place (central DP: the
        client should have clipped, but the noise is calibrated to this bound).
        Returns whether it was clipped."""
        if self.mode != "central":
            return False
        c = self.cfg.privacy.clip_norm
        if norm <= c:
            return False
        row.mul_(c / norm)
        return True

    def clip_for_central(self, stack: torch.Tensor) -> tuple[torch.Tensor, list[bool]]:
        """Enforce the clip norm on every row ``[n, d]`` (clients may not have)."""
        if self.mode != "central":
            return stack, [False] * stack.shape[0]
        res = clip_rows(stack, self.cfg.privacy.clip_norm)
        clipped = (res.norms > self.cfg.privacy.clip_norm).tolist()
        return res.rows, [bool(x) for x in clipped]

    def noise_mean(self, mean: torch.Tensor, num_clients: int) -> torch.Tensor:
        if self.mode != "central":
            return mean
        return self.mechanism.noise_for_mean(mean, num_clients, generator=self._noise)

    def account(self, num_selected: int, num_live: int) -> dict[str, float]:
        """Record this round's release; return the metrics to store
        (:data:`METRIC_EPSILON`, or :data:`METRIC_EPSILON_UNBOUNDED` when the
        accountant's epsilon is infinite)."""
        if self.accountant is None or self.sigma is None:
            return {}
        rate = (
            1.0 if self.mode == "local" else min(1.0, num_selected / max(1, num_live))
        )
        self.accountant.step(noise_multiplier=self.sigma, sample_rate=rate)
        eps = self.accountant.get_epsilon(self.cfg.privacy.delta)
        out = {
            "privacy.delta": self.cfg.privacy.delta,
            "privacy.noise_multiplier": self.sigma,
            "privacy.sample_rate": rate,
        }
        # The store keeps finite numbers only: an epsilon the accountant cannot
        # bound is recorded as a flag, never as a stand-in number.
        if math.isfinite(eps):
            out[METRIC_EPSILON] = eps
        else:
            out[METRIC_EPSILON_UNBOUNDED] = 1.0
        return out

    def state(self) -> dict[str, str]:
        if self.accountant is None:
            return {}
        return {"privacy_accountant": json.dumps(self.accountant.state_dict())}

    def load_state(self, meta: dict[str, str]) -> None:
        if self.accountant is not None and "privacy_accountant" in meta:
            self.accountant.load_state_dict(json.loads(meta["privacy_accountant"]))

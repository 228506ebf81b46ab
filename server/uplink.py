"""What the coordinator does with compression and privacy of client uploads.

:class:`UplinkPlan` is built once per run from the config. It tells clients (through
the task config) which compressor and privacy layer to apply, decodes compressed
payloads on the coordinator, and for central DP clips rows and noises the mean. It
also owns the privacy accountant whose (epsilon, delta) is stored every round.
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch
from fedplat.server.config import ConfigError, RunConfig

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
from fedplat.transport.errors import InvalidArgument
from fedplat.vectors import Layout


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

    def task_config(self) -> dict[str, Any]:
        """The uplink part of every task's config (sent to clients)."""
        c = self.cfg.compression
        out: dict[str, Any] = {
            "compression": {"name": c.name, "params": json.loads(json.dumps(c.params))},
            "compression_seed": self.seed,
        }
        if self.mode != "none":
            out["privacy"] = {
                "mode": self.mode,
                "clip_norm": self.cfg.privacy.clip_norm,
                "noise_multiplier": self.sigma,
            }
        return out

    def decode(self, data: bytes, round_number: int) -> torch.Tensor:
        """A ``fedplat-payload-v1`` upload -> ``[d]`` float32, validated."""
        try:
            payload = Payload.from_bytes(
                data,
                expected_d=self.layout.numel,
                expected_seed=self.seed,
                expected_round=round_number,
            )
            return self.compressor.decode(payload).to(torch.float32)
        except (PayloadError, CompressionError) as exc:
            raise InvalidArgument(f"bad compressed payload: {exc}") from exc

    # -------------------------------------------------------------- central DP
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
        """Record this round's release; return the metrics to store."""
        if self.accountant is None or self.sigma is None:
            return {}
        rate = (
            1.0 if self.mode == "local" else min(1.0, num_selected / max(1, num_live))
        )
        self.accountant.step(noise_multiplier=self.sigma, sample_rate=rate)
        eps = self.accountant.get_epsilon(self.cfg.privacy.delta)
        return {
            "privacy.epsilon": eps if math.isfinite(eps) else 1e308,
            "privacy.delta": self.cfg.privacy.delta,
            "privacy.noise_multiplier": self.sigma,
            "privacy.sample_rate": rate,
        }

    def state(self) -> dict[str, str]:
        if self.accountant is None:
            return {}
        return {"privacy_accountant": json.dumps(self.accountant.state_dict())}

    def load_state(self, meta: dict[str, str]) -> None:
        if self.accountant is not None and "privacy_accountant" in meta:
            self.accountant.load_state_dict(json.loads(meta["privacy_accountant"]))

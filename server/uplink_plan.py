"""The coordinator half of the uplink contract: compression and privacy of uploads.

:class:`UplinkPlan` is built once per run from the config. It tells clients (the
uplink part of every :class:`~fedplat.protocol.task.TaskConfig`) which compressor
and privacy layer to apply, hands the intake the run's decoder for non-dense
payloads (:mod:`fedplat.protocol.codec`; a sketch compressor's payloads are
summed in sketch space and de-sketched once), and for central DP holds the
DP-FedAvg state (:mod:`fedplat.server.central_dp`). It owns the privacy budget whose
epsilon is stored every round.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import torch
from fedplat.server.central_dp import (
    CentralDP,
    Release,
    Sketcher,
    SketchSum,
    epsilon_metrics,
)
from fedplat.server.config import ConfigError, RunConfig

from fedplat.compression import (
    CompressionError,
    Payload,
    PayloadError,
    create_compressor,
    derive_seed,
)
from fedplat.compression.sketch import AMSSketch, CountSketch, GaussianSketch
from fedplat.compression.wire import SketchSpec
from fedplat.privacy import (
    PrivacyBudget,
    PrivacyError,
    RoundPrivacy,
    noise_multiplier_for,
)
from fedplat.protocol.task import (
    CompressionSpec,
    PrivacySpec,
    SecAggSpec,
    TaskConfig,
)
from fedplat.secagg import SecAggConfig
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
        self.central: CentralDP | None = None
        if p.mode == "central":
            self.central = CentralDP(cfg)
            self.sigma = self.central.z
            if p.secure_aggregation is not None:
                self._check_secagg_size()
        elif p.mode == "local":
            try:
                self.sigma = p.noise_multiplier or noise_multiplier_for(
                    float(p.epsilon or 0.0),
                    p.delta,
                    cfg.run.rounds,
                    1.0,
                    accountant=p.accountant,
                )
                self.budget = PrivacyBudget(p.ceiling, p.delta, p.accountant)
            except PrivacyError as exc:
                raise ConfigError(f"privacy: {exc}") from exc

    # -------------------------------------------------------------- sketches
    @property
    def sketcher(self) -> Sketcher | None:
        """The run's compressor when it is a sketch (summed in sketch space)."""
        comp = self.compressor
        return (
            comp if isinstance(comp, CountSketch | GaussianSketch | AMSSketch) else None
        )

    def sketch_spec(self, round: int) -> SketchSpec:
        sk = self.sketcher
        assert sk is not None
        if isinstance(sk, CountSketch):
            return SketchSpec("count", sk.rows, sk.cols, self.seed, round)
        return SketchSpec(sk.method, 1, sk.b, self.seed, round)

    def sketch_size(self) -> int:
        """``b``: values in one sketch."""
        spec = self.sketch_spec(0)
        return spec.rows * spec.cols

    def sketch_sum(self, round: int) -> SketchSum:
        """What de-sketches round ``round``'s summed sketches."""
        sk = self.sketcher
        assert sk is not None
        return SketchSum(sk, self.sketch_spec(round), self.layout.numel)

    def desketch(self, values: torch.Tensor, round: int) -> torch.Tensor:
        """``R_t^T s`` ``[d]`` of a (summed, noised) sketch ``s`` ``[b]``."""
        sk = self.sketcher
        assert sk is not None
        out = sk.desketch(values, self.layout.numel, round=round, seed=self.seed)
        return out.to(torch.float32)

    def task_config(self, seed: int, secagg: SecAggSpec | None = None) -> TaskConfig:
        """The task config of one client's round (``seed``: its training seed;
        ``secagg``: its part in the round's secure aggregation)."""
        c, t = self.cfg.compression, self.cfg.client_training
        privacy = None
        if self.mode in ("local", "central"):
            assert self.sigma is not None
            privacy = PrivacySpec(self.mode, self.clip_norm, self.sigma)
        return TaskConfig(
            training=t,
            compression=CompressionSpec(c.name, json.loads(json.dumps(c.params))),
            compression_seed=self.seed,
            privacy=privacy,
            seed=seed,
            secagg=secagg,
        )

    def decoder(self, sketch_space: bool) -> Callable[[Payload], torch.Tensor]:
        """The intake's decoder: ``[d]`` rows, or a sketch's own ``[b]`` values
        when the round sums sketches (any other payload is refused)."""
        return self.sketch_values if sketch_space else self.decode

    def decode(self, payload: Payload) -> torch.Tensor:
        """A non-dense payload -> ``[d]`` float32 (the run's compressor)."""
        try:
            return self.compressor.decode(payload).to(torch.float32)
        except CompressionError as exc:
            raise PayloadError(str(exc)) from exc

    def sketch_values(self, payload: Payload) -> torch.Tensor:
        """A sketch payload of this run and round -> its values ``[b]`` float32."""
        spec = payload.sketch
        if payload.kind != "sketch" or spec is None:
            raise PayloadError(f"this run takes sketch payloads, got {payload.kind}")
        if spec != self.sketch_spec(spec.round):
            raise PayloadError("sketch method or shape differs from the run's")
        return payload.values.to(torch.float32)

    # -------------------------------------------------------------- secure agg
    @property
    def secure(self) -> bool:
        """Whether rounds run secure aggregation."""
        return self.cfg.privacy.secure_aggregation is not None

    @property
    def adaptive(self) -> bool:
        return self.central is not None and self.central.adaptive is not None

    def _check_secagg_size(self) -> None:
        """A masked input travels in one message: refuse a model whose masked
        vector (one uint32 per coordinate, padded to a power of two when
        rotated) cannot fit the server's message limit."""
        s = self.cfg.privacy.secure_aggregation
        assert s is not None
        dim = self.sketch_size() if self.sketcher is not None else self.layout.numel
        dim += 1 if self.cfg.privacy.adaptive_clip is not None else 0
        ring = 1 << (dim - 1).bit_length() if s.rotate else dim
        need = 4 * ring + 64 * 1024
        if need > self.cfg.server.max_message_bytes:
            raise ConfigError(
                f"privacy.secure_aggregation: a masked input of {ring:,} values "
                f"needs {need:,} bytes per message; raise server.max_message_bytes "
                "or compress with a sketch"
            )

    def secagg_config(self, clients: int) -> SecAggConfig:
        """A fresh round's secure-aggregation parameters for ``clients`` parties:
        the masked vector is the update (or its sketch), plus the scaled
        unclipped bit under adaptive clipping."""
        s = self.cfg.privacy.secure_aggregation
        assert s is not None
        dim = self.sketch_size() if self.sketcher is not None else self.layout.numel
        clip = self.clip_norm
        if self.adaptive:
            dim, clip = dim + 1, clip * math.sqrt(2.0)
        return SecAggConfig.create(
            dim=dim,
            clip_norm=clip,
            clients=clients,
            dropout_rate=s.dropout_rate,
            corrupt_rate=s.corrupt_rate,
            sparse=s.sparse,
            rotate=s.rotate,
            min_fraction=s.min_fraction,
        )

    # -------------------------------------------------------------- central DP
    @property
    def clip_norm(self) -> float:
        """This round's clip norm (adaptive under central DP)."""
        if self.central is not None:
            return self.central.clip
        return self.cfg.privacy.clip_norm

    def clip_row(self, row: torch.Tensor, norm: float) -> bool:
        """Central DP: clip one accepted row (or sketch) in place to this round's
        clip norm, the bound the noise is calibrated to. Returns whether it was
        clipped."""
        if self.central is None:
            return False
        return self.central.clip_row(row, norm)

    def preview(self) -> RoundPrivacy | None:
        """What one more release would bring epsilon to (None: no DP)."""
        if self.central is not None:
            return self.central.preview()
        if self.mode == "local":
            assert self.sigma is not None
            return self.budget.preview(noise_multiplier=self.sigma, sample_rate=1.0)
        return None

    @property
    def ceiling(self) -> float | None:
        """The epsilon the run may not pass."""
        return self.cfg.privacy.ceiling if self.mode != "none" else None

    def account(self, release: Release | None = None) -> dict[str, float]:
        """Record this round's release; return the metrics to store."""
        if self.central is not None:
            assert release is not None
            return self.central.spend(release)
        if self.mode != "local":
            return {}
        assert self.sigma is not None
        # Every client noises its own release each round: rate 1 for each.
        spent = self.budget.spend(noise_multiplier=self.sigma, sample_rate=1.0)
        out = {
            "privacy.delta": self.cfg.privacy.delta,
            "privacy.noise_multiplier": self.sigma,
            "privacy.sample_rate": 1.0,
        }
        out.update(epsilon_metrics(spent.epsilon))
        return out

    def state(self) -> dict[str, str]:
        if self.central is not None:
            return {"privacy_central": json.dumps(self.central.state_dict())}
        if self.mode == "local":
            return {"privacy_budget": json.dumps(self.budget.state_dict())}
        return {}

    def load_state(self, meta: dict[str, str]) -> None:
        if self.central is not None and "privacy_central" in meta:
            self.central.load_state_dict(json.loads(meta["privacy_central"]))
        elif self.mode == "local" and "privacy_budget" in meta:
            self.budget.load_state_dict(json.loads(meta["privacy_budget"]))

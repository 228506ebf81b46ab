"""Deep Gradient Compression (Lin, Han, Mao, Wang & Dally, ICLR 2018, arXiv 1712.01887).

The full recipe of the paper, re-implemented after reading the authors' code
(synxlin/deep-gradient-compression: ``dgc/memory.py`` ``DGCSGDMemory``,
``dgc/compression.py`` ``DGCCompressor``, ``train.py``):

1. optional local gradient clipping of ``g`` before it enters any buffer
   (Sec. 3.2 "Local Gradient Clipping"; the paper scales the global threshold by
   ``N^-1/2``, see :func:`local_clip_norm`);
2. momentum correction (Sec. 3.2, Eq. 6-7): ``u <- m u + g``, ``v <- v + u``;
   Nesterov as in ``DGCSGDMemory.compensate``: ``u <- m (u + g)``,
   ``v <- v + u + g``;
3. threshold by sampling with the correction passes (Sec. 3.1, see
   :func:`fedplat.compression.selection.sampled_topk`);
4. momentum factor masking (Sec. 3.2, Eq. 8): at the sent coordinates both
   ``v`` and ``u`` are zeroed (``DGCSGDMemory.update``);
5. warm-up training (Sec. 3.3): density 25%, 6.25%, 1.5625%, 0.39%, then the
   target (sparsity 75% -> 93.75% -> 98.4375% -> 99.6% -> 99.9%), one level per
   warm-up stage (an epoch in the paper), keyed by the ``warmup_step`` counter of
   the state in per-step mode and by the round number in federated mode. The
   reference's ``wm5`` default (``0.001 ** (1/6)`` powers) does not match the
   paper's numbers; we use the paper's (Sec. 3.3).

Tensors are sparsified one by one when a :class:`~fedplat.vectors.Layout` is
given, and only those with more than one dimension (``train.py`` passes only
``param.dim() > 1`` to the compressor) and at least ``min_sparse_numel`` entries:
the layer-size threshold below which a tensor is sent dense (the reference code
warns that a tensor of at most ``2 / ratio`` entries "transmits 1 gradient
element"; the paper's exact threshold could not be checked here, so the default,
1,024 entries = 4 KiB, is ours: every tensor of the large models the paper targets
is far above it, while the output layer of a small classifier falls below it and
keeps training, see ``docs/compression.md``, "DGC on small models"). The others
travel densely with momentum applied locally, which is what the reference's dense
path does (``compensate(accumulate=False)``: ``u <- m u + g``, send ``u``). The same
dense path runs when the density is 1, so ``ratio=1`` is exactly momentum SGD.

Weight decay stays out of the compressor: as in the reference ``DGCSGD``, it is
applied locally by the optimizer and never sent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from fedplat.compression.base import (
    CompressionError,
    StateDict,
    StateValue,
    check_state_keys,
    check_vector,
    make_generator,
    state_int,
    state_tensor,
)
from fedplat.compression.basic import decode_dense_or_sparse
from fedplat.compression.selection import sampled_topk
from fedplat.compression.wire import Payload, sparse_payload
from fedplat.vectors import Layout

__all__ = ["DGC", "PAPER_WARMUP_DENSITIES", "DGCState", "local_clip_norm"]

# Sec. 3.3: sparsity 75%, 93.75%, 98.4375%, 99.6% during warm-up, i.e. density
# 4^-1 .. 4^-4; the fifth level (99.9%) is the target ratio itself.
PAPER_WARMUP_DENSITIES: tuple[float, ...] = (0.25, 0.0625, 0.015625, 0.00390625)

# Tensors with fewer entries travel dense (the paper's layer-size threshold, see
# the module docstring): at most 4 KiB each, and at the paper's 0.1% density such a
# tensor would send a single entry per step, i.e. it would barely train.
DEFAULT_MIN_SPARSE_NUMEL = 1024


def local_clip_norm(global_clip_norm: float, num_workers: int) -> float:
    """Per-worker clipping threshold ``global / sqrt(N)`` (Sec. 3.2).

    With ``N`` workers whose gradients add up, clipping each local gradient at
    ``N^-1/2`` times the global threshold bounds the summed norm like global
    clipping would (assuming independent noise).
    """
    if num_workers < 1:
        raise CompressionError("num_workers must be >= 1")
    return global_clip_norm / math.sqrt(num_workers)


@dataclass
class DGCState:
    """Everything DGC carries from one step to the next.

    Attributes
    ----------
    momentum : torch.Tensor or None
        ``u``, float32 ``[d]``.
    velocity : torch.Tensor or None
        ``v``, float32 ``[d]``: the accumulated, not-yet-sent corrected update.
    warmup_step : int
        Compression steps taken so far (``step``/``encode`` calls); the per-step
        warm-up schedule reads it (federated ``encode`` follows the round number).
    last_sent : int
        Entries sent by the last step (statistics only).
    """

    momentum: torch.Tensor | None = None
    velocity: torch.Tensor | None = None
    warmup_step: int = 0
    last_sent: int = 0

    def state_dict(self) -> StateDict:
        out: StateDict = {"warmup_step": self.warmup_step, "last_sent": self.last_sent}
        if self.momentum is not None and self.velocity is not None:
            out["momentum"] = self.momentum.clone()
            out["velocity"] = self.velocity.clone()
        return out

    def load_state_dict(
        self, state: Mapping[str, StateValue], d: int | None = None
    ) -> None:
        check_state_keys(
            state, {"warmup_step", "last_sent", "momentum", "velocity"}, "DGC"
        )
        u = state_tensor(state, "momentum", d)
        v = state_tensor(state, "velocity", d)
        if (u is None) != (v is None) or (
            u is not None and v is not None and u.numel() != v.numel()
        ):
            raise CompressionError("DGC state needs equal-size momentum and velocity")
        self.momentum, self.velocity = u, v
        self.warmup_step = state_int(state, "warmup_step")
        self.last_sent = state_int(state, "last_sent")


class DGC:
    """Deep Gradient Compression with momentum correction, masking and warm-up.

    Two modes share the same state:

    * per-step (the paper): call :meth:`step` with each minibatch gradient;
      apply ``w <- w - lr * mean(decode(payloads))`` with plain SGD.
    * federated: call :meth:`encode` with a client's round update (``w_new -
      w_old``), which plays the role of the gradient; the coordinator averages
      the decoded vectors and adds them to the model.

    Parameters
    ----------
    ratio : float
        Target density (0.001 = 99.9% sparsity); ``1`` means dense momentum SGD.
    momentum : float
        ``m`` of momentum correction.
    nesterov : bool
        Nesterov variant of the correction.
    clip_norm : float, optional
        Local L2 clipping of each incoming gradient (``None``: off, the repo's
        default). Use :func:`local_clip_norm` to derive it from a global one.
    momentum_correction : bool
        ``False`` is the ablation: raw ``g`` accumulates (``v <- v + g``) and no
        momentum is applied in the compressor (Gradient Dropping style).
    momentum_masking : bool
        Zero ``u`` at the sent coordinates (``v`` is always zeroed there).
    warmup_densities : sequence of float
        Density per warm-up stage; ``()`` disables warm-up.
    warmup_steps_per_stage : int
        Steps per warm-up stage: steps per epoch in per-step mode, rounds per
        stage in federated mode.
    sample_ratio, upper_bound, lower_bound, max_passes :
        Threshold sampling settings (1%, 1.3, 0.8, 10 in the paper's code).
    layout : Layout, optional
        Tensor layout of the flat vector; tensors with ``<= 1`` dims go dense.
    seed : int
        Seeds the sample positions in per-step mode (``encode`` uses its own
        ``seed``/``round``).
    min_sparse_numel : int
        Layer-size threshold: tensors with fewer entries are sent dense (with a
        layout; without one, the whole vector).
    """

    def __init__(
        self,
        ratio: float = 0.001,
        *,
        momentum: float = 0.9,
        nesterov: bool = False,
        clip_norm: float | None = None,
        momentum_correction: bool = True,
        momentum_masking: bool = True,
        warmup_densities: Sequence[float] = PAPER_WARMUP_DENSITIES,
        warmup_steps_per_stage: int = 1,
        sample_ratio: float = 0.01,
        upper_bound: float = 1.3,
        lower_bound: float = 0.8,
        max_passes: int = 10,
        layout: Layout | None = None,
        seed: int = 0,
        min_sparse_numel: int = DEFAULT_MIN_SPARSE_NUMEL,
    ) -> None:
        if not 0.0 < ratio <= 1.0:
            raise CompressionError(f"ratio must be in (0, 1], got {ratio}")
        if not 0.0 <= momentum < 1.0:
            raise CompressionError(f"momentum must be in [0, 1), got {momentum}")
        if nesterov and momentum == 0.0:
            raise CompressionError("nesterov needs a non-zero momentum")
        if clip_norm is not None and not clip_norm > 0.0:
            raise CompressionError(f"clip_norm must be > 0, got {clip_norm}")
        if any(not 0.0 < w <= 1.0 for w in warmup_densities):
            raise CompressionError("warm-up densities must be in (0, 1]")
        if warmup_steps_per_stage < 1:
            raise CompressionError("warmup_steps_per_stage must be >= 1")
        if not 0.0 < lower_bound < 1.0 < upper_bound:
            raise CompressionError("need 0 < lower_bound < 1 < upper_bound")
        if max_passes < 0 or not 0.0 < sample_ratio <= 1.0:
            raise CompressionError("bad max_passes or sample_ratio")
        if not 0 <= seed < 1 << 64:
            raise CompressionError("seed must be in [0, 2^64)")
        if min_sparse_numel < 1:
            raise CompressionError("min_sparse_numel must be >= 1")
        self.ratio = ratio
        self.momentum = momentum
        self.nesterov = nesterov
        self.clip_norm = clip_norm
        self.momentum_correction = momentum_correction
        self.momentum_masking = momentum_masking
        self.warmup_densities = tuple(float(w) for w in warmup_densities)
        self.warmup_steps_per_stage = warmup_steps_per_stage
        self.sample_ratio = sample_ratio
        self.upper_bound, self.lower_bound = upper_bound, lower_bound
        self.max_passes = max_passes
        self.layout = layout
        self.seed = seed
        self.min_sparse_numel = min_sparse_numel
        self.state = DGCState()
        self._segments: list[tuple[int, int, bool]] | None = None

    # --- schedule ---------------------------------------------------------------
    def density_at(self, warmup_step: int) -> float:
        """Density used at compression step ``warmup_step`` (0-based)."""
        stage = warmup_step // self.warmup_steps_per_stage
        if stage < len(self.warmup_densities):
            # Never sparser than the target (reference: max(coeff^e, ratio)).
            return max(self.warmup_densities[stage], self.ratio)
        return self.ratio

    def density(self) -> float:
        """Density of the next per-step (:meth:`step`) call."""
        return self.density_at(self.state.warmup_step)

    # --- modes ------------------------------------------------------------------
    def step(self, grad: torch.Tensor) -> Payload:
        """Per-step mode: compress one minibatch gradient ``grad`` ``[d]``.

        Sample positions come from ``(self.seed, warmup_step)``, so a restored
        state continues identically.
        """
        step = self.state.warmup_step
        return self._compress(grad, self.seed, step, self.density_at(step))

    def encode(self, vec: torch.Tensor, *, round: int, seed: int) -> Payload:
        """Federated mode: compress a round update ``vec`` ``[d]``.

        The warm-up schedule follows the round number (1-based: round ``r`` is in
        stage ``(r - 1) // warmup_steps_per_stage``), not the number of rounds
        this client took part in: like the paper's epochs, a stage is a stretch
        of the run's training, and a client selected only now and then must use
        the same density as the others.
        """
        return self._compress(vec, seed, round, self.density_at(max(0, round - 1)))

    def decode(self, payload: Payload) -> torch.Tensor:
        """Sparse (or dense-fallback) payload -> float32 ``[d]``; stateless."""
        return decode_dense_or_sparse(payload)

    # --- state ------------------------------------------------------------------
    def state_dict(self) -> StateDict:
        return self.state.state_dict()

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        self.state.load_state_dict(
            state, None if self.layout is None else self.layout.numel
        )

    # --- core -------------------------------------------------------------------
    def _segments_for(self, d: int) -> list[tuple[int, int, bool]]:
        if self.layout is None:
            return [(0, d, d >= self.min_sparse_numel)]
        if self._segments is None:
            self._segments = [
                (a, b, len(spec.shape) > 1 and b - a >= self.min_sparse_numel)
                for spec, (a, b) in zip(
                    self.layout.specs, self.layout.offsets(), strict=True
                )
            ]
        return self._segments

    def _compress(
        self, grad: torch.Tensor, seed: int, round: int, density: float
    ) -> Payload:
        st = self.state
        expected = (
            self.layout.numel
            if self.layout is not None
            else None
            if st.velocity is None
            else st.velocity.numel()
        )
        g = check_vector(grad, expected)
        d = g.numel()
        if self.clip_norm is not None:
            norm = float(torch.linalg.vector_norm(g))
            # Same 1e-6 guard as torch.nn.utils.clip_grad_norm_ / the repo.
            coef = self.clip_norm / (norm + 1e-6)
            if coef < 1.0:
                g = g * coef
        if st.momentum is None or st.velocity is None:
            st.momentum = torch.zeros(d, dtype=torch.float32)
            st.velocity = torch.zeros(d, dtype=torch.float32)
        u_all, v_all = st.momentum, st.velocity
        m = self.momentum
        idx_parts: list[torch.Tensor] = [torch.zeros(0, dtype=torch.int64)]
        val_parts: list[torch.Tensor] = [torch.zeros(0, dtype=torch.float32)]
        for seg, (a, b, sparsify) in enumerate(self._segments_for(d)):
            gs, u, v = g[a:b], u_all[a:b], v_all[a:b]
            numel = b - a
            k = math.ceil(numel * density)
            if not sparsify or k >= numel:
                # Dense path (reference: compensate(accumulate=False)).
                if not self.momentum_correction:
                    out = gs.clone()
                elif self.nesterov:
                    u.add_(gs).mul_(m)
                    out = u + gs
                else:
                    u.mul_(m).add_(gs)
                    out = u.clone()
                idx_parts.append(torch.arange(a, b, dtype=torch.int64))
                val_parts.append(out)
                continue
            # Momentum correction, Eq. 6-7 (reference: compensate(accumulate=True)).
            if not self.momentum_correction:
                v.add_(gs)
            elif self.nesterov:
                u.add_(gs).mul_(m)
                v.add_(u).add_(gs)
            else:
                u.mul_(m).add_(gs)
                v.add_(u)
            sel = sampled_topk(
                v.abs(),
                k,
                sample_ratio=self.sample_ratio,
                upper_bound=self.upper_bound,
                lower_bound=self.lower_bound,
                max_passes=self.max_passes,
                generator=make_generator(seed, round, "dgc.sample", seg),
            )
            idx = torch.sort(sel.indices).values
            idx_parts.append(idx + a)
            val_parts.append(v[idx].clone())
            # Momentum factor masking, Eq. 8 (reference: DGCSGDMemory.update).
            v[idx] = 0.0
            if self.momentum_masking and self.momentum_correction:
                u[idx] = 0.0
        st.warmup_step += 1
        indices = torch.cat(idx_parts)
        values = torch.cat(val_parts)
        st.last_sent = int(indices.numel())
        return sparse_payload(d, indices, values)

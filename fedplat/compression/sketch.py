"""Linear sketches with a shared per-round seed (Song, Wang, Yu & Zhang, ICML 2023).

Each round ``t`` has one sketch matrix ``R_t`` (``b x d``) that client and
coordinator rebuild from ``(seed, t)`` alone. A client sends ``R_t h`` (``b``
numbers); the coordinator averages the sketches and de-sketches with ``R_tᵀ``
(Sec. 3 of arXiv 2210.08371: ``w_{t+1} = w_t + eta R_tᵀ s``). Every sketch here
has ``E[R_tᵀ R_t] = I``, so ``R_tᵀ R_t h`` is an unbiased estimate of ``h``:

* Gaussian: entries ``N(0, 1/b)``;
* AMS: entries ``±1/sqrt(b)`` (Alon, Matias & Szegedy), equiprobable;
* Count-sketch (Charikar, Chen & Farach-Colton 2002): ``rows`` independent hash
  rows of ``cols`` buckets; row ``j`` maps coordinate ``i`` to bucket
  ``h_j(i)`` with sign ``s_j(i)``; the stacked matrix is scaled by
  ``rows^-1/2`` so that ``E[RᵀR] = I`` and ``Rᵀ s`` is the mean over rows of the
  per-row estimates ``s_j(i) S_j[h_j(i)]``. Heavy-hitter recovery (``recovery=
  "topk"``, as in FetchSGD, Rothchild et al. 2020) instead takes the median over
  rows and keeps the ``k`` largest; it is biased but much less noisy on the
  coordinates that matter.

The dense matrices (Gaussian, AMS) cost ``O(b d)`` time to build and apply; they
are generated in column chunks so memory stays ``O(b * chunk)``. Use the
count-sketch (``O(rows * d)``) for large models.

Sketch payloads are linear: average them with :func:`mean_sketch` (and add
central DP noise to that mean) before de-sketching once; for the non-linear
top-k recovery this is also the only correct order (FetchSGD sums sketches
first).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Literal

import numpy as np
import torch

from fedplat.compression.base import (
    CompressionError,
    StateDict,
    StateValue,
    check_state_keys,
    check_vector,
    make_generator,
)
from fedplat.compression.wire import (
    Payload,
    PayloadError,
    SketchMethod,
    SketchSpec,
    sketch_payload,
)

__all__ = ["AMSSketch", "CountSketch", "GaussianSketch", "mean_sketch"]

# Entries of a dense sketch matrix generated at once (16 MiB of float32).
_CHUNK_ELEMS = 1 << 22


class _Stateless:
    def state_dict(self) -> StateDict:
        return {}

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        check_state_keys(state, set(), type(self).__name__)


def _check_spec(
    payload: Payload, method: SketchMethod, rows: int, cols: int
) -> SketchSpec:
    spec = payload.sketch
    if payload.kind != "sketch" or spec is None:
        raise PayloadError(f"expected a sketch payload, got {payload.kind!r}")
    if (spec.method, spec.rows, spec.cols) != (method, rows, cols):
        raise PayloadError(
            f"sketch is {spec.method} {spec.rows}x{spec.cols}, this decoder "
            f"expects {method} {rows}x{cols}"
        )
    return spec


class _DenseSketch(_Stateless):
    """Shared machinery of the Gaussian and AMS sketches (``rows == 1``)."""

    method: SketchMethod

    def __init__(self, b: int) -> None:
        if b < 1:
            raise CompressionError(f"sketch size b must be >= 1, got {b}")
        self.b = b

    def _chunk(self, g: torch.Generator, width: int) -> torch.Tensor:
        """Columns of ``sqrt(b) R``: unit-scale entries; the ``1/sqrt(b)`` is
        applied to the ``[b]`` / ``[d]`` vectors instead of the matrix."""
        raise NotImplementedError

    def _chunks(
        self, d: int, seed: int, round: int
    ) -> Iterator[tuple[int, int, torch.Tensor]]:
        """``(start, end, R[:, start:end])`` column blocks of ``R`` ``[b, d]``.

        Each block has its own derived seed, so any block can be rebuilt alone and
        the chunk width (a function of ``b`` only) is the same on both sides.
        """
        width = max(1, _CHUNK_ELEMS // self.b)
        for c, a in enumerate(range(0, d, width)):
            e = min(d, a + width)
            g = make_generator(seed, round, self.method, self.b, d, c)
            yield a, e, self._chunk(g, e - a)

    def matrix(self, d: int, *, round: int, seed: int) -> torch.Tensor:
        """The full ``R`` ``[b, d]`` (tests and small ``d`` only)."""
        blocks = [blk for _, _, blk in self._chunks(d, seed, round)]
        return torch.cat(blocks, dim=1).div_(math.sqrt(self.b))

    def encode(self, vec: torch.Tensor, *, round: int, seed: int) -> Payload:
        """``vec`` ``[d]`` -> sketch payload ``R vec`` ``[b]``."""
        h = check_vector(vec)
        s = torch.zeros(self.b, dtype=torch.float32)
        for a, e, blk in self._chunks(h.numel(), seed, round):
            s.addmv_(blk, h[a:e])
        s.div_(math.sqrt(self.b))
        return sketch_payload(
            SketchSpec(self.method, 1, self.b, seed, round), h.numel(), s
        )

    def desketch(
        self, s: torch.Tensor, d: int, *, round: int, seed: int
    ) -> torch.Tensor:
        """``Rᵀ s`` ``[d]`` for a sketch ``s`` ``[b]``."""
        s = s.to(torch.float32).reshape(-1) / math.sqrt(self.b)
        out = torch.empty(d, dtype=torch.float32)
        for a, e, blk in self._chunks(d, seed, round):
            torch.mv(blk.t(), s, out=out[a:e])
        return out

    def decode(self, payload: Payload) -> torch.Tensor:
        """Sketch payload -> ``Rᵀ s`` ``[d]`` (``R`` rebuilt from seed and round)."""
        spec = _check_spec(payload, self.method, 1, self.b)
        return self.desketch(
            payload.values, payload.d, round=spec.round, seed=spec.seed
        )


class GaussianSketch(_DenseSketch):
    """Gaussian sketch: ``R`` ``[b, d]`` with i.i.d. ``N(0, 1/b)`` entries."""

    method: SketchMethod = "gaussian"

    def _chunk(self, g: torch.Generator, width: int) -> torch.Tensor:
        return torch.randn(self.b, width, generator=g)


class AMSSketch(_DenseSketch):
    """AMS sketch: ``R`` ``[b, d]`` with i.i.d. ``±1/sqrt(b)`` entries."""

    method: SketchMethod = "ams"

    def _chunk(self, g: torch.Generator, width: int) -> torch.Tensor:
        # int8 draws: ~2x faster than bernoulli_ here, and exactly ±1 (unlike
        # randn().sign(), which could give 0).
        bits = torch.randint(0, 2, (self.b, width), generator=g, dtype=torch.int8)
        return bits.to(torch.float32).mul_(2.0).sub_(1.0)


class CountSketch(_Stateless):
    """Count-sketch of ``rows x cols`` buckets with linear or heavy-hitter recovery.

    Parameters
    ----------
    rows : int
        Independent hash rows (odd, so the median is a single row's value).
    cols : int
        Buckets per row; the sketch has ``rows * cols`` values.
    recovery : {"linear", "topk"}
        ``"linear"``: ``Rᵀ s`` (unbiased, the paper's de-sketch).
        ``"topk"``: median-of-rows estimate, keep the ``k`` largest magnitudes.
    k : int, optional
        Coordinates kept by ``"topk"`` recovery.
    """

    method: SketchMethod = "count"

    def __init__(
        self,
        rows: int = 5,
        cols: int = 10_000,
        *,
        recovery: Literal["linear", "topk"] = "linear",
        k: int | None = None,
    ) -> None:
        if rows < 1 or cols < 1:
            raise CompressionError(f"need rows, cols >= 1, got {rows}x{cols}")
        if recovery not in ("linear", "topk"):
            raise CompressionError(
                f"recovery must be 'linear' or 'topk', got {recovery!r}"
            )
        if recovery == "topk" and (k is None or k < 1):
            raise CompressionError("topk recovery needs k >= 1")
        self.rows, self.cols = rows, cols
        self.recovery = recovery
        self.k = k

    def _hashes(
        self, d: int, seed: int, round: int, j: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Row ``j``'s buckets (int64 ``[d]``) and signs (float32 ``[d]``).

        Fully random hashes (rather than a pairwise-independent family) drawn
        from the row's derived seed: they make ``E[RᵀR] = I`` hold exactly.
        """
        g = make_generator(seed, round, "count", self.rows, self.cols, d, j)
        buckets = torch.randint(0, self.cols, (d,), generator=g)
        signs = torch.randint(0, 2, (d,), generator=g, dtype=torch.int8)
        return buckets, signs.to(torch.float32).mul_(2.0).sub_(1.0)

    def bucket_loads(self, d: int, *, round: int, seed: int) -> torch.Tensor:
        """Coordinates hashed into each bucket, int64 ``[rows, cols]``."""
        return torch.stack(
            [
                torch.bincount(self._hashes(d, seed, round, j)[0], minlength=self.cols)
                for j in range(self.rows)
            ]
        )

    def sketch(
        self,
        x: torch.Tensor,
        *,
        round: int,
        seed: int,
        dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        """``R x``: ``x`` ``[d]`` or ``[n, d]`` -> ``[rows * cols]`` or
        ``[n, rows * cols]`` (row-major tables), accumulated in ``dtype``.

        The linear map alone, without a payload or input checks (:meth:`encode`
        checks). Rows of ``x`` are taken one at a time: no ``dtype`` copy of a
        whole ``[n, d]`` stack. The same ``(seed, round, d)`` gives the same
        ``R``, so sketches taken in different rounds compare when ``round`` is
        held fixed (the contribution accountant's replay check does that).
        """
        if x.dim() not in (1, 2) or not x.is_floating_point():
            raise CompressionError(
                f"expected a float [d] or [n, d] tensor, got {tuple(x.shape)}"
            )
        d = x.shape[-1]
        inputs = x.detach().reshape(-1, d)
        out = torch.zeros(inputs.shape[0], self.rows, self.cols, dtype=dtype)
        for j in range(self.rows):
            buckets, signs = self._hashes(d, seed, round, j)
            signs = signs.to(dtype)
            # One input row: its product overwrites the signs (no second [d]).
            buf = signs if inputs.shape[0] == 1 else torch.empty_like(signs)
            for i, row in enumerate(inputs):
                torch.mul(row.to(dtype), signs, out=buf)
                out[i, j].index_add_(0, buckets, buf)
        out.div_(math.sqrt(self.rows))
        return out.reshape(*x.shape[:-1], self.rows * self.cols)

    def encode(self, vec: torch.Tensor, *, round: int, seed: int) -> Payload:
        """``vec`` ``[d]`` -> sketch payload ``[rows * cols]`` (row-major)."""
        h = check_vector(vec)
        return sketch_payload(
            SketchSpec("count", self.rows, self.cols, seed, round),
            h.numel(),
            self.sketch(h, round=round, seed=seed),
        )

    def row_estimates(
        self, s: torch.Tensor, d: int, *, round: int, seed: int
    ) -> torch.Tensor:
        """Per-row estimates ``s_j(i) S_j[h_j(i)]`` of each coordinate, ``[rows, d]``.

        Undoes the ``rows^-1/2`` scaling, so each row alone is unbiased.
        """
        table = s.to(torch.float32).reshape(self.rows, self.cols) * math.sqrt(self.rows)
        est = torch.empty(self.rows, d, dtype=torch.float32)
        for j in range(self.rows):
            buckets, signs = self._hashes(d, seed, round, j)
            torch.mul(table[j][buckets], signs, out=est[j])
        return est

    def desketch(
        self, s: torch.Tensor, d: int, *, round: int, seed: int
    ) -> torch.Tensor:
        """Recover ``[d]`` from a sketch ``s`` ``[rows * cols]``."""
        if self.recovery == "linear":
            # Rᵀ s, accumulated row by row: no [rows, d] buffer.
            table = s.to(torch.float32).reshape(self.rows, self.cols)
            out = torch.zeros(d, dtype=torch.float32)
            for j in range(self.rows):
                buckets, signs = self._hashes(d, seed, round, j)
                out.addcmul_(table[j][buckets], signs)
            return out.div_(math.sqrt(self.rows))
        est = self.row_estimates(s, d, round=round, seed=seed)
        assert self.k is not None
        # Lower median over rows (torch.median's convention), via NumPy's
        # partition: ~2x faster than torch.median(dim=0) on [rows, d].
        mid = (self.rows - 1) // 2
        med = torch.from_numpy(np.partition(est.numpy(), mid, axis=0)[mid].copy())
        out = torch.zeros(d, dtype=torch.float32)
        top = torch.topk(med.abs(), min(self.k, d), sorted=False).indices
        out[top] = med[top]
        return out

    def decode(self, payload: Payload) -> torch.Tensor:
        """Sketch payload -> recovered ``[d]`` (hashes rebuilt from seed and round)."""
        spec = _check_spec(payload, "count", self.rows, self.cols)
        return self.desketch(
            payload.values, payload.d, round=spec.round, seed=spec.seed
        )


def mean_sketch(
    payloads: Sequence[Payload], weights: Sequence[float] | None = None
) -> Payload:
    """Weighted mean of sketch payloads of one round (same spec and ``d``).

    Parameters
    ----------
    payloads : sequence of Payload
        Sketches ``[rows * cols]`` built with the same ``(method, rows, cols,
        seed, round)`` and ``d``.
    weights : sequence of float, optional
        Non-negative, not all zero; default uniform.

    Returns
    -------
    Payload
        Float32 sketch of the mean: de-sketching it equals averaging the
        de-sketched vectors (for linear recovery).
    """
    if not payloads:
        raise PayloadError("no sketches to average")
    first = payloads[0]
    if first.kind != "sketch" or first.sketch is None:
        raise PayloadError("mean_sketch needs sketch payloads")
    for p in payloads[1:]:
        if p.kind != "sketch" or p.sketch != first.sketch or p.d != first.d:
            raise PayloadError("sketches differ in method, shape, seed, round or d")
    w = (
        torch.ones(len(payloads), dtype=torch.float64)
        if weights is None
        else (torch.tensor(list(weights), dtype=torch.float64))
    )
    if w.numel() != len(payloads) or bool((w < 0).any()) or float(w.sum()) <= 0:
        raise PayloadError("weights must be non-negative, one per payload, not all 0")
    stacked = torch.stack([p.values.to(torch.float64) for p in payloads])
    mean = (w / w.sum()) @ stacked
    return sketch_payload(first.sketch, first.d, mean.to(torch.float32))

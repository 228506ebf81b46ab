"""Fixed-point encoding of float updates into the ring ``Z_{2^32}`` and back.

Masks cancel only in a finite group, so each client maps its float update to
integers mod ``2^32`` before masking, and the server maps the unmasked integer
sum back. The encoding (:class:`FixedPoint`):

1. clip ``x`` ``[d]`` to L2 norm ``S`` (``clip_norm``; DP-FedAvg clips there anyway);
2. optionally rotate: ``y = H D x / sqrt(d')`` with ``D`` a diagonal of random
   signs drawn from the round's public seed and ``H`` the Walsh-Hadamard matrix
   of size ``d' = 2^ceil(log2 d)`` (``x`` zero-padded), an orthogonal map;
3. clamp every coordinate to ``[-B, B]`` and round ``q = rint(y * s)`` with
   ``s = M / B``, ``M = floor((2^31 - 1) / n)`` for at most ``n`` summands;
4. store ``q mod 2^32``.

Any sum of ``m <= n`` encodings has ``|sum q| <= n M <= 2^31 - 1`` in every
coordinate, so it never wraps and reads back exactly as an int32.

**Bound B.** Without rotation ``B = S``: ``|x_i| <= ||x||_2 <= S``, nothing is
ever clamped. With rotation each ``y_i`` is ``sum_j +-x_j / sqrt(d')`` with
independent signs, sub-Gaussian with variance proxy ``||x||^2 / d'``
(Hoeffding), so ``B = S sqrt(2 ln(2 d' n / beta) / d')`` is exceeded by any of
the ``n d'`` coordinates with probability at most ``beta`` (``failure_prob``).
At ``d = 10^6``, ``n = 100``, ``beta = 1e-9`` that is ``B = S / 115``: a 115x
finer grid for the same 32 bits. This flattening is the randomized Hadamard
transform of Suresh et al. (ICML 2017) and Kairouz et al. (ICML 2021, DDGauss).
A clamped coordinate is counted, never silent.

**Error bound.** Rounding moves each summand's coordinate by at most ``1/(2s)``,
so for ``m`` summands the decoded sum differs from the sum of the clipped (and
clamped) inputs by at most ``m / (2s)`` per coordinate of ``y`` and, the
rotation being orthogonal, by at most ``sqrt(d') m / (2s)`` in L2 norm
(:meth:`FixedPoint.error_bound`). For DP, the quantized contribution of one
client has L2 norm at most ``S + sqrt(d') / (2s)``
(:meth:`FixedPoint.sensitivity`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np
import torch

from fedplat.secagg.crypto import MaskExpander, derive
from fedplat.secagg.errors import SecAggError
from fedplat.vectors import all_finite

__all__ = ["Encoded", "FixedPoint", "fwht", "padded_dim"]

_INT31 = (1 << 31) - 1
# Widest Hadamard factor applied per pass (2^5 = 32): measured faster here than
# wider factors or radix-2 butterflies (log2 d passes over the vector).
_FACTOR_BITS = 5
_ROTATION_LABEL = b"fedplat-secagg-rotation"


def padded_dim(d: int) -> int:
    """``d'``: the next power of two ``>= d``."""
    if d < 1:
        raise SecAggError(f"dimension must be >= 1, got {d}")
    return 1 << (d - 1).bit_length()


def _hadamard(size: int, dtype: torch.dtype) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=dtype)
    while h.shape[0] < size:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Unnormalised Walsh-Hadamard transform ``H x`` of ``x`` ``[2^p]``.

    ``H_{2^p} = H_2 (x) ... (x) H_2`` factors over any grouping of the index bits,
    so ``x`` is viewed as ``[before, f, after]`` for one group of bits at a time
    and multiplied by ``H_f`` along the middle axis (a batched GEMM, no
    transposes): ``p / 5`` passes instead of ``p`` radix-2 butterflies.
    """
    n = x.numel()
    if n & (n - 1):
        raise SecAggError(f"fwht needs a power-of-two length, got {n}")
    bits = n.bit_length() - 1
    y = x.reshape(-1)
    after = 1
    while bits > 0:
        step = min(_FACTOR_BITS, bits)
        f = 1 << step
        h = _hadamard(f, y.dtype)
        if after == 1:
            y = (y.view(-1, f) @ h).reshape(-1)  # H is symmetric
        else:
            y = torch.matmul(h, y.view(-1, f, after)).reshape(-1)
        after *= f
        bits -= step
    return y


class Encoded(NamedTuple):
    """One client's update in the ring.

    Attributes
    ----------
    ring : np.ndarray
        uint32 ``[ring_dim]``.
    clipped : bool
        The update's L2 norm exceeded ``clip_norm`` and was scaled down.
    clamped : int
        Coordinates (after rotation) that exceeded ``B`` and were clamped.
    """

    ring: np.ndarray
    clipped: bool
    clamped: int


@dataclass(frozen=True)
class FixedPoint:
    """The fixed-point code of one round (every party builds the same one).

    Parameters
    ----------
    d : int
        Length of the float updates.
    clip_norm : float
        ``S``: updates are clipped to this L2 norm before encoding.
    max_summands : int
        ``n``: the most encodings that will be summed (the round's participants).
    rotate : bool
        Apply the randomized Hadamard rotation (finer grid, ``d'`` ring entries).
    failure_prob : float
        ``beta``: probability that any coordinate of any rotated update is clamped.
    session : bytes
        The round's public session id; seeds the rotation's signs.
    """

    d: int
    clip_norm: float
    max_summands: int
    rotate: bool = True
    failure_prob: float = 1e-9
    session: bytes = b""

    def __post_init__(self) -> None:
        if self.d < 1:
            raise SecAggError(f"d must be >= 1, got {self.d}")
        if not 0.0 < self.clip_norm < math.inf:
            raise SecAggError(f"clip_norm must be finite and > 0, got {self.clip_norm}")
        if not 1 <= self.max_summands <= _INT31:
            raise SecAggError(
                f"max_summands must be in [1, 2^31), got {self.max_summands}"
            )
        if not 0.0 < self.failure_prob < 1.0:
            raise SecAggError(
                f"failure_prob must be in (0, 1), got {self.failure_prob}"
            )

    @property
    def ring_dim(self) -> int:
        """Entries in the ring: ``d'`` with rotation, else ``d``."""
        return padded_dim(self.d) if self.rotate else self.d

    @property
    def levels(self) -> int:
        """``M``: the integer that ``B`` maps to."""
        return _INT31 // self.max_summands

    @property
    def bound(self) -> float:
        """``B``: the per-coordinate clamp (see the module docstring)."""
        if not self.rotate:
            return self.clip_norm
        n = self.ring_dim
        c = math.sqrt(2.0 * math.log(2.0 * n * self.max_summands / self.failure_prob))
        return min(self.clip_norm, self.clip_norm * c / math.sqrt(n))

    @property
    def scale(self) -> float:
        """``s = M / B``: integer units per unit of update."""
        return self.levels / self.bound

    def error_bound(self, count: int) -> float:
        """L2 bound on ``|decode(sum of count encodings) - sum of the clipped
        inputs|`` from rounding (clamping and float32 rotation rounding excluded)."""
        return math.sqrt(self.ring_dim) * count / (2.0 * self.scale)

    @property
    def sensitivity(self) -> float:
        """L2 norm bound of one decoded contribution: ``S + sqrt(d') / (2 s)``."""
        return self.clip_norm + math.sqrt(self.ring_dim) / (2.0 * self.scale)

    @cached_property
    def _sign_bits(self) -> np.ndarray:
        """The rotation's diagonal ``D`` as bits ``[ring_dim]`` (1 means -1)."""
        seed = derive(self.session.ljust(1, b"\0"), _ROTATION_LABEL, self.session)
        words = MaskExpander((self.ring_dim + 31) // 32).expand(seed)
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")
        return bits[: self.ring_dim]

    def _signs(self, dtype: torch.dtype) -> torch.Tensor:
        signs = 1.0 - 2.0 * self._sign_bits.astype(np.float32)
        return torch.from_numpy(signs).to(dtype)

    def _rotate(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.zeros(self.ring_dim, dtype=x.dtype)
        y[: self.d] = x
        return fwht(y.mul_(self._signs(x.dtype))).div_(math.sqrt(self.ring_dim))

    def _unrotate(self, y: torch.Tensor) -> torch.Tensor:
        # H is symmetric and H H = d' I: H D / sqrt(d') is undone by D H / sqrt(d').
        x = fwht(y).div_(math.sqrt(self.ring_dim)).mul_(self._signs(y.dtype))
        return x[: self.d]

    def encode(self, update: torch.Tensor) -> Encoded:
        """Clip, rotate, clamp and round ``update`` ``[d]`` into the ring."""
        if update.dim() != 1 or update.numel() != self.d:
            raise SecAggError(
                f"expected an update [{self.d}], got {tuple(update.shape)}"
            )
        x = update.detach().to(torch.float32)
        if not all_finite(x):
            raise SecAggError("cannot encode an update with NaN or Inf")
        norm = float(torch.linalg.vector_norm(x, dtype=torch.float64))
        clipped = norm > self.clip_norm
        factor = self.clip_norm / norm if clipped else 1.0
        # The rotation is linear, so the clip factor is applied after it, in
        # float64 together with the scale (float32 M exceeds its 2^24 exact
        # integers; M ~ 2^31 / n).
        y = (self._rotate(x) if self.rotate else x).numpy()
        z = np.multiply(y, self.scale * factor, dtype=np.float64)
        m = float(self.levels)
        clamped = 0
        if z.max(initial=0.0) > m or z.min(initial=0.0) < -m:
            # A value on the bound (a clipped one-hot update) may land an ulp
            # above M: clamp it, but only count real excursions.
            clamped = int(np.count_nonzero(np.abs(z) > m * (1.0 + 1e-9)))
            np.clip(z, -m, m, out=z)
        np.rint(z, out=z)
        return Encoded(z.astype(np.int32).view(np.uint32), clipped, clamped)

    def decode(self, total: np.ndarray, count: int) -> torch.Tensor:
        """The float64 ``[d]`` sum of ``count`` encodings from their ring sum."""
        if total.dtype != np.uint32 or total.shape != (self.ring_dim,):
            raise SecAggError(
                f"expected a uint32 [{self.ring_dim}] sum, "
                f"got {total.dtype} {total.shape}"
            )
        if not 0 <= count <= self.max_summands:
            raise SecAggError(f"count {count} outside [0, {self.max_summands}]")
        y = torch.from_numpy(total.view(np.int32).astype(np.float64) / self.scale)
        return self._unrotate(y) if self.rotate else y

"""Coordinate-wise order statistics of an ``[n, d]`` stack: the compiled kernel
(:mod:`.fused_sort`) when it is ready, else the eager network (:mod:`.bitonic`),
with per-row counts of the kept entries."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import torch
from fedplat.aggregators.kernels import fused_sort
from fedplat.aggregators.kernels.bitonic import reduce_sorted_columns, row_slices


@dataclass(frozen=True)
class Coordinatewise:
    """Output of a coordinate-wise rule.

    ``aggregate`` is ``[d]``; ``kept`` is ``[n]`` float64, the fraction of
    coordinates where row ``i``'s value lay inside the kept range (between the two
    middle values for the median, inside the untrimmed range for the trimmed mean,
    inside the chosen window for MeaMed; ties count as kept). Exact for
    ``d <= 65536``; for larger ``d`` estimated on evenly spaced column blocks
    covering at least 65536 coordinates.
    """

    aggregate: torch.Tensor
    kept: torch.Tensor


# Kept fractions are counted exactly up to this many coordinates; beyond, only on
# evenly spaced groups of columns covering at least as many: counting on every
# block costs ~40% of the sort, and it is a monitoring statistic.
_EXACT_COUNT_COORDS = 1 << 16
_COUNT_GROUP = 8192  # columns; a group is counted whole or not at all


def _sum_rows(t: torch.Tensor) -> torch.Tensor:
    """``t.sum(dim=0)`` for ``t`` ``[r, S]`` with every op kept inline."""
    parts = [t[sl].sum(dim=0) for sl in row_slices(t.shape[0], t.shape[1])]
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total


class _KeptCounter:
    """Accumulates, per row, how many coordinates fall inside ``[lo, hi]``.

    Thread-safe: blocks may arrive from several worker threads.
    """

    def __init__(self, n: int, d: int, track: bool) -> None:
        self.counts = torch.zeros(n, dtype=torch.int64)  # on CPU, whatever x's device
        self.track = track
        self.stride = max(1, d // _EXACT_COUNT_COORDS)
        self.total = 0
        self._lock = threading.Lock()

    def add(
        self, raw: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, start: int
    ) -> None:
        if not self.track or (start // _COUNT_GROUP) % self.stride:
            return
        width = raw.shape[1]
        counts = torch.zeros_like(self.counts)
        for sl in row_slices(raw.shape[0], width):
            part = raw[sl]
            counts[sl] = torch.logical_and(part >= lo, part <= hi).sum(dim=1).cpu()
        with self._lock:
            self.counts += counts
            self.total += width

    def add_columns(self, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> None:
        """``add`` over the counted column groups of the whole ``x`` ``[n, d]``."""
        if not self.track:
            return
        for start in range(0, x.shape[1], _COUNT_GROUP * self.stride):
            stop = start + _COUNT_GROUP
            self.add(x[:, start:stop], lo[start:stop], hi[start:stop], start)

    def fractions(self) -> torch.Tensor:
        if not self.track or self.total == 0:
            return torch.full_like(self.counts, math.nan, dtype=torch.float64)
        return self.counts.to(torch.float64) / self.total


def _fused(
    key: tuple[object, ...],
    x: torch.Tensor,
    reduction: tuple[tuple[int, ...] | None, fused_sort.Reduction],
    counter: _KeptCounter,
) -> torch.Tensor | None:
    """The aggregate from a compiled network (:mod:`.fused_sort`), counting kept
    entries; ``None`` when that path does not apply or cannot compile."""
    if not fused_sort.applicable(x):
        return None
    ranks, reduce = reduction
    out = fused_sort.run(key, x, ranks, reduce)
    if out is None:
        return None
    agg, lo, hi = out
    counter.add_columns(x, lo, hi)
    return agg


def coordinate_median(x: torch.Tensor, track: bool = True) -> Coordinatewise:
    """Coordinate-wise median of ``x`` ``[n, d]`` (Yin et al., ICML 2018).

    For even ``n`` this is the mean of the two middle values (numpy's convention),
    not ``torch.median``'s lower median. ``track=False`` skips the ``kept``
    counts (``nan``).
    """
    n = x.shape[0]
    lo_rank, hi_rank = (n - 1) // 2, n // 2
    counter = _KeptCounter(n, x.shape[1], track)
    fused = _fused(("median", n), x, fused_sort.median_reduction(n), counter)
    if fused is not None:
        return Coordinatewise(fused, counter.fractions())

    def reduce(block: torch.Tensor, raw: torch.Tensor, start: int) -> torch.Tensor:
        counter.add(raw, block[0], block[-1], start)
        return block[0] if lo_rank == hi_rank else 0.5 * (block[0] + block[1])

    ranks = [lo_rank] if lo_rank == hi_rank else [lo_rank, hi_rank]
    agg = reduce_sorted_columns(x, reduce, ranks=ranks)
    return Coordinatewise(agg, counter.fractions())


def coordinate_trimmed_mean(
    x: torch.Tensor, trim: int, track: bool = True
) -> Coordinatewise:
    """Mean of the ``n - 2*trim`` middle values of every column (Yin et al. 2018).

    ``x`` is ``[n, d]``; requires ``0 <= 2*trim < n``.
    """
    n = x.shape[0]
    if not 0 <= 2 * trim < n:
        raise ValueError(f"trimmed mean needs 0 <= 2*trim < n, got trim={trim}, n={n}")
    keep = n - 2 * trim
    counter = _KeptCounter(n, x.shape[1], track)
    fused = _fused(
        ("trimmed_mean", n, trim),
        x,
        fused_sort.trimmed_mean_reduction(n, trim),
        counter,
    )
    if fused is not None:
        return Coordinatewise(fused, counter.fractions())

    def reduce(block: torch.Tensor, raw: torch.Tensor, start: int) -> torch.Tensor:
        middle = block[trim : n - trim]
        counter.add(raw, middle[0], middle[-1], start)
        return _sum_rows(middle) / keep

    agg = reduce_sorted_columns(x, reduce)
    return Coordinatewise(agg, counter.fractions())


def _argmin_rows(t: torch.Tensor) -> torch.Tensor:
    """``t.argmin(dim=0, keepdim=True)`` (first minimum) with ops kept inline."""
    best_val: torch.Tensor | None = None
    best_idx = torch.zeros(1, t.shape[1], dtype=torch.int64, device=t.device)
    for sl in row_slices(t.shape[0], t.shape[1]):
        val, idx = t[sl].min(dim=0, keepdim=True)
        if best_val is None:
            best_val, best_idx = val, idx
        else:
            better = val < best_val  # strict: ties keep the earlier window
            best_val = torch.where(better, val, best_val)
            best_idx = torch.where(better, idx + sl.start, best_idx)
    return best_idx


def closest_window(sorted_block: torch.Tensor, keep: int) -> tuple[torch.Tensor, ...]:
    """The ``keep`` values closest to the median of each sorted column.

    ``sorted_block`` is ``[n, S]``, ascending along dim 0. The ``keep`` values
    nearest to the median form a contiguous window ``[i, i + keep)`` of the sorted
    column; among the ``n - keep + 1`` windows the best one minimises
    ``max(med - s[i], s[i + keep - 1] - med)``; ties go to the lowest window.

    Returns
    -------
    tuple of torch.Tensor
        ``(mean, first, last)``, each ``[S]``: the window's mean and its smallest
        and largest values.
    """
    n = sorted_block.shape[0]
    lo, hi = (n - 1) // 2, n // 2
    med = 0.5 * (sorted_block[lo] + sorted_block[hi])
    n_windows = n - keep + 1
    if n_windows == 1:
        return _sum_rows(sorted_block) / n, sorted_block[0], sorted_block[-1]
    cost = torch.empty(
        n_windows,
        sorted_block.shape[1],
        dtype=sorted_block.dtype,
        device=sorted_block.device,
    )
    for sl in row_slices(n_windows, sorted_block.shape[1]):
        left = med - sorted_block[sl]  # distance of the window's first value
        right = sorted_block[sl.start + keep - 1 : sl.stop + keep - 1] - med
        torch.maximum(left, right, out=cost[sl])
    start = _argmin_rows(cost)  # [1, S]
    # Window sum without a scan along dim 0 (cumsum over short strided columns is
    # ~10x slower than elementwise ops): sum of the first window plus the
    # differences s[i + keep] - s[i] of every shift i < start.
    width = sorted_block.shape[1]
    total = _sum_rows(sorted_block[:keep])
    shift = torch.arange(n_windows - 1, device=sorted_block.device)[:, None]
    for sl in row_slices(n_windows - 1, width):
        diff = sorted_block[sl.start + keep : sl.stop + keep] - sorted_block[sl]
        total = total + (diff * (shift[sl] < start)).sum(dim=0)
    first = sorted_block.gather(0, start)[0]
    last = sorted_block.gather(0, start + keep - 1)[0]
    return total / keep, first, last


def coordinate_meamed(x: torch.Tensor, f: int, track: bool = True) -> Coordinatewise:
    """Mean-around-median (Xie, Koyejo & Gupta 2018, "Generalized Byzantine-tolerant
    SGD", MeaMed): per coordinate, the mean of the ``n - f`` values closest to the
    median. ``x`` ``[n, d]``; requires ``0 <= f < n``."""
    n = x.shape[0]
    if not 0 <= f < n:
        raise ValueError(f"MeaMed needs 0 <= f < n, got f={f}, n={n}")
    counter = _KeptCounter(n, x.shape[1], track)
    fused = _fused(("meamed", n, f), x, fused_sort.meamed_reduction(n, f), counter)
    if fused is not None:
        return Coordinatewise(fused, counter.fractions())

    def reduce(block: torch.Tensor, raw: torch.Tensor, start: int) -> torch.Tensor:
        mean, first, last = closest_window(block, n - f)
        counter.add(raw, first, last, start)
        return mean

    agg = reduce_sorted_columns(x, reduce)
    return Coordinatewise(agg, counter.fractions())

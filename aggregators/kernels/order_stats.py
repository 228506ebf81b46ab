"""Coordinate-wise reductions of an ``[n, d]`` stack over its sorted columns.

A rule states its per-column maths as a :class:`ColumnReduction` over the sorted
values of one column (``s[r]``, the ``r``-th smallest, one tensor per rank);
:func:`reduce_columns` runs it on the compiled network (:mod:`.fused_sort`) when
that kernel is ready, else on the eager network (:mod:`.bitonic`), and counts per
row how often its value fell inside the kept range.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import torch
from fedplat.aggregators.kernels import fused_sort
from fedplat.aggregators.kernels.bitonic import reduce_sorted_columns, row_slices
from fedplat.aggregators.kernels.fused_sort import Reduction


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
            inside = torch.logical_and(part >= lo, part <= hi)
            # count_nonzero: a bool .sum(dim=1) took ~30x longer (1.8 vs
            # 0.05 ms per [50, 8192] group; median of [50, 2^18]: 23 -> 17 ms).
            counts[sl] = torch.count_nonzero(inside, dim=1).cpu()
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


@dataclass(frozen=True)
class ColumnReduction:
    """A per-column rule over sorted values.

    Attributes
    ----------
    key : tuple
        Identifies ``(rule, n, settings)``: the compiled kernel is cached by it.
    ranks : tuple of int or None
        The ranks ``reduce`` reads (``None``: all); the networks skip the work
        that leads only to other ranks, so ``reduce`` must not read them.
    reduce : callable
        ``reduce(s) -> (aggregate, lowest kept, highest kept)``, each ``[S]``,
        where ``s[r]`` is the ``r``-th smallest value of every column (``[S]``).
        Only elementwise torch ops, so the compiled kernel can fuse it.
    """

    key: tuple[object, ...]
    ranks: tuple[int, ...] | None
    reduce: Reduction


def _rows_by_rank(
    block: torch.Tensor, n: int, ranks: tuple[int, ...] | None
) -> list[torch.Tensor]:
    """``s`` for ``reduce``: the rows of a sorted block ``[n, S]``, or of the
    picked ranks ``[len(ranks), S]`` placed at their ranks (the other entries
    repeat a picked row; ``reduce`` never reads them)."""
    if ranks is None:
        return list(block.unbind(0))
    rows = [block[0]] * n
    for i, r in enumerate(ranks):
        rows[r] = block[i]
    return rows


def reduce_columns(
    x: torch.Tensor, reduction: ColumnReduction, track: bool = True
) -> Coordinatewise:
    """Apply ``reduction`` to every column of ``x`` ``[n, d]``.

    ``track=False`` skips the ``kept`` counts (``nan``).

    Examples
    --------
    The smallest value of each column (only rank 0 is computed):

    >>> x = torch.tensor([[3.0, 1.0], [1.0, 2.0], [2.0, 0.0]])
    >>> smallest = ColumnReduction(("min", 3), (0,), lambda s: (s[0], s[0], s[0]))
    >>> out = reduce_columns(x, smallest)
    >>> out.aggregate, out.kept  # row i's share of columns where it was kept
    (tensor([1., 0.]), tensor([0.0000, 0.5000, 0.5000], dtype=torch.float64))
    """
    n = x.shape[0]
    ranks = reduction.ranks
    counter = _KeptCounter(n, x.shape[1], track)
    if fused_sort.applicable(x):
        out = fused_sort.run(reduction.key, x, ranks, reduction.reduce)
        if out is not None:
            agg, lo, hi = out
            counter.add_columns(x, lo, hi)
            return Coordinatewise(agg, counter.fractions())

    def chunk(block: torch.Tensor, raw: torch.Tensor, start: int) -> torch.Tensor:
        agg, lo, hi = reduction.reduce(_rows_by_rank(block, n, ranks))
        counter.add(raw, lo, hi, start)
        return agg

    agg = reduce_sorted_columns(x, chunk, ranks=None if ranks is None else list(ranks))
    return Coordinatewise(agg, counter.fractions())

"""Robust defaults of weighted FedAvg: each round's norm bound and weight cap.

The maths is :mod:`fedplat.aggregators.bounds` (Sun et al. 2019's norm
thresholding with a relative bound ``B = m * median``, and the weight cap
``C = k * median``, with the argument why an attacker minority cannot raise
either). This module decides *which* norms the median is taken over, so that
the coordinator's memory stays what it was:

- **Rows** (:class:`~fedplat.server.accumulator.RowStack`: robust rules,
  pre-aggregators, contribution scoring): every row is kept until the round
  closes, so ``B`` is the exact median of the round's own accepted norms.
- **Running sum** (:class:`~fedplat.server.accumulator.RunningSum`, plain
  FedAvg, ``O(d)``): a row is added when it arrives, so ``B`` must be known
  then. The reference is the previous completed round's accepted norms,
  persisted in its checkpoint (``extra``, :data:`REFERENCE_KEY`), so a
  coordinator restarted after a SIGKILL bounds the next round exactly as the
  one it replaces would have; ``B`` is then fixed for the round and does not
  depend on arrival order. A round without reference (the run's first, or one
  after a round whose median norm was 0) holds its first ``prefix`` rows
  uncommitted (``prefix`` model-sized rows more, in that round only) until they
  have all arrived or the round closes; their median sets the bound of the
  whole round. The guarantee is the module's argument applied to the reference
  set: fewer attackers than half of the previous round's accepted clients, or
  than half of a round's first ``prefix`` arrivals (an attacker that races to
  upload first is among them). A bound that followed the median of every norm
  seen so far would need more: attackers fewer than half of *every* early part
  of the arrival order, which their timing decides.

Not bounded: rounds under central DP (its per-row clip to the clipping norm is
the bound, and its noise is calibrated to it; a second clip would change
neither guarantee) and secure aggregation (the coordinator never sees a row).
Under a sketch compressor the norms are those of the sketches ``[b]`` the
coordinator sums: a sketch is linear, so scaling the sketch scales the update,
and the bound limits each client's share of the summed sketch, which is all the
de-sketching sees; the decoded norm itself is not what is bounded.

The weight cap is ``k`` times the median of the declared example counts of the
round's selected clients, known at selection from their enrolment (each first
capped by its token's and the run's caps), and applies to weighted rules only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch
from fedplat.aggregators.bounds import (
    bound_scales,
    median_low,
    norm_bound,
    weight_cap,
)
from fedplat.server.aggregator_section import NormBound, WeightBound

#: Where a checkpoint's ``extra`` metadata keeps the round's accepted norms.
REFERENCE_KEY = "norm_bound.reference"

T = TypeVar("T")


# --------------------------------------------------------------------------- #
# The reference, across rounds and restarts


def reference_from(extra: Mapping[str, str]) -> tuple[float, ...]:
    """The reference norms a checkpoint's ``extra`` metadata carries (none: ())."""
    raw = extra.get(REFERENCE_KEY)
    if raw is None:
        return ()
    values = json.loads(raw)
    return tuple(float(v) for v in values)


def reference_extra(norms: Sequence[float]) -> dict[str, str]:
    """The ``extra`` metadata that makes ``norms`` the next round's reference
    (``repr`` round-trips a float exactly through JSON)."""
    return {REFERENCE_KEY: json.dumps([float(n) for n in norms])}


# --------------------------------------------------------------------------- #
# One round


@dataclass(frozen=True)
class Bounded(Generic[T]):
    """What the bound made of one row: ``item`` scaled by ``scale`` under
    ``bound`` (``scale`` 1: untouched)."""

    item: T
    norm: float
    scale: float
    bound: float


class StreamingBound(Generic[T]):
    """The norm bound of a round summed as rows arrive (module docstring).

    :meth:`offer` takes a row's norm and an opaque ``item`` and returns the rows
    now ready to be added with their scales: that row, nothing (held in the
    prefix), or the whole prefix. :meth:`flush` releases a prefix that never
    filled when the round closes. The bound is fixed once known: from the
    reference, or from the prefix for the rest of the round.
    """

    def __init__(
        self, spec: NormBound, reference: Sequence[float] = (), *, prefix: int
    ) -> None:
        self.multiplier = spec.multiplier
        self.prefix = max(1, min(spec.prefix, prefix))
        ref = torch.tensor(list(reference), dtype=torch.float64)
        self.bound: float | None = None
        if ref.numel() and median_low(ref) > 0:
            self.bound = norm_bound(ref, self.multiplier)
        self._held: list[tuple[float, T]] = []

    @property
    def held(self) -> int:
        return len(self._held)

    def offer(self, norm: float, item: T) -> list[Bounded[T]]:
        if self.bound is not None:
            return self._bounded([(norm, item)], self.bound)
        self._held.append((norm, item))
        return self.flush() if len(self._held) >= self.prefix else []

    def flush(self) -> list[Bounded[T]]:
        """Release the held prefix; its median sets the round's bound."""
        held, self._held = self._held, []
        if not held:
            return []
        if self.bound is None:
            norms = torch.tensor([n for n, _ in held], dtype=torch.float64)
            self.bound = norm_bound(norms, self.multiplier)
        return self._bounded(held, self.bound)

    @staticmethod
    def _bounded(rows: list[tuple[float, T]], bound: float) -> list[Bounded[T]]:
        norms = torch.tensor([n for n, _ in rows], dtype=torch.float64)
        scales = bound_scales(norms, bound).tolist()
        return [
            Bounded(item, n, s, bound)
            for (n, item), s in zip(rows, scales, strict=True)
        ]


def exact_bound(norms: Sequence[float], spec: NormBound) -> tuple[list[float], float]:
    """Row mode: every row's scale ``[n]`` and the bound, from the round's own
    accepted norms."""
    t = torch.tensor(list(norms), dtype=torch.float64)
    bound = norm_bound(t, spec.multiplier)
    return bound_scales(t, bound).tolist(), bound


@dataclass(frozen=True)
class RoundBounds:
    """One round's bounds, fixed when it opens (``None``: that bound is off)."""

    norm: NormBound | None = None
    reference: tuple[float, ...] = ()
    weight_cap: float | None = None

    def weigh(self, examples: int) -> float:
        """A weighted rule's weight for ``examples`` (already capped by the
        token and the run): at most the round's cap."""
        w = float(examples)
        return w if self.weight_cap is None else min(w, self.weight_cap)

    def streaming(self, selected: int) -> StreamingBound[Any] | None:
        """The running sum's bound (held prefix at most ``selected`` rows)."""
        if self.norm is None:
            return None
        return StreamingBound(self.norm, self.reference, prefix=selected)


def round_weight_cap(declared: Sequence[int], spec: WeightBound | None) -> float | None:
    """The cap of a round whose selected clients declared ``declared`` examples
    at enrolment (None: no cap, or nobody selected)."""
    if spec is None or not declared:
        return None
    return weight_cap(
        torch.tensor(list(declared), dtype=torch.float64), spec.multiplier
    )


__all__ = [
    "REFERENCE_KEY",
    "Bounded",
    "RoundBounds",
    "StreamingBound",
    "exact_bound",
    "reference_extra",
    "reference_from",
    "round_weight_cap",
]

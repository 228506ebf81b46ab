"""One round's flags, with the memory replay detection needs across rounds.

The rules are the pure functions of :mod:`fedplat.contribution.flags`; this module
applies them to a round and keeps what the next round compares against: a count
sketch of each client's last update and of the global model.

The sketch is the uplink's :class:`fedplat.compression.CountSketch` with one hash
row of ``min(sketch_width, d)`` buckets (Charikar, Chen & Farach-Colton, 2002),
taken at a fixed round so every round uses the same hashes: it keeps inner
products on average, so an exact replay has sketch cosine 1 and unrelated updates
``~N(0, 1/width)`` around their true cosine, in ``width`` floats per client
instead of ``d``. :meth:`FlagMemory.
label` reads that memory without changing it; :meth:`FlagMemory.remember` stores a
round's sketches once the round is committed, so a round that was never stored
leaves no trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fedplat.aggregators.base import ClientDecision
from fedplat.compression.sketch import CountSketch
from fedplat.contribution.flags import (
    FREE_RIDER_FLAGS,
    LOW_SCORE_OUTLIER,
    NEGATIVE_SCORE,
    RANDOM_UPDATE,
    REPLAYED_UPDATE,
    SUSPECT_FLAGS,
    ZERO_UPDATE,
    FlagThresholds,
    aggregator_flags,
    low_score_outliers,
    random_updates,
    replayed_updates,
    zero_updates,
)
from fedplat.contribution.similarity import max_abs_cosine_to_others


@dataclass(frozen=True)
class Observation:
    """What a round leaves for the next one's replay check.

    Attributes
    ----------
    round_number
        The round.
    dim
        ``d``, the model size the sketches were taken at.
    client_ids
        ``n`` ids, row order of ``sketches``.
    sketches
        ``[n, w]`` sketches of the round's updates.
    global_sketch
        ``[w]`` sketch of the global model the round trained from.
    """

    round_number: int
    dim: int
    client_ids: tuple[str, ...]
    sketches: torch.Tensor
    global_sketch: torch.Tensor


@dataclass(frozen=True)
class RoundFlags:
    """Labels of one round.

    Attributes
    ----------
    labels
        Per row, the labels in rule order (``agg:*`` first).
    suspect, free_rider
        Per row: some label brands the client / shows it sent no work.
    observation
        What :meth:`FlagMemory.remember` keeps once the round is committed
        (``None`` for a round without rows).
    """

    labels: tuple[tuple[str, ...], ...]
    suspect: tuple[bool, ...]
    free_rider: tuple[bool, ...]
    observation: Observation | None


class FlagMemory:
    """Applies the flag rules to rounds and remembers committed rounds' sketches.

    Parameters
    ----------
    thresholds
        The rules' thresholds.
    sketch_width
        Width of the count sketch of updates (memory per client).
    seed
        Seed of the sketch's hash and signs.
    """

    # The round the sketch's hashes are derived for: the same in every round, so
    # sketches of different rounds compare.
    _SKETCH_ROUND = 0

    def __init__(self, thresholds: FlagThresholds, sketch_width: int, seed: int):
        self.thresholds = thresholds
        self.sketch_width = sketch_width
        self.seed = seed
        self._sketch: CountSketch | None = None
        self._dim = 0  # d of the current sketch
        # client -> (round, sketch of its update in that round)
        self._updates: dict[str, tuple[int, torch.Tensor]] = {}
        self._global: tuple[int, torch.Tensor] | None = None

    def _sketch_of(self, x: torch.Tensor) -> torch.Tensor:
        """Float64 sketch ``[w]`` of ``x [d]``, or ``[n, w]`` of ``x [n, d]``."""
        d = int(x.shape[-1])
        if self._sketch is None or self._dim != d:
            # A new model size: sketches of the old one compare with nothing.
            self._sketch = CountSketch(rows=1, cols=min(self.sketch_width, d))
            self._dim = d
            self._updates.clear()
            self._global = None
        return self._sketch.sketch(
            x, round=self._SKETCH_ROUND, seed=self.seed, dtype=torch.float64
        )

    def label(
        self,
        round_number: int,
        client_ids: Sequence[str],
        updates: torch.Tensor,
        global_before: torch.Tensor,
        primary: torch.Tensor | None,
        truncated: bool,
        decisions: Sequence[ClientDecision],
    ) -> RoundFlags:
        """Labels of the round's ``[n, d]`` ``updates`` (row ``i`` is
        ``client_ids[i]``), from ``global_before [d]``, the ``[n]`` primary
        scores (``None`` if it did not run) and the aggregator's decisions."""
        n, d = int(updates.shape[0]), int(updates.shape[1])
        labels = aggregator_flags(decisions, n) if n else []
        if n == 0:
            return RoundFlags((), (), (), None)
        sketches = self._sketch_of(updates)
        global_sketch = self._sketch_of(global_before)
        hits = self._rules(round_number, client_ids, updates, sketches, global_sketch)
        if primary is not None and not truncated:
            th = self.thresholds
            hits.append(
                (
                    LOW_SCORE_OUTLIER,
                    low_score_outliers(primary, th.outlier_z, th.min_clients),
                )
            )
            hits.append((NEGATIVE_SCORE, primary < 0))
        for flag, rows in hits:
            for i in range(n):
                if bool(rows[i]):
                    labels[i].append(flag)
        return RoundFlags(
            labels=tuple(tuple(x) for x in labels),
            suspect=tuple(bool(set(x) & SUSPECT_FLAGS) for x in labels),
            free_rider=tuple(bool(set(x) & FREE_RIDER_FLAGS) for x in labels),
            observation=Observation(
                round_number, d, tuple(client_ids), sketches, global_sketch
            ),
        )

    def _rules(
        self,
        round_number: int,
        client_ids: Sequence[str],
        updates: torch.Tensor,
        sketches: torch.Tensor,
        global_sketch: torch.Tensor,
    ) -> list[tuple[str, torch.Tensor]]:
        """The free-riding rules: ``(label, [n] bool)`` in label order."""
        th, d = self.thresholds, int(updates.shape[1])
        norms = torch.linalg.vector_norm(updates.double(), dim=1)
        zero = zero_updates(norms, th.zero_norm)
        cosines = max_abs_cosine_to_others(updates)
        rand = random_updates(cosines, d, th.random_sigmas) & ~zero
        step = None
        if self._global is not None and self._global[0] == round_number - 1:
            step = global_sketch - self._global[1]
        earlier = []
        for cid in client_ids:
            seen = self._updates.get(cid)
            # Only earlier rounds: a retried round is not a replay of itself.
            earlier.append(seen[1] if seen and seen[0] < round_number else None)
        replay = replayed_updates(sketches, earlier, step, th.replay_cosine) & ~zero
        return [(ZERO_UPDATE, zero), (REPLAYED_UPDATE, replay), (RANDOM_UPDATE, rand)]

    def remember(self, obs: Observation) -> None:
        """Keep a committed round's sketches for the next rounds' replay check."""
        if self._sketch is None or obs.dim != self._dim:
            return  # sketched at another model size: meaningless now
        for i, cid in enumerate(obs.client_ids):
            self._updates[cid] = (obs.round_number, obs.sketches[i])
        self._global = (obs.round_number, obs.global_sketch)


__all__ = ["FlagMemory", "Observation", "RoundFlags"]

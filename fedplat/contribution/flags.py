"""Per-client, per-round flags: the aggregator's verdicts, free-riding, outliers.

A flag is a short label. Some only *describe* what happened (``agg:excluded``,
``negative-score``); the *suspect* ones brand a client for the round:

* free-riding (no work, no reward; Buyukates, He et al., arXiv 2302.14031):
  ``zero-update`` (no change sent), ``replayed-update`` (the client's own previous
  update, or the previous global step, sent again), ``random-update`` (a direction
  indistinguishable from noise: ``|cos|`` with every other update below
  ``sigmas / sqrt(d)``, the spread of a random direction's cosine);
* ``low-score-outlier``: a negative primary score that is also a robust outlier
  of the round (modified z-score below ``-outlier_z``; Iglewicz & Hoaglin, 1993).

The aggregator's verdicts (excluded, clipped, down-weighted) are recorded as
``agg:*`` labels but never brand a client on their own: robust rules exclude
honest clients with unusual (non-IID) data too (Karimireddy, He & Jaggi, ICLR
2022, on robust aggregation over heterogeneous data). A negative score alone does
not brand either: a client whose data differs from the validation distribution can
lower accuracy for a round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fedplat.aggregators.base import ClientDecision

ZERO_UPDATE = "zero-update"
REPLAYED_UPDATE = "replayed-update"
RANDOM_UPDATE = "random-update"
LOW_SCORE_OUTLIER = "low-score-outlier"
NEGATIVE_SCORE = "negative-score"
AGGREGATOR_PREFIX = "agg:"

#: Evidence of sending no work; counts towards losing the reward.
FREE_RIDER_FLAGS = frozenset({ZERO_UPDATE, REPLAYED_UPDATE, RANDOM_UPDATE})
#: Flags that make a client *suspect* for the round (``flagged_rounds``).
SUSPECT_FLAGS = FREE_RIDER_FLAGS | {LOW_SCORE_OUTLIER}

# Iglewicz & Hoaglin (1993): M_i = 0.6745 (x_i - median) / MAD; 0.6745 is the
# 0.75 quantile of N(0, 1), so M is a z-score for Gaussian data.
_MAD_TO_Z = 0.6745
# Their fallback when MAD = 0: the mean absolute deviation times 1.2533 (sqrt(pi/2)).
_MEANAD_TO_SIGMA = 1.2533
# Below this dimension a random direction's cosine is not small enough to tell.
_MIN_DIM_FOR_RANDOM = 64


@dataclass(frozen=True)
class FlagThresholds:
    """Thresholds of the flag rules (see the module docstring).

    Attributes
    ----------
    outlier_z
        ``low-score-outlier`` when the modified z-score is below ``-outlier_z``.
    min_clients
        Score outliers need at least this many scored clients in the round.
    zero_norm
        ``zero-update`` when ``||u_i|| <= zero_norm * median_j ||u_j||``.
    replay_cosine
        ``replayed-update`` when the sketch cosine to the client's previous
        update, or to the previous global step, is at least this.
    random_sigmas
        ``random-update`` when ``|cos(u_i, reference)| < random_sigmas / sqrt(d)``.
    """

    outlier_z: float = 3.5
    min_clients: int = 5
    zero_norm: float = 1e-6
    replay_cosine: float = 0.999
    random_sigmas: float = 4.0


def aggregator_flags(decisions: Sequence[ClientDecision], n: int) -> list[list[str]]:
    """``agg:*`` labels per row from the aggregator's decisions.

    Parameters
    ----------
    decisions
        One :class:`~fedplat.aggregators.ClientDecision` per row (any order).
    n
        Number of rows.

    Returns
    -------
    list of list of str
        ``n`` label lists; ``agg:excluded`` for unselected rows, plus the rule's
        own flags (``agg:clipped``, ``agg:down-weighted``, ...).
    """
    out: list[list[str]] = [[] for _ in range(n)]
    for d in decisions:
        if not 0 <= d.index < n:
            raise ValueError(f"decision index {d.index} out of range for {n} rows")
        labels = out[d.index]
        if not d.selected:
            labels.append(AGGREGATOR_PREFIX + "excluded")
        for flag in d.flags:
            label = AGGREGATOR_PREFIX + str(flag)
            if label not in labels:
                labels.append(label)
    return out


def modified_z(scores: torch.Tensor) -> torch.Tensor:
    """Robust z-scores ``[n]`` (Iglewicz & Hoaglin, 1993) of ``scores [n]``.

    Zero everywhere when the scores do not vary.
    """
    x = scores.double()
    med = x.median()
    dev = (x - med).abs()
    mad = float(dev.median())
    if mad > 0:
        return _MAD_TO_Z * (x - med) / mad
    mean_ad = float(dev.mean())
    if mean_ad > 0:
        return (x - med) / (_MEANAD_TO_SIGMA * mean_ad)
    return torch.zeros_like(x)


def low_score_outliers(
    scores: torch.Tensor, outlier_z: float, min_clients: int
) -> torch.Tensor:
    """``[n]`` bool: negative scores that are robust low outliers of the round."""
    n = scores.shape[0]
    if n < max(min_clients, 3):
        return torch.zeros(n, dtype=torch.bool)
    return (modified_z(scores) < -outlier_z) & (scores < 0)


def zero_updates(norms: torch.Tensor, zero_norm: float) -> torch.Tensor:
    """``[n]`` bool: rows whose norm is ~0 relative to the round's median norm."""
    med = float(norms.double().median())
    return (norms == 0) | (norms.double() <= zero_norm * med)


def random_updates(
    cosines: torch.Tensor, dim: int, random_sigmas: float
) -> torch.Tensor:
    """``[n]`` bool: rows as orthogonal to the others as random noise is.

    ``cosines`` are each row's largest ``|cos|`` with another row
    (:func:`fedplat.contribution.similarity.max_abs_cosine_to_others`).

    A direction drawn uniformly at random in ``R^d`` has a cosine of mean 0 and
    standard deviation ``~1/sqrt(d)`` with any fixed vector, so ``|cos|`` below
    ``random_sigmas / sqrt(d)`` with every other update is what noise looks
    like; a trained update shares a cosine of order 0.1 with some other
    update even on non-IID data.
    """
    n = cosines.shape[0]
    if dim < _MIN_DIM_FOR_RANDOM or n < 3:
        return torch.zeros(n, dtype=torch.bool)
    return cosines.abs() < random_sigmas / math.sqrt(dim)


def sketch_cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine of two sketches (0 if either is zero)."""
    na, nb = float(a.norm()), float(b.norm())
    if na == 0 or nb == 0:
        return 0.0
    return float(a @ b) / (na * nb)


def replayed_updates(
    sketches: torch.Tensor,
    previous: Sequence[torch.Tensor | None],
    previous_step: torch.Tensor | None,
    replay_cosine: float,
) -> torch.Tensor:
    """``[n]`` bool: updates that repeat the sender's last one or the last step.

    Parameters
    ----------
    sketches
        ``[n, w]`` sketches of this round's updates.
    previous
        Per row, the sketch ``[w]`` of the same client's previous update, if any.
    previous_step
        Sketch ``[w]`` of the previous round's global model change, if known.
    replay_cosine
        Cosine at or above which two sketches count as the same direction.
    """
    out = torch.zeros(sketches.shape[0], dtype=torch.bool)
    for i, s in enumerate(sketches):
        refs = [p for p in (previous[i], previous_step) if p is not None]
        out[i] = any(sketch_cosine(s, r) >= replay_cosine for r in refs)
    return out

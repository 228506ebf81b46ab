"""The best round of a run by any metric it records: one owner for "best"
(the run summary, ``fedplat export --best [--metric NAME]`` and the monitor's
runs ranking all ask it).

Which value wins: the highest, except for metrics whose name's last dotted
part ends in ``loss`` or is ``mae``, ``mse`` or ``rmse`` (:func:`lower_is_better`);
the earliest of equal values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fedplat.store import MetricRecord, RoundRecord

#: Metrics kept on the round itself; any other is a run-level row of the metrics table.
ROUND_METRICS = ("accuracy", "loss")
#: Metrics (their names' last dotted part) where less is better, besides "*loss".
LOWER_IS_BETTER = ("mae", "mse", "rmse")


def lower_is_better(name: str) -> bool:
    """Whether the lowest value of metric ``name`` is the best: ``loss``,
    ``train_loss``, ``eval.val_loss`` (any name whose last dotted part ends in
    "loss") and ``eval.mae``/``mse``/``rmse``; every other metric (accuracy,
    AUC, F1, custom scores) is best when highest."""
    last = name.rsplit(".", 1)[-1].lower()
    return last.endswith("loss") or last in LOWER_IS_BETTER


def round_values(
    rounds: Iterable[RoundRecord], metrics: Iterable[MetricRecord], name: str
) -> dict[int, float]:
    """Round number -> value of metric ``name`` in each completed round.

    ``accuracy`` and ``loss`` are read from the rounds; any other name from the
    run-level rows of the metrics table (no ``client_id``), the last one written
    for a round winning. Rounds that did not complete (no model came of them)
    and non-finite values are left out.
    """
    done = {r.number: r for r in rounds if r.status == "completed"}
    out: dict[int, float] = {}
    if name in ROUND_METRICS:
        for number, r in done.items():
            value = r.accuracy if name == "accuracy" else r.loss
            if value is not None:
                out[number] = value
    else:
        for m in metrics:
            if m.name == name and m.client_id is None and m.round_number in done:
                out[m.round_number] = m.value
    return {n: v for n, v in sorted(out.items()) if math.isfinite(v)}


def round_metric_names(
    rounds: Iterable[RoundRecord], metrics: Iterable[MetricRecord]
) -> list[str]:
    """The metrics with a value in a completed round (``--metric``'s choices):
    ``accuracy``/``loss`` first, then the run-level metrics alphabetically."""
    done = [r for r in rounds if r.status == "completed"]
    numbers = {r.number for r in done}
    on_rounds = [n for n in ROUND_METRICS if round_values(done, (), n)]
    recorded = {
        m.name
        for m in metrics
        if m.client_id is None and m.round_number in numbers and math.isfinite(m.value)
    }
    return on_rounds + sorted(recorded)


@dataclass(frozen=True)
class Best:
    """The best value of a metric and the round it was reached in."""

    round: int
    value: float


def best_of(values: Mapping[int, float], *, lowest: bool) -> Best | None:
    """The highest (``lowest``: lowest) of round -> value; the earliest round of
    equal values wins (a later round adds nothing). ``None`` if empty."""
    if not values:
        return None
    pick = min if lowest else max
    value = pick(values.values())
    return Best(min(n for n, v in values.items() if v == value), value)


def best_round(
    rounds: Iterable[RoundRecord],
    metrics: Iterable[MetricRecord] = (),
    *,
    metric: str | None = None,
    lowest: bool | None = None,
) -> RoundRecord | None:
    """The best evaluated completed round (``None`` if none has the metric):
    by ``metric`` (:func:`round_values`; the lowest value if ``lowest``, or left
    ``None`` if :func:`lower_is_better`), else the highest accuracy, or the
    lowest loss where no accuracy was measured; the earliest of equals."""
    done = {r.number: r for r in rounds if r.status == "completed"}
    if metric is None:
        metric = "accuracy" if round_values(done.values(), (), "accuracy") else "loss"
    if lowest is None:
        lowest = lower_is_better(metric)
    found = best_of(round_values(done.values(), metrics, metric), lowest=lowest)
    return done[found.round] if found is not None else None


__all__ = [
    "LOWER_IS_BETTER",
    "ROUND_METRICS",
    "Best",
    "best_of",
    "best_round",
    "lower_is_better",
    "round_metric_names",
    "round_values",
]

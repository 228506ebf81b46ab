"""What a run recorded, for the monitor's metric picker and the runs ranking:
the metric names, the picker's default, a long frame of picked metrics, each
run's best value of a metric (:mod:`fedplat.best`) and the runs ranked by it.
Free of Streamlit, like :mod:`fedplat.ui.data`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pandas as pd
from fedplat.ui.data import round_series

from fedplat.best import ROUND_METRICS, best_of, round_metric_names, round_values
from fedplat.store import MetricRecord, Store


def run_metric_names(metrics: Iterable[MetricRecord]) -> list[str]:
    """Names of the run-level round metrics (a round, no client) a run recorded,
    in alphabetical order: what the run page's metric picker offers."""
    return sorted(
        {m.name for m in metrics if m.round_number is not None and m.client_id is None}
    )


# Charted already (from the rounds), so not picked by default.
_CHARTED = ("eval.accuracy", "eval.loss")


def default_metric_picks(names: Sequence[str]) -> list[str]:
    """The picker's first selection: the evaluation metrics (``eval.*``, e.g.
    AUC, F1 and the app's own) other than accuracy and loss."""
    return [n for n in names if n.startswith("eval.") and n not in _CHARTED]


def metrics_long(metrics: Sequence[MetricRecord], names: Sequence[str]) -> pd.DataFrame:
    """Long frame ``round, metric, value`` of the run-level metrics ``names``
    (one row per round and metric; the last value written for a round wins)."""
    run_level = [m for m in metrics if m.client_id is None]
    frames = []
    for name in names:
        series = round_series(run_level, name)
        if not series.empty:
            frames.append(series.assign(metric=name))
    if not frames:
        return pd.DataFrame(columns=["round", "metric", "value"])
    long = pd.concat(frames, ignore_index=True)[["round", "metric", "value"]]
    return long.sort_values(["metric", "round"]).reset_index(drop=True)


def rank_metric_names(store: Store) -> list[str]:
    """Every metric some run has a value of in a completed round (the runs
    page's "rank by" choices): accuracy and loss first, then the others."""
    found: set[str] = set()
    for run in store.list_runs():
        found.update(
            round_metric_names(store.list_rounds(run.id), store.list_metrics(run.id))
        )
    return [n for n in ROUND_METRICS if n in found] + sorted(found - set(ROUND_METRICS))


BEST_COLUMNS = ["run_id", "best_value", "best_round"]


def best_by_run(store: Store, name: str, lowest: bool) -> pd.DataFrame:
    """The best value of metric ``name`` in each run's completed rounds and its
    round (:func:`fedplat.best.best_of`); runs without it are left out."""
    rows = []
    for run in store.list_runs():
        metrics = [] if name in ROUND_METRICS else store.list_metrics(run.id, name)
        values = round_values(store.list_rounds(run.id), metrics, name)
        best = best_of(values, lowest=lowest)
        if best is not None:
            rows.append(
                {"run_id": run.id, "best_value": best.value, "best_round": best.round}
            )
    return pd.DataFrame(rows, columns=BEST_COLUMNS)


def rank_runs(runs: pd.DataFrame, best: pd.DataFrame, *, lowest: bool) -> pd.DataFrame:
    """``runs`` (``runs_frame`` rows) with ``best``'s columns and a ``rank``, best
    first (lowest if ``lowest``; equals share a rank), unranked runs last."""
    merged = runs.merge(best, on="run_id", how="left")
    merged["best_round"] = merged["best_round"].astype("Int64")
    merged["rank"] = (
        merged["best_value"].rank(method="min", ascending=lowest).astype("Int64")
    )
    merged["order"] = range(len(merged))
    ranked = merged.sort_values(["rank", "order"], na_position="last", kind="stable")
    return ranked.drop(columns="order").reset_index(drop=True)


__all__ = [
    "BEST_COLUMNS",
    "best_by_run",
    "default_metric_picks",
    "metrics_long",
    "rank_metric_names",
    "rank_runs",
    "run_metric_names",
]

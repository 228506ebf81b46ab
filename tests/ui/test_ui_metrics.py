"""Any metric a run records: the run page's picker, the runs list's ranking and the
one "best round" rule (``fedplat.summary``) that ``fedplat export --best`` shares.
Small hand-checkable records, no Streamlit."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest
from fedplat.ui import charts, recorded

from fedplat.best import (
    Best,
    best_of,
    best_round,
    lower_is_better,
    round_metric_names,
    round_values,
)
from fedplat.store import MetricRecord, RoundRecord, Store
from tests.support.ui_fixture import ACCURACY, build_fixture_db

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def metric(
    name: str, value: float, rnd: int | None, client: str | None = None, i: int = 0
) -> MetricRecord:
    return MetricRecord(i, "run", rnd, client, name, value, NOW)


def rnd(
    number: int,
    accuracy: float | None = None,
    loss: float | None = None,
    status: str = "completed",
) -> RoundRecord:
    return RoundRecord(
        number, "run", number, status, NOW, NOW, None, 2, 2, 0, accuracy, loss,
        number, None, None, 0, 0, None,
    )  # fmt: skip


ROUNDS = [rnd(1, 0.5, 1.2), rnd(2, status="failed"), rnd(3, 0.7, 0.9), rnd(4, 0.7)]
METRICS = [
    metric("eval.auc", 0.80, 1),
    metric("eval.auc", 0.99, 2),  # a failed round: no model came of it
    metric("eval.auc", 0.90, 3),
    metric("eval.auc", 0.91, 3),  # rewritten: the last value wins
    metric("eval.auc", 0.95, 1, client="c0"),  # a client's, not the run's
    metric("eval.sensitivity", 0.6, 3),
    metric("train_loss", 0.4, 1),
    metric("train_loss", 0.3, 3),
    metric("eval.f1", math.nan, 4),
    metric("contribution.score", 0.2, 3, client="c0"),
    metric("privacy.max_epsilon", 8.0, None),  # not tied to a round
]


@pytest.mark.parametrize(
    ("name", "lowest"),
    [
        ("loss", True),
        ("train_loss", True),
        ("eval.val_loss", True),
        ("eval.mae", True),
        ("eval.RMSE", True),
        ("accuracy", False),
        ("eval.auc", False),
        ("eval.f1", False),
        ("eval.sensitivity", False),
        ("eval.loss_ratio", False),  # only the name's end counts
    ],
)
def test_lower_is_better(name: str, lowest: bool) -> None:
    assert lower_is_better(name) is lowest


def test_round_values_of_completed_rounds() -> None:
    assert round_values(ROUNDS, METRICS, "accuracy") == {1: 0.5, 3: 0.7, 4: 0.7}
    assert round_values(ROUNDS, METRICS, "loss") == {1: 1.2, 3: 0.9}
    assert round_values(ROUNDS, METRICS, "eval.auc") == {1: 0.8, 3: 0.91}
    assert round_values(ROUNDS, METRICS, "eval.f1") == {}  # NaN is no value
    assert round_values(ROUNDS, METRICS, "missing") == {}


def test_round_metric_names() -> None:
    assert round_metric_names(ROUNDS, METRICS) == [
        "accuracy",
        "loss",
        "eval.auc",
        "eval.sensitivity",
        "train_loss",
    ]
    assert round_metric_names([rnd(1, status="failed")], METRICS) == []


def test_best_of_takes_the_earliest_of_equals() -> None:
    values = {1: 0.8, 2: 0.9, 3: 0.9}
    assert best_of(values, lowest=False) == Best(2, 0.9)
    assert best_of(values, lowest=True) == Best(1, 0.8)
    assert best_of({}, lowest=False) is None


def test_best_round_by_any_metric() -> None:
    def number(**kw: object) -> int | None:
        found = best_round(ROUNDS, METRICS, **kw)  # type: ignore[arg-type]
        return found.number if found is not None else None

    assert number() == 3  # accuracy 0.7 first reached in round 3
    assert number(metric="eval.auc") == 3
    assert number(metric="train_loss") == 3  # a loss: lowest wins
    assert number(metric="train_loss", lowest=False) == 1
    assert number(metric="eval.auc", lowest=True) == 1
    assert number(metric="loss") == 3
    assert number(metric="eval.f1") is None
    # No accuracy measured: the lowest loss, as before.
    assert best_round([rnd(1, loss=2.0), rnd(2, loss=1.0), rnd(3, loss=1.5)]) == rnd(
        2, loss=1.0
    )


def test_the_picker_offers_every_run_level_round_metric() -> None:
    names = recorded.run_metric_names([*METRICS, metric("eval.accuracy", 0.5, 1)])
    assert names == [
        "eval.accuracy",
        "eval.auc",
        "eval.f1",
        "eval.sensitivity",
        "train_loss",
    ]
    assert recorded.default_metric_picks(names) == [
        "eval.auc",
        "eval.f1",
        "eval.sensitivity",
    ]
    assert recorded.default_metric_picks(["round_seconds", "eval.loss"]) == []


def test_metrics_long_one_row_per_round_and_metric() -> None:
    long = recorded.metrics_long(METRICS, ["train_loss", "eval.auc", "missing"])
    # Run-level values only; the failed round's AUC is recorded, so shown.
    assert long.to_dict("records") == [
        {"round": 1, "metric": "eval.auc", "value": 0.80},
        {"round": 2, "metric": "eval.auc", "value": 0.99},
        {"round": 3, "metric": "eval.auc", "value": 0.91},
        {"round": 1, "metric": "train_loss", "value": 0.4},
        {"round": 3, "metric": "train_loss", "value": 0.3},
    ]
    assert list(recorded.metrics_long(METRICS, []).columns) == [
        "round",
        "metric",
        "value",
    ]


def test_metrics_chart_draws_one_line_per_metric() -> None:
    long = recorded.metrics_long(METRICS, ["eval.auc", "train_loss"])
    spec = charts.metrics_chart(long).to_dict()
    assert spec["mark"]["type"] == "line"
    assert spec["encoding"]["color"]["field"] == "metric"
    assert spec["encoding"]["x"]["field"] == "round"
    assert spec["title"] == "Recorded metrics per round"
    split = charts.metrics_chart(long, independent=True).to_dict()
    assert split["facet"]["row"]["field"] == "metric"
    assert split["resolve"] == {"scale": {"y": "independent"}}


def test_rank_runs_best_first_and_unranked_last() -> None:
    runs = pd.DataFrame({"run_id": ["a", "b", "c", "d"], "name": ["A", "B", "C", "D"]})
    best = pd.DataFrame(
        {
            "run_id": ["b", "c", "d"],
            "best_value": [0.7, 0.9, 0.7],
            "best_round": [2, 5, 1],
        }
    )
    high = recorded.rank_runs(runs, best, lowest=False)
    assert list(high["name"]) == ["C", "B", "D", "A"]
    assert high["rank"].tolist() == [1, 2, 2, pd.NA]
    assert high["best_round"].tolist() == [5, 2, 1, pd.NA]
    low = recorded.rank_runs(runs, best, lowest=True)
    assert list(low["name"]) == ["B", "D", "C", "A"]
    assert low["rank"].tolist() == [1, 1, 3, pd.NA]


def test_best_by_run_and_rank_names_from_a_store(tmp_path: Path) -> None:
    ids = build_fixture_db(tmp_path / "m.db")
    with Store(str(tmp_path / "m.db"), migrate=False) as store:
        store.add_metrics(ids["digits-done"], {"eval.auc": 0.9}, round_number=2)
        store.add_metrics(ids["digits-live"], {"eval.auc": 0.95}, round_number=1)
        assert recorded.rank_metric_names(store) == [
            "accuracy",
            "loss",
            "compression.ratio",
            "eval.auc",
            "privacy.epsilon",
        ]
        auc = recorded.best_by_run(store, "eval.auc", lowest=False).set_index("run_id")
        assert auc.to_dict("index") == {
            ids["digits-done"]: {"best_value": 0.9, "best_round": 2},
            ids["digits-live"]: {"best_value": 0.95, "best_round": 1},
        }
        acc = recorded.best_by_run(store, "accuracy", lowest=False).set_index("run_id")
        assert acc.loc[ids["digits-done"], "best_value"] == pytest.approx(max(ACCURACY))
        assert acc.loc[ids["digits-done"], "best_round"] == 3

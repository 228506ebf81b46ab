"""The monitor shows every metric a run records (AppTest): the run page's metric
picker, the runs list ranked by any metric, links by run name, and live refresh
only of runs that can still change."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fedplat.ui import DB_ENV

from fedplat.store import Store
from tests.support.ui_fixture import build_fixture_db, keep_alive
from tests.support.ui_pages import charts, metrics, open_page, texts

pytestmark = pytest.mark.timeout(120)

#: What the tabular example's evaluation records each round, for digits-done.
AUC = [0.81, 0.88, 0.86]
SENSITIVITY = [0.5, 0.7, 0.75]


@pytest.fixture(scope="module")
def metric_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    path = tmp_path_factory.mktemp("ui-metrics") / "monitor.db"
    ids = build_fixture_db(path)
    with Store(str(path), migrate=False) as store:
        for r, (auc, sens) in enumerate(zip(AUC, SENSITIVITY, strict=True), start=1):
            store.add_metrics(
                ids["digits-done"],
                {"eval.accuracy": 0.5, "eval.auc": auc, "eval.sensitivity": sens},
                round_number=r,
            )
        store.add_metrics(ids["digits-live"], {"eval.auc": 0.93}, round_number=1)
    return path, ids


@pytest.fixture
def db(
    metric_db: tuple[Path, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    monkeypatch.setenv(DB_ENV, str(metric_db[0]))
    keep_alive(*metric_db)
    return metric_db[1]


# --------------------------------------------------------------------------- #
# The run page's metric picker                                                 #
# --------------------------------------------------------------------------- #


def test_run_page_offers_every_recorded_metric(db: dict[str, str]) -> None:
    at = open_page("run", db["digits-done"])
    (picker,) = at.multiselect
    assert picker.options == [
        "compression.ratio",
        "eval.accuracy",
        "eval.auc",
        "eval.sensitivity",
        "privacy.epsilon",
    ]
    # The evaluation's metrics besides accuracy (charted above) by default.
    assert picker.value == ["eval.auc", "eval.sensitivity"]
    (drawn,) = charts(at)["Recorded metrics per round"]
    by_metric = drawn.groupby("metric")["value"].apply(list).to_dict()
    assert by_metric == {"eval.auc": AUC, "eval.sensitivity": SENSITIVITY}
    assert not at.error


def test_run_page_draws_the_metrics_picked(db: dict[str, str]) -> None:
    at = open_page("run", db["digits-done"])
    at.multiselect[0].set_value(["compression.ratio"]).run()
    (drawn,) = charts(at)["Recorded metrics per round"]
    assert drawn.to_dict("list") == {
        "round": [1, 2, 3],
        "metric": ["compression.ratio"] * 3,
        "value": [21.0, 22.0, 23.0],
    }
    at.multiselect[0].set_value(["eval.auc", "privacy.epsilon"]).run()
    at.toggle(key="fedplat_metrics_separate").set_value(True).run()
    (drawn,) = charts(at)["Recorded metrics per round"]
    assert set(drawn["metric"]) == {"eval.auc", "privacy.epsilon"}
    at.multiselect[0].set_value([]).run()
    assert "Recorded metrics per round" not in charts(at)
    assert "Pick one or more metrics" in texts(at.caption)


def test_run_page_without_other_metrics_says_so(db: dict[str, str]) -> None:
    at = open_page("run", db["digits-failed"])
    assert "recorded no round-level metrics yet" in texts(at.info)
    assert not at.multiselect


# --------------------------------------------------------------------------- #
# The runs list ranked by a metric                                             #
# --------------------------------------------------------------------------- #


def test_runs_page_ranks_by_accuracy_then_by_any_metric(db: dict[str, str]) -> None:
    at = open_page()
    rank_by = at.selectbox(key="fedplat_rank_by")
    assert rank_by.value == "accuracy"
    assert rank_by.options[:2] == ["accuracy", "loss"]
    assert {"eval.auc", "eval.sensitivity", "compression.ratio"} <= set(rank_by.options)
    table = at.dataframe[0].value
    assert table["name"].iloc[0] == "digits-done"  # best accuracy 83%
    assert table["rank"].iloc[0] == 1

    rank_by.set_value("eval.auc").run()
    table = at.dataframe[0].value
    ranked = table.dropna(subset=["rank"])
    assert list(ranked["name"]) == ["digits-live", "digits-done"]
    assert list(ranked["best_value"]) == pytest.approx([0.93, 0.88])
    assert list(ranked["best_round"]) == [1, 2]
    assert len(table) == 7  # runs without an AUC are listed, last
    assert "Ranked by the highest eval.auc" in texts(at.caption)

    at.selectbox(key="fedplat_rank_by").set_value("loss").run()
    table = at.dataframe[0].value.dropna(subset=["rank"])
    assert list(table["name"]) == ["digits-done", "digits-live"]  # lowest first
    assert "Ranked by the lowest loss" in texts(at.caption)


# --------------------------------------------------------------------------- #
# Links by run name, and never to another run                                  #
# --------------------------------------------------------------------------- #


def test_a_link_may_name_the_run(db: dict[str, str]) -> None:
    at = open_page("run", "digits-failed")
    assert at.selectbox[0].value == db["digits-failed"]
    assert at.query_params["run"] == "digits-failed"  # the link is left as given
    assert metrics(at)["Current round"] == "0 / 3"
    at.selectbox[0].set_value(db["digits-done"]).run()
    assert at.query_params["run"] == db["digits-done"]


def test_an_unknown_run_is_named_and_no_other_run_shown(db: dict[str, str]) -> None:
    at = open_page("run", "no-such-run")
    assert "No run with the id or name no-such-run in this" in texts(at.warning)
    assert at.selectbox[0].value is None
    assert not metrics(at) and not charts(at)
    # Choosing one in the sidebar opens it.
    at.selectbox[0].set_value(db["digits-done"]).run()
    assert metrics(at)["Current round"] == "3 / 3"
    assert at.query_params["run"] == db["digits-done"]


def test_a_run_of_another_page_is_pointed_to(db: dict[str, str]) -> None:
    at = open_page("run", "gossip-ring")
    assert "is a gossip run: it is shown on another page" in texts(at.warning)
    assert not metrics(at)
    at = open_page("gossip", db["digits-done"])
    assert "is a federated run" in texts(at.warning)


# --------------------------------------------------------------------------- #
# Live refresh only while a run can change                                     #
# --------------------------------------------------------------------------- #


def _fragments(monkeypatch: pytest.MonkeyPatch, ended: bool) -> list[dict[str, Any]]:
    from fedplat.ui import live

    made: list[dict[str, Any]] = []

    def fragment(body: Callable[[], None], **kw: Any) -> Callable[[], None]:
        made.append(kw)
        return body

    monkeypatch.setattr(live.st, "fragment", fragment)
    monkeypatch.setattr(live.st, "session_state", {})
    drawn: list[bool] = []
    live.live(lambda: drawn.append(True), ended=lambda: ended)
    assert drawn == [True]
    return made


def test_an_ended_run_is_drawn_once_not_refreshed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fedplat.ui.common import REFRESH_S

    assert _fragments(monkeypatch, ended=True) == [{}]
    assert _fragments(monkeypatch, ended=False) == [{"run_every": REFRESH_S}]


def test_run_ended_by_state(db: dict[str, str], metric_db: Any) -> None:
    from fedplat.ui.live import run_ended

    url = str(metric_db[0])
    assert run_ended(url, db["digits-done"]) and run_ended(url, db["digits-failed"])
    assert not run_ended(url, db["digits-live"])
    assert not run_ended(url, db["digits-crashed"])  # may be restarted
    assert run_ended(url, "gone")


def test_a_run_seen_ending_is_drawn_from_reads_after_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each cached read expires on its own clock: when the one that says "ended"
    is newer than the ones the page draws from, the last drawing must still show
    the end (CI once saw a page stuck at the round before the last)."""
    from datetime import UTC, datetime

    from fedplat.ui.common import load_run_view

    path = tmp_path / "monitor.db"
    ids = build_fixture_db(path)
    keep_alive(path, ids)
    monkeypatch.setenv(DB_ENV, str(path))
    live = ids["digits-live"]
    at = open_page("run", live)
    before = metrics(at)["Current round"]
    with Store(str(path), migrate=False) as store:
        total = store.get_run(live).total_rounds
        assert before == f"1 / {total}"
        store.update_run(
            live,
            status="completed",
            current_round=total,
            finished_at=datetime.now(UTC),
        )
    load_run_view.clear()  # only the "has it ended?" read has expired
    at.run()
    assert not at.exception, at.exception
    assert metrics(at)["Current round"] == f"{total} / {total}"

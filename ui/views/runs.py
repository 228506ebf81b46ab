"""Runs: every run in the store with status, progress and participants, ranked by
the best value of a metric of the user's choice (accuracy by default)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st
from fedplat.ui import common, live, recorded
from fedplat.ui.markup import clean, code, plain

from fedplat.best import lower_is_better
from fedplat.store import StoreError

RANK_KEY = "fedplat_rank_by"
COLUMN_ORDER = [
    "rank",
    "name",
    "state_label",
    "mode",
    "progress",
    "participants",
    "clients",
    "best_value",
    "best_round",
    "best_accuracy",
    "started_at",
    "finished_at",
    "duration",
    "last_activity",
    "detail",
]


def _best_column(metric: str) -> Any:
    if metric == "accuracy":
        return st.column_config.ProgressColumn(
            "best accuracy", min_value=0.0, max_value=1.0, format="percent"
        )
    return st.column_config.NumberColumn(
        f"best {clean(metric)}",
        help=f"the best {plain(metric)} of the run's completed rounds",
    )


def _column_config(metric: str) -> dict[str, Any]:
    return {
        "rank": st.column_config.NumberColumn(
            "rank", help=f"by the best {plain(metric)} (runs without it come last)"
        ),
        "best_value": _best_column(metric),
        "best_round": st.column_config.NumberColumn(
            "round", help=f"the round of the best {plain(metric)}"
        ),
        "name": st.column_config.TextColumn("run"),
        "state_label": st.column_config.TextColumn(
            "status",
            help="running, waiting for clients, completed, failed, or "
            "interrupted (the coordinator stopped or died mid-run)",
        ),
        "detail": st.column_config.TextColumn(
            "why", help="why a run failed, waits or was interrupted"
        ),
        "progress": st.column_config.TextColumn(
            "rounds done", help="completed rounds / total rounds"
        ),
        "participants": st.column_config.TextColumn(
            help="succeeded / selected clients in the latest closed round"
        ),
        "clients": st.column_config.NumberColumn("enrolled"),
        "best_accuracy": st.column_config.ProgressColumn(
            "best accuracy", min_value=0.0, max_value=1.0, format="percent"
        ),
        "started_at": st.column_config.DatetimeColumn(
            "started (UTC)", format="YYYY-MM-DD HH:mm:ss"
        ),
        "finished_at": st.column_config.DatetimeColumn(
            "finished (UTC)", format="YYYY-MM-DD HH:mm:ss"
        ),
        "last_activity": st.column_config.DatetimeColumn(
            "last event (UTC)", format="YYYY-MM-DD HH:mm:ss"
        ),
    }


def _counts(runs: pd.DataFrame) -> None:
    counts = runs["state"].value_counts()
    cols = st.columns(5)
    cols[0].metric("Runs", len(runs))
    cols[1].metric(
        "Running",
        int(counts.get("running", 0) + counts.get("waiting", 0)),
        help="training, or waiting for enough live clients",
    )
    cols[2].metric("Completed", int(counts.get("completed", 0)))
    cols[3].metric("Failed", int(counts.get("failed", 0)))
    cols[4].metric(
        "Interrupted",
        int(counts.get("interrupted", 0)),
        help="not ended, but their coordinator stopped or died",
    )


def _rank_by(url: str) -> str:
    """The metric the runs are ranked by (accuracy unless the user picks one)."""
    try:
        names = common.load_rank_names(url)
    except StoreError:
        names = []  # the panel reports it
    options = list(dict.fromkeys(["accuracy", *names]))
    metric = st.selectbox(
        "Rank by",
        options,
        key=RANK_KEY,
        help="The best value of this metric in each run's completed rounds: "
        "the highest, or the lowest for names ending in loss, mae, mse or rmse. "
        "Any metric a run recorded per round is offered (eval.auc, eval.f1, ...).",
    )
    return str(metric or "accuracy")


def _panel(url: str, metric: str) -> None:
    lowest = lower_is_better(metric)
    try:
        runs = recorded.rank_runs(
            common.load_runs(url), common.load_best(url, metric, lowest), lowest=lowest
        )
    except StoreError as exc:
        common.fail_softly(exc)
        return
    if runs.empty:
        st.info(common.NO_RUNS)
        return
    _counts(runs)
    event = st.dataframe(
        runs,
        hide_index=True,
        on_select="rerun",
        selection_mode="single-row",
        key="runs_table",
        column_order=[
            c
            for c in COLUMN_ORDER
            if not (c == "best_accuracy" and metric == "accuracy")
        ],
        column_config=_column_config(metric),
    )
    order = "lowest" if lowest else "highest"
    # Metric names are stored text: never Markdown.
    st.caption(
        f"Ranked by the {order} {code(metric)} reached. Select a row to open the run."
    )
    rows = event.selection.rows if event is not None else []
    if rows:
        row = runs.iloc[rows[0]]
        page = "views/gossip.py" if row["mode"] == "gossip" else "views/run.py"
        st.session_state[common.RUN_KEY] = row["run_id"]
        st.switch_page(page, query_params={"run": row["run_id"]})


def render() -> None:
    st.title("Runs")
    url = common.store_or_stop()
    metric = _rank_by(url)

    def panel() -> None:
        _panel(url, metric)

    live.live(panel)


if __name__ == "__main__":
    render()

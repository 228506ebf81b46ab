"""Runs: every run in the store with status, progress, participants and accuracy."""

from __future__ import annotations

import streamlit as st
from fedplat.ui import common

from fedplat.store import StoreError


def render() -> None:
    st.title("Runs")
    url = common.store_or_stop()

    def panel() -> None:
        try:
            runs = common.load_runs(url)
        except StoreError as exc:
            common.fail_softly(exc)
            return
        if runs.empty:
            st.info(
                "No runs in this database yet. Start one with "
                "`fedplat coordinator --config run.yaml`; it appears here as soon "
                "as the coordinator registers it."
            )
            return
        counts = runs["status"].value_counts()
        cols = st.columns(4)
        cols[0].metric("Runs", len(runs))
        cols[1].metric("Running", int(counts.get("running", 0)))
        cols[2].metric("Completed", int(counts.get("completed", 0)))
        cols[3].metric("Failed", int(counts.get("failed", 0)))
        event = st.dataframe(
            runs,
            hide_index=True,
            on_select="rerun",
            selection_mode="single-row",
            key="runs_table",
            column_order=[
                "name",
                "status",
                "mode",
                "progress",
                "participants",
                "clients",
                "best_accuracy",
                "started_at",
                "finished_at",
                "duration",
                "last_activity",
            ],
            column_config={
                "name": st.column_config.TextColumn("run"),
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
            },
        )
        st.caption("Select a row to open the run.")
        rows = event.selection.rows if event is not None else []
        if rows:
            row = runs.iloc[rows[0]]
            page = "views/gossip.py" if row["mode"] == "gossip" else "views/run.py"
            st.session_state[common.RUN_KEY] = row["run_id"]
            st.switch_page(page, query_params={"run": row["run_id"]})

    common.live(panel)


if __name__ == "__main__":
    render()

"""Contributions: leaderboard, reward shares and the ledger's verification status."""

from __future__ import annotations

import pandas as pd
import streamlit as st
from fedplat.ui import charts, common, data

from fedplat.store import StoreError


def _ledger(url: str, run_id: str) -> None:
    st.subheader("Ledger")
    check, entries = common.load_ledger(url, run_id)
    if check.state == "verified":
        st.success(f"Ledger verified: {check.message}.", icon=":material/verified:")
    elif check.state == "broken":
        bad = check.first_bad_seq
        where = f" First bad entry: **seq {bad}**." if bad is not None else ""
        st.error(
            f"Ledger verification FAILED: {check.message}.{where}",
            icon=":material/gpp_bad:",
        )
        for p in check.problems:
            st.markdown(
                f"- `{p.kind}`"
                + (f" (seq {p.seq})" if p.seq is not None else "")
                + f": {p.message}"
            )
    elif check.state in ("missing", "empty"):
        st.info(check.message, icon=":material/table_view:")
    else:
        st.warning(check.message)
    if entries.empty:
        return

    def _mark(row: pd.Series) -> list[str]:
        color = "background-color: #ffcdd2" if row["problem"] else ""
        return [color] * len(row)

    st.dataframe(entries.style.apply(_mark, axis=1), hide_index=True)


def render() -> None:
    st.title("Contributions")
    url = common.store_or_stop()
    try:
        runs = common.load_runs(url)
    except StoreError as exc:
        common.fail_softly(exc)
        return
    if runs.empty:
        st.info("No runs in this database yet.")
        return
    run_id = common.pick_run(runs)

    def panel() -> None:
        try:
            metrics = common.load_metrics(url, run_id)
            records = common.load_client_records(url, run_id)
        except StoreError as exc:
            common.fail_softly(exc)
            return
        board, per_round = data.contribution_frames(metrics, records)
        if board.empty:
            st.info(
                f"No contribution scores for this run: metrics "
                f"`{data.METRIC_SCORE}` and `{data.METRIC_REWARD}` are written by "
                "contribution accounting, which did not run (or has not scored a "
                f"round yet). {len(records)} client(s) are enrolled."
            )
        else:
            left, right = st.columns(2)
            with left:
                st.subheader("Leaderboard")
                st.dataframe(
                    board,
                    hide_index=True,
                    column_config={
                        "cumulative_score": st.column_config.NumberColumn(
                            "cumulative score", format="%.4f"
                        ),
                        "last_score": st.column_config.NumberColumn(
                            "last round", format="%.4f"
                        ),
                        "reward_share": st.column_config.ProgressColumn(
                            "reward share",
                            min_value=0.0,
                            max_value=1.0,
                            format="percent",
                        ),
                    },
                )
            with right:
                if board["reward_share"].notna().any():
                    st.altair_chart(
                        charts.contribution_bar(board, "reward_share", "Reward shares"),
                        width="stretch",
                    )
                else:
                    st.info(f"No reward shares yet (`{data.METRIC_REWARD}`).")
            if not per_round.empty:
                st.altair_chart(charts.score_over_rounds(per_round), width="stretch")
        _ledger(url, run_id)

    common.live(panel)


if __name__ == "__main__":
    render()

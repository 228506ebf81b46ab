"""Contributions: leaderboard, reward shares and the ledger's verification status."""

from __future__ import annotations

import pandas as pd
import streamlit as st
from fedplat.ui import charts, common, data, live
from fedplat.ui.markup import code, plain

from fedplat.store import StoreError


def _ledger(url: str, run_id: str) -> None:
    st.subheader("Ledger")
    check, entries = common.load_ledger(url, run_id)
    message = plain(check.message)
    if check.state == "verified":
        st.success(f"Ledger verified: {message}.", icon=":material/verified:")
    elif check.state == "broken":
        bad = check.first_bad_seq
        where = f" First bad entry: **seq {bad}**." if bad is not None else ""
        st.error(
            f"Ledger verification FAILED: {message}.{where}",
            icon=":material/gpp_bad:",
        )
        for p in check.problems:
            st.markdown(
                f"- {code(p.kind)}"
                + (f" (seq {p.seq})" if p.seq is not None else "")
                + f": {plain(p.message)}"
            )
    elif check.state == "empty":
        st.info(message, icon=":material/table_view:")
    else:
        st.warning(message)
    if entries.empty:
        return

    def _mark(row: pd.Series) -> list[str]:
        color = "background-color: #ffcdd2" if row["problem"] else ""
        return [color] * len(row)

    st.dataframe(entries.style.apply(_mark, axis=1), hide_index=True)


def render() -> None:
    st.title("Contributions")
    url = common.store_or_stop()
    runs = common.federated_runs(url)
    if runs is None:
        return
    run_id = common.pick_run(runs, everything=common.load_runs(url))

    def panel() -> None:
        try:
            found = common.load_contributions(url, run_id)
            records = common.load_client_records(url, run_id)
        except StoreError as exc:
            common.fail_softly(exc)
            return
        board, per_round = found.board, found.per_round
        if board.empty:
            st.info(
                "No contribution scores for this run: neither ledger entries nor "
                f"`{data.METRIC_SCORE}` / `{data.METRIC_REWARD}` metrics were "
                "recorded. Contribution accounting is off for this run, or has not "
                f"scored a round yet. {len(records)} client(s) are enrolled."
            )
        else:
            st.subheader("Leaderboard")
            st.caption(
                "From the contribution ledger: cumulative credited score and reward "
                "share after each client's latest round."
                if found.source == "ledger"
                else f"From the `{data.METRIC_SCORE}` (summed over rounds) and "
                f"`{data.METRIC_REWARD}` (latest) metrics."
            )
            st.dataframe(
                board,
                hide_index=True,
                column_order=[
                    "rank",
                    "client",
                    "cumulative_score",
                    "reward_share",
                    "last_score",
                    "rounds_scored",
                    "flagged_rounds",
                    "client_id",
                ],
                column_config={
                    "cumulative_score": st.column_config.NumberColumn(
                        "cumulative score", format="%.4f"
                    ),
                    "last_score": st.column_config.NumberColumn(
                        "last round's score", format="%.4f"
                    ),
                    "rounds_scored": st.column_config.NumberColumn("rounds scored"),
                    "flagged_rounds": st.column_config.NumberColumn(
                        "suspect rounds", help="rounds branded free-riding or outlier"
                    ),
                    "reward_share": st.column_config.ProgressColumn(
                        "reward share", min_value=0.0, max_value=1.0, format="percent"
                    ),
                },
            )
            left, right = st.columns(2)
            with left:
                if board["reward_share"].notna().any():
                    common.show(
                        charts.contribution_bar(board, "reward_share", "Reward shares")
                    )
                else:
                    st.info(f"No reward shares yet (`{data.METRIC_REWARD}`).")
            with right:
                if not per_round.empty:
                    common.show(charts.score_over_rounds(per_round))
        _ledger(url, run_id)

    live.live_run(panel, url, run_id)


if __name__ == "__main__":
    render()

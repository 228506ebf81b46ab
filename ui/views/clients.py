"""Clients: status, last seen, rounds joined, bytes, contribution and flags, with
filters."""

from __future__ import annotations

import streamlit as st
from fedplat.ui import common, data

from fedplat.store import CLIENT_STATUSES, StoreError


def render() -> None:
    st.title("Clients")
    url = common.store_or_stop()
    try:
        runs = common.load_runs(url)
    except StoreError as exc:
        common.fail_softly(exc)
        return
    if runs.empty:
        st.info("No runs in this database yet; clients are listed per run.")
        return
    run_id = common.pick_run(runs)

    # Filters live outside the fragment: changing one re-runs the page at once,
    # and the live panel below keeps applying them on every refresh.
    with st.container(border=True):
        cols = st.columns([2, 2, 1, 1])
        statuses = cols[0].multiselect("Status", list(CLIENT_STATUSES), default=[])
        needle = cols[1].text_input("Name or id contains", value="")
        min_joined = cols[2].number_input("Min rounds joined", min_value=0, value=0)
        flagged = cols[3].checkbox("Flagged only", value=False)
    chosen = data.ClientFilter(
        statuses=tuple(statuses),
        name_contains=needle,
        min_rounds_joined=int(min_joined),
        flagged_only=flagged,
    )

    def panel() -> None:
        try:
            clients = common.load_clients(url, run_id)
        except StoreError as exc:
            common.fail_softly(exc)
            return
        if clients.empty:
            st.info(
                "No client has enrolled in this run yet. Clients enroll when "
                "they first connect to the coordinator."
            )
            return
        shown = data.filter_clients(clients, chosen)
        cols = st.columns(4)
        cols[0].metric("Enrolled", len(clients))
        cols[1].metric("Active", int((clients["status"] == "active").sum()))
        cols[2].metric("Ever flagged", int((clients["flagged_rounds"] > 0).sum()))
        cols[3].metric("Shown", len(shown))
        if shown.empty:
            st.warning("No client matches these filters.")
            return
        if clients["contribution_score"].isna().all():
            st.caption(
                "Contribution score and reward share appear once "
                "contribution accounting records them for this run."
            )
        st.dataframe(
            shown,
            hide_index=True,
            column_order=[
                "name",
                "client_id",
                "status",
                "last_seen",
                "rounds_joined",
                "rounds_selected",
                "rounds_rejected",
                "rounds_straggled",
                "flagged_rounds",
                "flags",
                "num_examples",
                "bytes_up",
                "bytes_down",
                "contribution_score",
                "reward_share",
            ],
            column_config={
                "last_seen": st.column_config.DatetimeColumn(
                    "last seen (UTC)", format="YYYY-MM-DD HH:mm:ss"
                ),
                "rounds_joined": st.column_config.NumberColumn(
                    "joined", help="rounds with an accepted update"
                ),
                "rounds_selected": st.column_config.NumberColumn("selected"),
                "rounds_rejected": st.column_config.NumberColumn("rejected"),
                "rounds_straggled": st.column_config.NumberColumn(
                    "straggled", help="rounds closed without its update"
                ),
                "flagged_rounds": st.column_config.NumberColumn(
                    "flagged", help="rounds the aggregator excluded or flagged it"
                ),
                "num_examples": st.column_config.NumberColumn("examples"),
                "bytes_up": st.column_config.NumberColumn("bytes up", format="%d"),
                "bytes_down": st.column_config.NumberColumn("bytes down", format="%d"),
                "contribution_score": st.column_config.NumberColumn(
                    "contribution", format="%.4f"
                ),
                "reward_share": st.column_config.ProgressColumn(
                    "reward share", min_value=0.0, max_value=1.0, format="percent"
                ),
            },
        )

    common.live(panel)


if __name__ == "__main__":
    render()

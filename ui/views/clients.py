"""Clients: status, last seen, rounds joined, bytes, contribution and flags, with
filters."""

from __future__ import annotations

from typing import Any

import streamlit as st
from fedplat.ui import common, live, status
from fedplat.ui.clients import ClientFilter, filter_clients

from fedplat.store import StoreError

#: The table's columns, name first and id last (ids are for copying, names for
#: reading).
COLUMN_ORDER = [
    "name",
    "state",
    "seen",
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
    "client_id",
]


def _column_config() -> dict[str, Any]:
    return {
        "name": st.column_config.TextColumn(
            "client",
            help="the name it enrolled with (its id is the last column)",
        ),
        "state": st.column_config.TextColumn(
            help="from its last contact and the run's state"
        ),
        "seen": st.column_config.TextColumn(
            "last heard", help="time since the coordinator last heard from it"
        ),
        "last_seen": st.column_config.DatetimeColumn(
            "last seen (UTC)", format="YYYY-MM-DD HH:mm:ss"
        ),
        "client_id": st.column_config.TextColumn("client id"),
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
    }


def _filters() -> ClientFilter:
    # Filters live outside the fragment: changing one re-runs the page at once,
    # and the live panel keeps applying them on every refresh.
    with st.container(border=True):
        cols = st.columns([2, 2, 1, 1])
        states = cols[0].multiselect(
            "State",
            list(status.CLIENT_STATES),
            default=[],
            help="active: heard in the last few seconds; idle: quiet but within "
            "the run's liveness window; lost: silent for longer; finished: the "
            "run ended; interrupted: the run's coordinator is gone",
        )
        needle = cols[1].text_input("Name or id contains", value="")
        min_joined = cols[2].number_input("Min rounds joined", min_value=0, value=0)
        flagged = cols[3].checkbox("Flagged only", value=False)
    return ClientFilter(
        states=tuple(states),
        name_contains=needle,
        min_rounds_joined=int(min_joined),
        flagged_only=flagged,
    )


def _panel(url: str, run_id: str, chosen: ClientFilter) -> None:
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
    shown = filter_clients(clients, chosen)
    counts = clients["state"].value_counts()
    cols = st.columns(5)
    cols[0].metric("Enrolled", len(clients))
    cols[1].metric("Active", int(counts.get("active", 0)))
    cols[2].metric("Lost", int(counts.get("lost", 0)))
    cols[3].metric("Ever flagged", int((clients["flagged_rounds"] > 0).sum()))
    cols[4].metric("Shown", len(shown))
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
        column_order=COLUMN_ORDER,
        column_config=_column_config(),
    )


def render() -> None:
    st.title("Clients")
    url = common.store_or_stop()
    runs = common.federated_runs(url)
    if runs is None:
        return
    run_id = common.pick_run(runs, everything=common.load_runs(url))
    chosen = _filters()

    def panel() -> None:
        _panel(url, run_id, chosen)

    live.live_run(panel, url, run_id)


if __name__ == "__main__":
    render()

"""Gossip: the topology with dead nodes and cut links, per-node accuracy, consensus
distance and connected components, at any round picked on a slider."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import streamlit as st
from fedplat.ui import charts, common, data, graph, live
from fedplat.ui.markup import plain

from fedplat.store import MetricRecord, RunRecord, StoreError


def _pick_round(last: int, topo: graph.GossipTopology) -> int:
    """The round to show: the latest unless the user holds one on the slider."""
    if last < 1:
        st.info(
            f"The graph has {len(topo.nodes)} nodes and {len(topo.edges)} links; "
            "no round has finished yet."
        )
        return 1
    follow = st.toggle("Follow the latest round", value=True, key="gossip_follow")
    if follow or last == 1:
        st.caption(f"Showing round {last} (latest).")
        return last
    return int(
        st.slider("Round", min_value=1, max_value=last, value=last, key="gossip_round")
    )


def _metrics_row(
    run: RunRecord,
    topo: graph.GossipTopology,
    state: graph.GraphState,
    accuracy: dict[str, float],
    metrics: Sequence[MetricRecord],
    round_number: int,
) -> None:
    comps = data.round_series(metrics, "gossip.components")
    at_round = comps[comps["round"] == round_number]["value"]
    n_comp = (
        int(at_round.iloc[-1]) if len(at_round) else graph.live_components(topo, state)
    )
    live_acc = [
        accuracy[n] for n in topo.nodes if n in accuracy and n not in state.dead
    ]
    cols = st.columns(5)
    cols[0].metric("Round", f"{round_number} / {run.total_rounds}")
    cols[1].metric(
        "Live nodes", f"{len(topo.nodes) - len(state.dead)} / {len(topo.nodes)}"
    )
    cols[2].metric("Cut links", len(state.cut))
    cols[3].metric("Components", n_comp)
    cols[4].metric(
        "Mean accuracy (live)",
        f"{sum(live_acc) / len(live_acc):.2%}" if live_acc else "-",
    )


def _nodes(
    nodes: pd.DataFrame, accuracy: dict[str, float], state: graph.GraphState
) -> None:
    """Per-node accuracy and the graph's changes so far."""
    st.markdown("**Per-node accuracy**")
    if not accuracy:
        st.info(
            f"No per-node accuracy (`{graph.METRIC_GOSSIP_NODE_ACC}`) at or "
            "before this round; nodes are evaluated on evaluation rounds."
        )
    else:
        st.dataframe(
            nodes.drop(columns=["x", "y"]).sort_values("accuracy"),
            hide_index=True,
            height=300,
            column_config={
                "accuracy": st.column_config.ProgressColumn(
                    min_value=0.0, max_value=1.0, format="percent"
                )
            },
        )
    st.markdown("**Graph changes so far**")
    if state.changes:
        # Each line quotes an event's message: the peers' own words.
        st.markdown("\n".join(f"- {plain(c)}" for c in state.changes))
    else:
        st.caption("None: the graph is intact.")


def _body(url: str, run_id: str) -> None:
    run = common.load_run(url, run_id)
    if run is None:
        st.warning("This run is no longer in the store.")
        return
    view = common.load_run_view(url, run_id)
    if view is not None:
        common.run_title(run.name, view)
        if view.detail:
            st.caption(plain(view.detail))
    topo = graph.gossip_topology(run)
    if topo is None:
        st.warning(
            "This run's config has no `topology` (`nodes` and `edges`), so the "
            "graph cannot be drawn."
        )
        return
    metrics = common.load_metrics(url, run_id)
    events = common.load_gossip_events(url, run_id)
    round_number = _pick_round(graph.gossip_rounds(run, metrics), topo)
    state = graph.graph_state(events, round_number)
    accuracy = graph.node_accuracy_at(metrics, round_number)
    nodes, edges = graph.gossip_graph_frames(topo, state, accuracy)
    _metrics_row(run, topo, state, accuracy, metrics, round_number)

    left, right = st.columns([3, 2])
    with left:
        common.show(charts.gossip_graph_chart(nodes, edges))
        st.caption(
            "Grey crosses: dead nodes. Dashed red: cut links. Dotted grey: "
            f"links to dead nodes. Graph as used during round {round_number}."
        )
    with right:
        _nodes(nodes, accuracy, state)

    series = graph.gossip_series(metrics)
    if series.empty:
        st.info(
            "No run-level gossip metrics yet (mean/min accuracy, consensus "
            "distance, components)."
        )
    else:
        common.show(charts.gossip_series_chart(series, round_number))


def render() -> None:
    st.title("Gossip")
    url = common.store_or_stop()
    try:
        runs = common.load_runs(url)
    except StoreError as exc:
        common.fail_softly(exc)
        return
    gossip = runs[runs["mode"] == "gossip"]
    if gossip.empty:
        st.info(
            "No gossip runs in this database. Gossip runs are recorded with "
            "`mode: gossip` and a `topology` in their config (for example by "
            "`fedplat gossip sim --scenario FILE` with a store)."
        )
        return
    run_id = common.pick_run(gossip, label="Gossip run", everything=runs)

    def panel() -> None:
        try:
            _body(url, run_id)
        except StoreError as exc:
            common.fail_softly(exc)

    live.live_run(panel, url, run_id)


if __name__ == "__main__":
    render()

"""Run detail: progress, accuracy and loss, participants, traffic, compression,
privacy spent and the aggregator's per-client verdicts, round by round."""

from __future__ import annotations

import streamlit as st
from fedplat.ui import charts, common, data

from fedplat.store import RunRecord, StoreError


def _header(run: RunRecord, rounds_open: bool) -> None:
    st.markdown(f"## {run.name} {common.status_badge(run.status)}")
    st.caption(
        f"run id `{run.id}` · aggregator "
        f"`{run.config.get('aggregator', {}).get('name', 'fedavg')}` · "
        f"model `{run.config.get('model', {}).get('name', '?')}` · "
        f"dataset `{run.config.get('data', {}).get('dataset', '?')}`"
    )
    if data.run_mode(run) == "gossip":
        st.info(
            "This is a gossip run; its graph and per-node curves are on the "
            "Gossip page."
        )
        st.page_link(
            "views/gossip.py",
            label="Open the Gossip page",
            icon=":material/share:",
            query_params={"run": run.id},
        )
    done = run.current_round / run.total_rounds if run.total_rounds else 0.0
    label = f"round {run.current_round} of {run.total_rounds} completed"
    if rounds_open:
        # Nothing of an open round is recorded until it closes; the
        # coordinator's heartbeat says what it is doing meanwhile.
        label += f"; round {run.current_round + 1} in progress"
        live = [run.phase] if run.phase else []
        if run.live_clients is not None:
            live.append(f"{run.live_clients} clients live")
        if live:
            label += f" ({', '.join(live)})"
    st.progress(min(max(done, 0.0), 1.0), text=label)


def _body(url: str, run_id: str) -> None:
    run = common.load_run(url, run_id)
    if run is None:
        st.warning("This run is no longer in the store.")
        return
    rounds = common.load_rounds(url, run_id)
    parts = common.load_participations(url, run_id)
    metrics = common.load_metrics(url, run_id)
    events = common.load_events(url, run_id)
    open_round = bool((rounds["status"] == "open").any()) if not rounds.empty else False
    _header(run, open_round)

    reason = data.failure_reason(run, events)
    if reason:
        st.error(f"The run failed: {reason}")
    elif run.status == "completed" and run.reason:
        # e.g. a privacy budget that allowed no further round
        st.info(f"The run stopped early: {run.reason}")

    completed = rounds[rounds["status"] == "completed"]
    last_acc = completed["accuracy"].dropna()
    closed = rounds[rounds["status"] != "open"]
    latest = closed.iloc[-1] if not closed.empty else None
    cols = st.columns(5)
    cols[0].metric("Current round", f"{run.current_round} / {run.total_rounds}")
    cols[1].metric(
        "Accuracy",
        f"{last_acc.iloc[-1]:.2%}" if len(last_acc) else "-",
        delta=(
            f"{last_acc.iloc[-1] - last_acc.iloc[-2]:+.2%}"
            if len(last_acc) > 1
            else None
        ),
    )
    cols[2].metric(
        "Best accuracy",
        f"{run.best_accuracy:.2%}" if run.best_accuracy is not None else "-",
    )
    cols[3].metric(
        "Participants (last closed round)",
        f"{int(latest['succeeded'])} / {int(latest['selected'])}"
        if latest is not None
        else "-",
        help="an open round's updates are recorded when it closes",
    )
    cols[4].metric(
        "Traffic",
        data.format_bytes(
            float(parts["bytes_up"].sum() + parts["bytes_down"].sum())
            if not parts.empty
            else 0.0
        ),
        help="bytes uploaded + downloaded by all clients so far",
    )

    if rounds.empty:
        st.info(
            "No round has started yet: the coordinator waits until enough "
            "clients have enrolled (selection.min_available)."
        )
        return

    left, right = st.columns(2)
    with left:
        if completed["accuracy"].notna().any():
            common.show(charts.accuracy_chart(rounds))
        else:
            st.info(
                "No accuracy yet: the global model is evaluated when a round "
                "completes (every data.eval_every rounds)."
            )
    with right:
        if completed["loss"].notna().any():
            common.show(charts.loss_chart(rounds))
        else:
            st.info("No loss yet.")

    left, right = st.columns(2)
    with left:
        counts = data.outcome_counts(parts)
        if counts.empty:
            st.info("No participations recorded yet.")
        else:
            common.show(charts.outcomes_chart(counts))
            st.caption(
                "Stragglers answered late or not at all before the round "
                "closed; rejected updates failed validation."
            )
    with right:
        traffic = data.traffic_frame(parts)
        if traffic.empty or traffic["bytes"].sum() == 0:
            st.info("No bytes transferred yet.")
        else:
            common.show(charts.traffic_chart(traffic))

    left, right = st.columns(2)
    with left:
        ratio = data.round_series(metrics, data.METRIC_COMPRESSION)
        if ratio.empty:
            st.info(
                f"No compression ratio recorded (metric `{data.METRIC_COMPRESSION}`)"
                ": this run sends uncompressed updates, or its coordinator "
                "predates compression reporting."
            )
        else:
            common.show(
                charts.metric_chart(
                    ratio, title="Compression ratio", y_title="dense / sent bytes"
                )
            )
    with right:
        eps = data.round_series(metrics, data.METRIC_EPSILON)
        unbounded = data.round_series(metrics, data.METRIC_EPSILON_UNBOUNDED)
        if eps.empty and unbounded.empty:
            st.info(
                f"No privacy accounting recorded (metric `{data.METRIC_EPSILON}`): "
                "this run does not use differential privacy, or its coordinator "
                "predates privacy reporting."
            )
        if not eps.empty:
            common.show(
                charts.metric_chart(
                    eps, title="Privacy spent (ε) per round", y_title="ε"
                )
            )
            ceiling = data.round_series(metrics, data.METRIC_MAX_EPSILON)
            if not ceiling.empty:
                st.caption(
                    f"ε spent {eps['value'].iloc[-1]:.3g} of the budget "
                    f"{ceiling['value'].iloc[-1]:.3g}: the round that would pass "
                    "it is not run."
                )
        if not unbounded.empty:
            first = int(unbounded["round"].min())
            st.metric("Privacy spent (ε)", "unbounded")
            st.warning(
                f"ε is unbounded from round {first} on: the accountant can no "
                "longer bound the privacy loss (noise too small for the "
                "rounds run)."
            )

    st.subheader("Aggregator verdicts")
    if parts.empty:
        st.info("No updates yet.")
    else:
        common.show(charts.flags_heatmap(parts))
        if not (parts["verdict"].isin(["flagged", "excluded", "suspect"])).any():
            st.caption("No client has been flagged, excluded or found suspect.")

    with st.expander("Rounds", expanded=False):
        st.dataframe(rounds, hide_index=True)
    with st.expander("Events", expanded=bool(reason)):
        st.dataframe(data.events_frame(events), hide_index=True)


def render() -> None:
    st.title("Run detail")
    url = common.store_or_stop()
    try:
        runs = common.load_runs(url)
    except StoreError as exc:
        common.fail_softly(exc)
        return
    if runs.empty:
        st.info(
            "No runs in this database yet; start a coordinator and its run "
            "shows up here."
        )
        return
    run_id = common.pick_run(runs)

    def panel() -> None:
        try:
            _body(url, run_id)
        except StoreError as exc:
            common.fail_softly(exc)

    common.live(panel)


if __name__ == "__main__":
    render()

"""Run detail: state, progress, accuracy and loss, participants, traffic,
compression, privacy spent, any other metric the run recorded (picked by the
user) and the aggregator's per-client verdicts, round by round; a summary once
the run has ended."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd
import streamlit as st
from fedplat.ui import charts, common, data, live, recorded, status
from fedplat.ui.markup import code, plain

from fedplat.store import MetricRecord, RunRecord, StoreError
from fedplat.summary import FLAGGED_VERDICTS, RunSummary, export_command, format_bytes

FULL_SCALE_KEY = "fedplat_accuracy_full_scale"
METRICS_KEY = "fedplat_metrics"
SEPARATE_KEY = "fedplat_metrics_separate"


def _describe(run: RunRecord) -> str:
    cfg = run.config
    model = status.config_section(cfg, "model")
    dataset = status.config_section(cfg, "data")
    return (
        f"run id {code(run.id)} · aggregator "
        f"{code(status.config_section(cfg, 'aggregator').get('name', 'fedavg'))} · "
        f"model {code(model.get('factory') or model.get('name', '?'))} · "
        f"evaluation data {code(dataset.get('eval') or dataset.get('dataset', '?'))}"
    )


def _header(run: RunRecord, view: status.RunView, rounds_open: bool) -> None:
    common.run_title(run.name, view)
    st.caption(_describe(run))
    detail = plain(view.detail or "")
    if view.state == "failed":
        st.error(f"The run failed: {detail}")
    elif view.state == "interrupted":
        st.warning(f"**Interrupted.** {detail}", icon=":material/pause_circle:")
    elif view.state == "waiting":
        st.warning(
            f"**{plain(view.label.capitalize())}.** {detail}",
            icon=":material/hourglass_top:",
        )
    elif view.state == "completed" and run.reason:
        # e.g. a privacy budget that allowed no further round
        st.info(f"The run stopped early: {plain(run.reason)}")
    elif view.detail:
        st.caption(detail)
    done = run.current_round / run.total_rounds if run.total_rounds else 0.0
    label = f"round {run.current_round} of {run.total_rounds} completed"
    if rounds_open and view.state == "running":
        # Nothing of an open round is recorded until it closes; the
        # coordinator's heartbeat says what it is doing meanwhile.
        label += f"; round {run.current_round + 1} in progress"
        live = [run.phase.replace("_", " ")] if run.phase else []
        if run.live_clients is not None:
            live.append(f"{run.live_clients} clients live")
        if live:
            label += f" ({', '.join(live)})"
    st.progress(min(max(done, 0.0), 1.0), text=plain(label))


def _liveness(clients: pd.DataFrame) -> None:
    """One line of client states, and who was lost when."""
    if clients.empty:
        return
    counts = clients["state"].value_counts()
    parts = [
        f"{status.badge(s)} {int(counts[s])}"
        for s in status.CLIENT_STATES
        if s in counts
    ]
    st.markdown("**Clients** " + " ".join(parts))
    lost = clients[clients["state"] == "lost"]
    if not lost.empty:
        st.warning(
            "Lost (silent for longer than the liveness window): "
            + ", ".join(
                f"**{code(row.name)}** (last seen {plain(row.seen)})"
                for row in lost.itertuples()
            ),
            icon=":material/signal_disconnected:",
        )


def _accuracy_metric(
    col: Any, label: str, value: float | None, round_number: int | None
) -> None:
    col.metric(
        label,
        f"{value:.2%}" if value is not None else "-",
        help=f"round {round_number}" if round_number else None,
    )


def _summary(summary: RunSummary, view: status.RunView, url: str) -> None:
    title = "Summary" if view.ended else "Summary so far"
    with st.container(border=True):
        st.subheader(title)
        cols = st.columns(5)
        cols[0].metric("Rounds", f"{summary.rounds_completed} / {summary.total_rounds}")
        _accuracy_metric(
            cols[1], "Final accuracy", summary.final_accuracy, summary.accuracy_round
        )
        _accuracy_metric(
            cols[2], "Best accuracy", summary.best_accuracy, summary.best_round
        )
        cols[3].metric(
            "Traffic",
            format_bytes(summary.bytes_up + summary.bytes_down),
            help=f"{format_bytes(summary.bytes_up)} up, "
            f"{format_bytes(summary.bytes_down)} down",
        )
        eps, delta = summary.epsilon, summary.delta
        why: str | None
        if eps is None:
            shown, why = "-", "no differential privacy in this run"
        else:
            shown = "unbounded" if math.isinf(eps) else f"{eps:.3g}"
            why = f"spent at δ = {delta:g}" if delta is not None else None
        cols[4].metric("Privacy (ε)", shown, help=why)
        if summary.flagged:
            st.markdown(
                "**Flagged clients:** "
                + ", ".join(
                    f"{code(f.name)} ({plain('/'.join(f.verdicts))}, {f.rounds} "
                    f"round{'s' if f.rounds != 1 else ''})"
                    for f in summary.flagged
                )
            )
        else:
            st.markdown("**Flagged clients:** none")
        ledger = summary.ledger
        line = f"**Ledger:** {plain(ledger.state)}: {plain(ledger.message)}"
        if ledger.state == "broken":
            st.error(line)
        else:
            st.markdown(line)
        if summary.model_path is not None:
            st.markdown(
                f"**Model** (round {summary.final_round}): {code(summary.model_path)}"
            )
            command = export_command(summary, common.display_url(url))
            if command:
                st.code(command, language="bash")


def _accuracy(rounds: pd.DataFrame, completed: pd.DataFrame) -> None:
    if completed["accuracy"].notna().any():
        full = st.toggle(
            "Accuracy axis from 0 to 100%",
            key=FULL_SCALE_KEY,
            help="By default the axis is fitted to the accuracies reached.",
        )
        common.show(charts.accuracy_chart(rounds, full_scale=full))
    else:
        st.info(
            "No accuracy yet: the global model is evaluated when a round "
            "completes (every data.eval_every rounds)."
        )


def _privacy(metrics: Sequence[MetricRecord]) -> None:
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
            charts.metric_chart(eps, title="Privacy spent (ε) per round", y_title="ε")
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


def _metrics_row(run: RunRecord, rounds: pd.DataFrame, parts: pd.DataFrame) -> None:
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
        format_bytes(
            float(parts["bytes_up"].sum() + parts["bytes_down"].sum())
            if not parts.empty
            else 0.0
        ),
        help="bytes uploaded + downloaded by all clients so far",
    )


def _charts(
    rounds: pd.DataFrame, parts: pd.DataFrame, metrics: Sequence[MetricRecord]
) -> None:
    """Accuracy and loss, outcomes and traffic, compression and privacy."""
    completed = rounds[rounds["status"] == "completed"]
    left, right = st.columns(2)
    with left:
        _accuracy(rounds, completed)
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
        _privacy(metrics)


def _recorded(metrics: Sequence[MetricRecord], run_id: str) -> None:
    """Any round-level metrics the run recorded (AUC, F1, the app's own), picked
    by the user; evaluation metrics other than accuracy and loss by default."""
    st.subheader("Recorded metrics")
    names = recorded.run_metric_names(metrics)
    if not names:
        st.info("This run has recorded no round-level metrics yet.")
        return
    # Keyed by run: another run's picks may name metrics this one lacks.
    picked = st.multiselect(
        "Metrics",
        names,
        default=recorded.default_metric_picks(names),
        key=f"{METRICS_KEY}_{run_id}",
        help="Every metric the coordinator recorded per round (the evaluation's "
        "eval.*, compression, privacy, timings). Pick one or several.",
    )
    if not picked:
        st.caption("Pick one or more metrics to draw them per round.")
        return
    separate = st.toggle(
        "One panel per metric",
        key=SEPARATE_KEY,
        help="Each metric on its own y axis (for metrics of different scales).",
    )
    common.show(
        charts.metrics_chart(
            recorded.metrics_long(metrics, picked), independent=separate
        )
    )


def _body(url: str, run_id: str) -> None:
    run = common.load_run(url, run_id)
    view = common.load_run_view(url, run_id)
    if run is None or view is None:
        st.warning("This run is no longer in the store.")
        return
    rounds = common.load_rounds(url, run_id)
    parts = common.load_participations(url, run_id)
    metrics = common.load_metrics(url, run_id)
    events = common.load_events(url, run_id)
    clients = common.load_clients(url, run_id)
    open_round = bool((rounds["status"] == "open").any()) if not rounds.empty else False
    _header(run, view, open_round)
    _liveness(clients)
    if view.ended or view.state == "interrupted":
        _summary(common.load_summary(url, run_id), view, url)
    _metrics_row(run, rounds, parts)

    if rounds.empty:
        st.info(
            "No round has started yet: the coordinator waits until enough "
            "clients are live (selection.min_available)."
        )
        return

    _charts(rounds, parts, metrics)
    _recorded(metrics, run_id)

    st.subheader("Aggregator verdicts")
    if parts.empty:
        st.info("No updates yet.")
    else:
        common.show(charts.flags_heatmap(parts))
        if not parts["verdict"].isin(FLAGGED_VERDICTS).any():
            st.caption("No client has been flagged, excluded or found suspect.")

    with st.expander("Rounds", expanded=False):
        st.dataframe(rounds, hide_index=True)
    with st.expander("Events", expanded=view.state == "failed"):
        records = common.load_client_records(url, run_id)
        st.dataframe(data.events_frame(events, records), hide_index=True)


def render() -> None:
    st.title("Run detail")
    url = common.store_or_stop()
    runs = common.federated_runs(url)
    if runs is None:
        return
    run_id = common.pick_run(runs, everything=common.load_runs(url))

    def panel() -> None:
        try:
            _body(url, run_id)
        except StoreError as exc:
            common.fail_softly(exc)

    live.live_run(panel, url, run_id)


if __name__ == "__main__":
    render()

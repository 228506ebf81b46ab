"""Altair (Vega-Lite) charts of the monitor, built from the frames of :mod:`.data`.

Pure functions from a DataFrame to a chart: no Streamlit, so tests can inspect
the spec (``chart.to_dict()``) directly. Rounds are integers, so every round axis
uses ``tickMinStep=1`` and an integer format, or Vega would label 1.5, 2.5, ...

Legends sit on the right: Streamlit sizes charts with ``autosize: fit``, so a
legend below the plot is taken out of the chart's height and a many-entry legend
can squash the plot to nothing.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd
from fedplat.ui.data import OUTCOME_COLORS, OUTCOMES, VERDICT_COLORS, VERDICTS

Chart = alt.Chart | alt.LayerChart

_ROUND_AXIS = alt.Axis(format="d", tickMinStep=1)
# Streamlit's chart theme hides axis labels that come close to each other
# (labelOverlap); on an axis of client names every row must keep its label.
_CLIENT_AXIS = alt.Axis(labelOverlap=False, labelLimit=240, labelFontSize=11)


def _round_x(title: str = "round") -> alt.X:
    return alt.X("round:Q", title=title, axis=_ROUND_AXIS)


def _present_scale(
    values: pd.Series, domain: tuple[str, ...], colors: tuple[str, ...]
) -> alt.Scale:
    """A colour scale over the categories present, in their fixed order and with
    their fixed colours: a category keeps its colour across charts and runs, and
    the legend lists only what is on screen."""
    present = set(values.dropna())
    pairs = [(d, c) for d, c in zip(domain, colors, strict=True) if d in present]
    return alt.Scale(domain=[d for d, _ in pairs], range=[c for _, c in pairs])


def line_chart(
    frame: pd.DataFrame,
    *,
    y: str,
    title: str,
    y_title: str,
    y_format: str = ".4~f",
    axis_format: str | None = None,
    domain: tuple[float, float] | None = None,
    color: str = "#1f77b4",
) -> alt.Chart:
    """A per-round line with a point on every round (``frame``: ``round, y``).

    Points are drawn even on long runs: a single completed round would otherwise
    be an invisible zero-length line. ``y_format`` formats tooltips and, unless
    ``axis_format`` is given, the axis; ``axis_format=""`` leaves the axis to
    Vega, which picks the precision from the tick step.
    """
    scale = alt.Scale(domain=list(domain)) if domain else alt.Scale(zero=False)
    tick_format = y_format if axis_format is None else axis_format
    axis = alt.Axis(format=tick_format) if tick_format else alt.Axis()
    return (
        alt.Chart(frame, title=title)
        .mark_line(
            point=alt.OverlayMarkDef(size=50, filled=True, color=color), color=color
        )
        .encode(
            x=_round_x(),
            y=alt.Y(f"{y}:Q", title=y_title, scale=scale, axis=axis),
            tooltip=[
                alt.Tooltip("round:Q", format="d"),
                alt.Tooltip(f"{y}:Q", title=y_title, format=y_format),
            ],
        )
        .properties(height=260)
    )


def accuracy_chart(rounds: pd.DataFrame, *, full_scale: bool = False) -> alt.Chart:
    """Global test accuracy per round (``rounds_frame`` rows with an accuracy).

    The axis is fitted to the data (a run moving between 76% and 80% is not a
    flat line at the top of a 0-100% axis); ``full_scale`` shows 0-100%.
    """
    data = rounds.dropna(subset=["accuracy"])[["round", "accuracy"]]
    return line_chart(
        data,
        y="accuracy",
        title="Global accuracy",
        y_title="accuracy",
        y_format=".1%",
        domain=(0.0, 1.0) if full_scale else None,
        color="#2e7d32",
    )


def loss_chart(rounds: pd.DataFrame) -> alt.Chart:
    """Global test loss per round."""
    data = rounds.dropna(subset=["loss"])[["round", "loss"]]
    return line_chart(
        data, y="loss", title="Global loss", y_title="loss", color="#c62828"
    )


def outcomes_chart(counts: pd.DataFrame) -> alt.Chart:
    """Stacked bars: participants, stragglers and rejected updates per round."""
    return (
        alt.Chart(counts, title="Clients per round by outcome")
        .mark_bar()
        .encode(
            x=alt.X("round:O", title="round", axis=alt.Axis(labelAngle=0)),
            y=alt.Y("clients:Q", title="clients", axis=alt.Axis(tickMinStep=1)),
            color=alt.Color(
                "outcome:N",
                scale=_present_scale(counts["outcome"], OUTCOMES, OUTCOME_COLORS),
                legend=alt.Legend(title="outcome", orient="right"),
            ),
            order=alt.Order("outcome:N"),
            tooltip=["round:O", "outcome:N", "clients:Q"],
        )
        .properties(height=260)
    )


def traffic_chart(traffic: pd.DataFrame) -> alt.Chart:
    """Grouped bars: bytes uploaded and downloaded per round."""
    return (
        alt.Chart(traffic, title="Traffic per round")
        .mark_bar()
        .encode(
            x=alt.X("round:O", title="round", axis=alt.Axis(labelAngle=0)),
            xOffset=alt.XOffset("direction:N", sort=["up", "down"]),
            y=alt.Y("bytes:Q", title="bytes", axis=alt.Axis(format="~s")),
            color=alt.Color(
                "direction:N",
                scale=alt.Scale(domain=["up", "down"], range=["#6a1b9a", "#0277bd"]),
                legend=alt.Legend(title="direction", orient="right"),
            ),
            tooltip=[
                "round:O",
                "direction:N",
                alt.Tooltip("bytes:Q", format=",d"),
            ],
        )
        .properties(height=260)
    )


def flags_heatmap(parts: pd.DataFrame) -> alt.Chart:
    """Clients x rounds, coloured by the aggregator's verdict on each update."""
    n_clients = max(1, parts["client"].nunique()) if not parts.empty else 1
    tooltip: list[Any] = [
        "client:N",
        alt.Tooltip("client_id:N", title="client id"),
        "round:O",
        "verdict:N",
        "status:N",
        alt.Tooltip("score:Q", format=".4g"),
        alt.Tooltip("weight:Q", format=".4g"),
        "flags:N",
        "reason:N",
    ]
    return (
        alt.Chart(parts, title="Aggregator verdict per client and round")
        .mark_rect(stroke="white", strokeWidth=0.5)
        .encode(
            x=alt.X("round:O", title="round", axis=alt.Axis(labelAngle=0)),
            y=alt.Y("client:N", title=None, sort="ascending", axis=_CLIENT_AXIS),
            color=alt.Color(
                "verdict:N",
                scale=_present_scale(parts["verdict"], VERDICTS, VERDICT_COLORS),
                legend=alt.Legend(title="verdict", orient="right"),
            ),
            tooltip=tooltip,
        )
        # 20 px per client keeps every row's label legible; past 200 clients
        # (4000 px) rows get thinner and labels crowd, but none is dropped.
        .properties(height=max(180, min(20 * n_clients, 4000)))
    )


def metric_chart(series: pd.DataFrame, *, title: str, y_title: str) -> alt.Chart:
    """A ``round, value`` series (epsilon, compression ratio, ...).

    The axis keeps Vega's own tick labels: a fixed 4 significant digits prints
    "3.167" three times over a ratio that moves in the fourth decimal.
    """
    return line_chart(
        series,
        y="value",
        title=title,
        y_title=y_title,
        y_format=".6~g",
        axis_format="",
    )


def metrics_chart(
    long: pd.DataFrame, *, independent: bool = False
) -> alt.Chart | alt.FacetChart:
    """One line per metric over the rounds (``long``: ``round, metric, value``,
    :func:`fedplat.ui.recorded.metrics_long`), coloured by metric.

    The y axis is fitted to the values (AUC and F1 between 0.9 and 1 are not
    flat lines at the top of a 0-1 axis); ``independent`` gives each metric a
    panel of its own, for metrics of different scales (AUC beside seconds).
    """
    base = alt.Chart(long).mark_line(point=alt.OverlayMarkDef(size=40, filled=True))
    encoded = base.encode(
        x=_round_x(),
        y=alt.Y("value:Q", title="value", scale=alt.Scale(zero=False)),
        color=alt.Color("metric:N", legend=alt.Legend(title="metric", orient="right")),
        tooltip=[
            alt.Tooltip("round:Q", format="d"),
            alt.Tooltip("metric:N"),
            alt.Tooltip("value:Q", format=".6~g"),
        ],
    )
    if not independent:
        return encoded.properties(title="Recorded metrics per round", height=260)
    return (
        encoded.properties(height=140)
        .facet(row=alt.Row("metric:N", title=None), title="Recorded metrics per round")
        .resolve_scale(y="independent")
    )


def contribution_bar(board: pd.DataFrame, column: str, title: str) -> alt.Chart:
    """Horizontal bars of one leaderboard column, best first."""
    data = board.dropna(subset=[column])
    fmt = ".1%" if column == "reward_share" else ".4~g"
    return (
        alt.Chart(data, title=title)
        .mark_bar(color="#00897b")
        .encode(
            x=alt.X(
                f"{column}:Q", title=column.replace("_", " "), axis=alt.Axis(format=fmt)
            ),
            y=alt.Y("client:N", sort="-x", title=None, axis=_CLIENT_AXIS),
            tooltip=[
                "client:N",
                alt.Tooltip("client_id:N", title="client id"),
                alt.Tooltip(f"{column}:Q", format=fmt),
            ],
        )
        .properties(height=max(120, min(26 * len(data), 900)))
    )


def score_over_rounds(per_round: pd.DataFrame) -> alt.Chart:
    """Cumulative contribution score of each client over rounds."""
    return (
        alt.Chart(per_round, title="Cumulative contribution score")
        .mark_line(point=True)
        .encode(
            x=_round_x(),
            y=alt.Y("cumulative:Q", title="cumulative score"),
            color=alt.Color("client:N", legend=alt.Legend(orient="right")),
            tooltip=[
                "client:N",
                alt.Tooltip("client_id:N", title="client id"),
                alt.Tooltip("round:Q", format="d"),
                alt.Tooltip("score:Q", format=".4g"),
                alt.Tooltip("cumulative:Q", format=".4g"),
            ],
        )
        .properties(height=300)
    )


def gossip_graph_chart(nodes: pd.DataFrame, edges: pd.DataFrame) -> alt.LayerChart:
    """The topology: live links solid, cut links dashed red, dead nodes as grey
    crosses, live nodes coloured by test accuracy (relay nodes, which hold no
    data, as squares)."""
    axis_off = alt.Axis(labels=False, ticks=False, grid=False, domain=False, title=None)
    x = alt.X("x:Q", axis=axis_off, scale=alt.Scale(domain=[-0.05, 1.05]))
    y = alt.Y("y:Q", axis=axis_off, scale=alt.Scale(domain=[-0.05, 1.05]))
    link_states = ["up", "cut", "dead node"]
    links = (
        alt.Chart(edges)
        .mark_rule()
        .encode(
            x=x,
            y=y,
            x2="x2:Q",
            y2="y2:Q",
            color=alt.Color(
                "state:N",
                scale=alt.Scale(
                    domain=link_states, range=["#90a4ae", "#e53935", "#bdbdbd"]
                ),
                legend=alt.Legend(title="link", orient="right"),
            ),
            strokeDash=alt.StrokeDash(
                "state:N",
                scale=alt.Scale(domain=link_states, range=[[1, 0], [6, 4], [2, 2]]),
                legend=None,
            ),
            strokeWidth=alt.condition(
                alt.datum.state == "cut", alt.value(2.5), alt.value(1.2)
            ),
            tooltip=["u:N", "v:N", "state:N"],
        )
    )
    alive = nodes[nodes["state"] == "alive"]
    dead = nodes[nodes["state"] == "dead"]
    node_tooltip: list[Any] = [
        "node:N",
        "state:N",
        "role:N",
        alt.Tooltip("accuracy:Q", format=".1%"),
        "degree:Q",
    ]
    live_points = (
        alt.Chart(alive)
        .mark_point(size=160, filled=True, stroke="#263238", strokeWidth=0.8, opacity=1)
        .encode(
            x=x,
            y=y,
            shape=alt.Shape(
                "role:N",
                scale=alt.Scale(domain=["data", "relay"], range=["circle", "square"]),
                legend=alt.Legend(title="node", orient="right"),
            ),
            color=alt.Color(
                "accuracy:Q",
                scale=alt.Scale(scheme="viridis", domain=[0, 1]),
                legend=alt.Legend(title="accuracy", format=".0%"),
            ),
            tooltip=node_tooltip,
        )
    )
    dead_points = (
        alt.Chart(dead)
        .mark_point(shape="cross", size=180, filled=True, color="#757575")
        .encode(x=x, y=y, tooltip=node_tooltip)
    )
    labels = (
        alt.Chart(nodes)
        .mark_text(dy=-12, fontSize=10, color="#37474f")
        .encode(x=x, y=y, text="node:N")
    )
    layers: list[Any] = [links, live_points, dead_points]
    if len(nodes) <= 60:  # labels of larger graphs overlap into noise
        layers.append(labels)
    return (
        alt.layer(*layers)
        .properties(height=520, title="Topology")
        .resolve_scale(color="independent")
    )


def gossip_series_chart(series: pd.DataFrame, round_number: int) -> alt.ConcatChart:
    """One small chart per run-level gossip metric, each with a dashed rule at the
    round picked on the slider."""
    rule_data = pd.DataFrame({"round": [round_number]})
    panels = []
    for metric, frame in series.groupby("metric", sort=True):
        line = (
            alt.Chart(frame, title=str(metric).replace("_", " "))
            .mark_line(point=True)
            .encode(
                x=_round_x(),
                y=alt.Y(
                    "value:Q",
                    title=None,
                    scale=alt.Scale(zero=False),
                    # Component counts are whole numbers; don't tick 1.5.
                    axis=alt.Axis(format="~g", tickMinStep=1)
                    if metric == "components"
                    else alt.Axis(format="~g"),
                ),
                tooltip=[
                    alt.Tooltip("round:Q", format="d"),
                    alt.Tooltip("value:Q", format=".4g"),
                ],
            )
        )
        rule = (
            alt.Chart(rule_data)
            .mark_rule(color="#e53935", strokeDash=[4, 3])
            .encode(x="round:Q")
        )
        panels.append(alt.layer(line, rule).properties(height=160, width=320))
    return alt.concat(*panels, columns=2)


__all__ = [
    "Chart",
    "accuracy_chart",
    "contribution_bar",
    "flags_heatmap",
    "gossip_graph_chart",
    "gossip_series_chart",
    "line_chart",
    "loss_chart",
    "metric_chart",
    "outcomes_chart",
    "score_over_rounds",
    "traffic_chart",
]

"""The monitor's data shaping and charts, without Streamlit: small hand-checkable
inputs, mostly records built directly."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from fedplat.ui import charts, data, display_url, graph, ledger

from fedplat.cli import build_parser
from fedplat.store import (
    ContributionRecord,
    EventRecord,
    MetricRecord,
    RunRecord,
    Store,
    Verdict,
)
from fedplat.store.engine import make_engine
from tests.support.ui_fixture import build_fixture_db

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def metric(
    name: str, value: float, rnd: int | None, client: str | None = None, i: int = 0
) -> MetricRecord:
    return MetricRecord(i, "run", rnd, client, name, value, NOW)


def event(kind: str, rnd: int, i: int = 0, **details: Any) -> EventRecord:
    return EventRecord(i, "run", rnd, None, kind, "info", kind, details, NOW)


def run_record(config: dict[str, Any], current: int = 0) -> RunRecord:
    return RunRecord(
        "run", "r", "running", config, {}, 10, current, None, NOW, NOW, None
    )


def _contribution(suspect: bool, flags: tuple[str, ...] = ()) -> ContributionRecord:
    return ContributionRecord("run", 1, "c", None, {}, suspect, flags)


@pytest.mark.parametrize(
    ("status", "v", "contribution", "expected"),
    [
        ("succeeded", Verdict(), None, "not aggregated"),
        ("succeeded", Verdict(1.0, True, 1.0), None, "accepted"),
        ("succeeded", Verdict(1.0, True, None, ("clipped",)), None, "flagged"),
        ("succeeded", Verdict(0.0, False, None, ("krum",)), None, "excluded"),
        ("succeeded", Verdict(0.0, False), _contribution(True), "suspect"),
        ("succeeded", Verdict(1.0, True), _contribution(False), "accepted"),
        ("late", Verdict(), None, "straggler"),
        ("dropped", Verdict(), None, "straggler"),
        ("rejected", Verdict(), None, "rejected"),
        # Written at close: a client still "downloaded" never sent its update.
        ("downloaded", Verdict(), None, "straggler"),
        ("selected", Verdict(), None, "straggler"),
    ],
)
def test_verdict(
    status: str, v: Verdict, contribution: ContributionRecord | None, expected: str
) -> None:
    assert data.verdict(status, v, contribution) == expected


def test_flag_labels_merge_without_aggregator_duplicates() -> None:
    v = Verdict(1.0, True, None, ("clipped",))
    c = _contribution(False, ("agg:clipped", "zero-update", "clipped"))
    assert data.flag_labels(v, c) == ["clipped", "zero-update"]


def test_round_series_prefers_run_level_and_last_write() -> None:
    ms = [
        metric("x", 1.0, 1, "a"),
        metric("x", 3.0, 1, "b"),
        metric("x", 5.0, 2, "a"),
        metric("y", 9.0, 1),
    ]
    assert data.round_series(ms, "x").to_dict("list") == {
        "round": [1, 2],
        "value": [2.0, 5.0],
    }
    ms += [metric("x", 7.0, 1), metric("x", 8.0, 1), metric("x", 1.0, None)]
    # Run-level values win; a recomputed value replaces the earlier one.
    assert data.round_series(ms, "x").to_dict("list") == {"round": [1], "value": [8.0]}
    assert data.round_series(ms, "missing").empty


def test_latest_per_client() -> None:
    ms = [
        metric("s", 0.1, 2, "a", i=1),
        metric("s", 0.5, 1, "a", i=2),  # older round written later
        metric("s", 0.3, 1, "b", i=3),
    ]
    assert data.latest_per_client(ms, "s") == {"a": 0.1, "b": 0.3}


def test_filter_clients() -> None:
    frame = pd.DataFrame(
        {
            "client_id": ["a1", "b2", "c3"],
            "name": ["alpha", "Beta", "gamma"],
            "status": ["active", "idle", "banned"],
            "rounds_joined": [5, 2, 0],
            "flagged_rounds": [0, 1, 3],
        }
    )

    def ids(f: data.ClientFilter) -> list[str]:
        return list(data.filter_clients(frame, f)["client_id"])

    assert ids(data.ClientFilter()) == ["a1", "b2", "c3"]
    assert ids(data.ClientFilter(statuses=("idle", "banned"))) == ["b2", "c3"]
    assert ids(data.ClientFilter(name_contains=" beta ")) == ["b2"]
    assert ids(data.ClientFilter(name_contains="3")) == ["c3"]
    assert ids(data.ClientFilter(min_rounds_joined=2)) == ["a1", "b2"]
    assert ids(data.ClientFilter(flagged_only=True, min_rounds_joined=1)) == ["b2"]


def test_formatting() -> None:
    assert data.format_bytes(None) == "-"
    assert data.format_bytes(512) == "512 B"
    assert data.format_bytes(1536) == "1.5 KiB"
    assert data.format_bytes(3 * 1024**3) == "3.0 GiB"
    assert data.format_duration(59.6) == "1m 0s"
    assert data.format_duration(3725) == "1h 2m"
    assert data.format_duration(None) == "-"


def test_display_url_hides_passwords() -> None:
    assert display_url("runs/x.db") == "runs/x.db"
    shown = display_url("postgresql+psycopg://fl:secret@127.0.0.1:5432/db")
    assert "secret" not in shown and "fl:***@" in shown


def test_failure_reason_prefers_the_error_event() -> None:
    failed = RunRecord("r", "r", "failed", {}, {}, 3, 0, None, NOW, NOW, NOW)
    events = [
        EventRecord(2, "r", 1, None, "run_failed", "error", "gave up", {}, NOW),
        EventRecord(1, "r", 1, None, "round_failed", "warning", "quorum", {}, NOW),
    ]
    assert data.failure_reason(failed, events) == "gave up"
    assert data.failure_reason(failed, events[1:]) == "quorum"
    assert "no error event" in str(data.failure_reason(failed, []))
    assert data.failure_reason(run_record({}), events) is None


# --------------------------------------------------------------------------- #
# Gossip                                                                       #
# --------------------------------------------------------------------------- #

RING = {
    "nodes": ["0", "1", "2", "3"],
    "edges": [["0", "1"], ["1", "2"], ["2", "3"], ["3", "0"]],
}


def test_topology_from_config() -> None:
    topo = graph.gossip_topology(run_record({"mode": "gossip", "topology": RING}))
    assert topo is not None
    assert topo.nodes == ("0", "1", "2", "3")
    assert topo.edges == (("0", "1"), ("0", "3"), ("1", "2"), ("2", "3"))
    xy = np.array(list(topo.positions.values()))
    assert xy.min() >= 0.0 and xy.max() <= 1.0
    # Deterministic: the graph does not jump between refreshes.
    again = graph.gossip_topology(run_record({"mode": "gossip", "topology": RING}))
    assert again is not None and again.positions == topo.positions
    assert graph.gossip_topology(run_record({"mode": "gossip"})) is None


def test_topology_keeps_given_positions_and_relays() -> None:
    cfg = {
        "topology": {
            "edges": [[0, 1]],
            "positions": {"0": [0.1, 0.2], "1": [0.9, 0.8]},
            "relay": [1],
        }
    }
    topo = graph.gossip_topology(run_record(cfg))
    assert topo is not None
    assert topo.nodes == ("0", "1")  # taken from the edge list
    assert topo.positions == {"0": (0.1, 0.2), "1": (0.9, 0.8)}
    assert topo.relay == frozenset({"1"})


def test_spring_layout_separates_nodes() -> None:
    nodes = [str(i) for i in range(30)]
    edges = [(str(i), str((i + 1) % 30)) for i in range(30)]
    pos = np.array(list(graph.spring_layout(nodes, edges).values()))
    gaps = np.linalg.norm(pos[:, None] - pos[None], axis=-1) + np.eye(30)
    assert gaps.min() > 0.01


def test_graph_state_applies_changes_after_their_round() -> None:
    events = [
        event("gossip_node_removed", 2, 1, nodes=["3"], edges=[]),
        event("gossip_partition", 2, 2, nodes=[], edges=[["1", "0"]], groups=[]),
        event("gossip_heal", 3, 3, nodes=[], edges=[["0", "1"]]),
        event("gossip_node_rejoined", 4, 4, nodes=["3"], edges=[]),
        event("gossip_link_bytes", 5, 5, links={"0-1": 10}),  # not a graph change
        event("round_completed", 1, 6),
    ]
    assert graph.graph_state(events, 2).dead == frozenset()  # still intact
    during3 = graph.graph_state(events, 3)
    assert during3.dead == {"3"} and during3.cut == {("0", "1")}
    assert len(during3.changes) == 2
    during4 = graph.graph_state(events, 4)
    assert during4.dead == {"3"} and during4.cut == frozenset()
    assert graph.graph_state(events, 5).dead == frozenset()


def test_graph_frames_and_components() -> None:
    topo = graph.gossip_topology(run_record({"topology": RING}))
    assert topo is not None
    state = graph.GraphState(3, frozenset({"2"}), frozenset({("0", "1")}), ())
    nodes, edges = graph.gossip_graph_frames(topo, state, {"0": 0.9})
    by_edge = {
        (u, v): s
        for u, v, s in zip(edges["u"], edges["v"], edges["state"], strict=True)
    }
    assert by_edge == {
        ("0", "1"): "cut",
        ("0", "3"): "up",
        ("1", "2"): "dead node",
        ("2", "3"): "dead node",
    }
    indexed = nodes.set_index("node")
    assert indexed.loc["2", "state"] == "dead"
    assert indexed.loc["0", "accuracy"] == 0.9
    assert indexed.loc["0", "degree"] == 1
    # 0-3 connected; 1 isolated (its links are cut or lead to the dead node).
    assert graph.live_components(topo, state) == 2


def test_node_accuracy_at_uses_the_latest_evaluation() -> None:
    ms = [
        metric("gossip.accuracy", 0.5, 2, "0"),
        metric("gossip.accuracy", 0.7, 4, "0"),
        metric("gossip.accuracy", 0.6, 2, "1"),
    ]
    assert graph.node_accuracy_at(ms, 3) == {"0": 0.5, "1": 0.6}
    assert graph.node_accuracy_at(ms, 4) == {"0": 0.7, "1": 0.6}
    assert graph.node_accuracy_at(ms, 1) == {}


# --------------------------------------------------------------------------- #
# Contributions and ledger                                                     #
# --------------------------------------------------------------------------- #


def test_contributions_from_metrics_sum_scores() -> None:
    ms = [
        metric("contribution.score", 0.2, 1, "a"),
        metric("contribution.score", 0.3, 2, "a"),
        metric("contribution.score", 0.1, 1, "b"),
        metric("contribution.reward_share", 0.8, 2, "a"),
        metric("contribution.reward_share", 0.2, 2, "b"),
    ]
    found = ledger.contributions([], (), ms)
    assert found.source == "metrics"
    board = found.board.set_index("client_id")
    assert board.loc["a", "cumulative_score"] == pytest.approx(0.5)
    assert board.loc["a", "rank"] == 1
    assert board.loc["b", "reward_share"] == 0.2
    assert list(found.per_round["cumulative"]) == pytest.approx([0.2, 0.5, 0.1])
    assert ledger.contributions([], (), []).source is None


def test_ledger_state_on_the_fixture(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    ids = build_fixture_db(path)
    engine = make_engine(str(path))
    with Store(str(path), migrate=False) as store:
        assert ledger.missing_ledger_tables(engine) == []
        ok = ledger.verify_ledger(store, engine, ids["digits-done"])
        assert ok.state == "verified" and ok.entries == 12 and ok.signed
        assert ledger.verify_ledger(store, engine, ids["digits-live"]).state == "empty"
        found = ledger.contributions(
            store.list_clients(ids["digits-done"]),
            store.list_ledger_entries(ids["digits-done"]),
        )
    engine.dispose()
    assert found.source == "ledger"
    board = found.board.set_index("client_id")
    assert board.loc["c2", "flagged_rounds"] == 1
    assert board.loc["c2", "cumulative_score"] == pytest.approx(0.6)
    assert board["reward_share"].sum() == pytest.approx(1.0)


def test_ledger_frame_marks_problem_entries() -> None:
    check = ledger.LedgerCheck(
        "broken",
        "1 problem",
        problems=(ledger.LedgerProblemRow("edited", "entry seq 2 was edited", 2),),
    )
    assert check.first_bad_seq == 2
    frame = ledger.ledger_frame([], check)
    assert frame.empty and "problem" in frame.columns


# --------------------------------------------------------------------------- #
# Charts and CLI                                                               #
# --------------------------------------------------------------------------- #


def test_charts_fix_colours_by_meaning() -> None:
    counts = pd.DataFrame(
        {"round": [1, 1], "outcome": ["succeeded", "rejected"], "clients": [3, 1]}
    )
    spec = charts.outcomes_chart(counts).to_dict()
    scale = spec["encoding"]["color"]["scale"]
    # Only what is present, in the fixed order, with the fixed colours.
    assert scale["domain"] == ["succeeded", "rejected"]
    assert scale["range"] == [data.OUTCOME_COLORS[0], data.OUTCOME_COLORS[2]]


def test_accuracy_chart_has_a_point_per_round() -> None:
    rounds = pd.DataFrame({"round": [1, 2], "accuracy": [0.5, None], "loss": [1, 1]})
    chart = charts.accuracy_chart(rounds)
    spec = chart.to_dict()
    assert spec["mark"]["point"]["filled"] is True
    assert spec["encoding"]["x"]["axis"]["tickMinStep"] == 1
    assert len(chart.data) == 1  # rounds without an evaluation are left out


def test_monitor_subcommand_is_registered() -> None:
    args = build_parser().parse_args(["monitor", "--db", "x.db", "--port", "9"])
    assert isinstance(args, argparse.Namespace)
    assert (args.db, args.port, args.address) == ("x.db", 9, "127.0.0.1")


def test_rounds_frame_counts_from_participations() -> None:
    from fedplat.store import ParticipationRecord, RoundRecord

    # A store from before schema 0003: the round was totalled when it closed,
    # before its third accepted update was recorded.
    closed = RoundRecord(
        id=1, run_id="run", number=1, status="completed", started_at=NOW,
        finished_at=NOW, deadline_at=None, num_selected=3, num_succeeded=2,
        num_failed=1, accuracy=0.9, loss=0.1, model_version=1, checkpoint_path=None,
        checkpoint_sha256=None, bytes_up=20, bytes_down=30, reason=None,
    )  # fmt: skip
    parts = [
        ParticipationRecord(
            i,
            "run",
            1,
            f"c{i}",
            "succeeded",
            10,
            10,
            5,
            1.0,
            None,
            Verdict(),
            None,
            NOW,
        )
        for i in range(3)
    ]
    row = data.rounds_frame([closed], parts).iloc[0]
    assert (row["succeeded"], row["failed"], row["bytes_up"]) == (3, 0, 30)
    # Without participations, the round's own totals stand.
    row = data.rounds_frame([closed], []).iloc[0]
    assert (row["succeeded"], row["failed"], row["bytes_up"]) == (2, 1, 20)
    # Every status that is not a success counts as failed, as the store counts.
    statuses = ["succeeded", "downloaded", "late", "rejected"]
    mixed = [
        ParticipationRecord(
            i, "run", 1, f"c{i}", s, 1, 2, 5, None, None, Verdict(), None, NOW
        )
        for i, s in enumerate(statuses)
    ]
    row = data.rounds_frame([closed], mixed).iloc[0]
    assert (row["succeeded"], row["failed"], row["bytes_down"]) == (1, 3, 8)

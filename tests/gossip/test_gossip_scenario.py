"""Topologies, scenario files (validation with clear errors) and their replay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import networkx as nx
import pytest
import yaml

from fedplat.gossip import topology as topo
from fedplat.gossip.network import NetworkState
from fedplat.gossip.scenario import ScenarioError, load_scenario, parse_scenario
from tests.support import REPO

EXAMPLES = REPO / "examples" / "scenarios"


def _scenario(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "t",
        "rounds": 10,
        "topology": {"kind": "ring", "n": 8},
    }
    base.update(over)
    return base


# ------------------------------------------------------------------ topologies


def test_topologies_have_integer_nodes_and_expected_shape() -> None:
    ba = topo.build_topology("barabasi_albert", n=100, m=2, seed=3)
    assert sorted(ba.nodes()) == list(range(100))
    assert ba.number_of_edges() == 2 * (100 - 2)  # m edges per node after m seeds
    assert nx.is_connected(ba)
    assert topo.edge_list(topo.ring(5)) == [[0, 1], [0, 4], [1, 2], [2, 3], [3, 4]]
    assert topo.ring(6, k=2).number_of_edges() == 12
    g = topo.grid(3, 4)
    assert g.number_of_edges() == 3 * 3 + 2 * 4 and g.has_edge(0, 4)
    rg = topo.random_geometric(50, 0.3, seed=1)
    assert all("pos" in rg.nodes[v] for v in rg)
    er = topo.erdos_renyi(30, 0.0, seed=0)
    assert er.number_of_edges() == 0 and topo.components(er) == 30
    e = topo.from_edges(4, [[0, 1], [2, 3]])
    assert topo.components(e) == 2
    a = topo.adjacency(e)
    assert a.tolist()[0] == [False, True, False, False] and bool((a == a.T).all())


def test_random_topologies_repeat_with_seed() -> None:
    g1 = topo.build_topology("erdos_renyi", n=40, p=0.1, seed=7)
    g2 = topo.build_topology("erdos_renyi", n=40, p=0.1, seed=7)
    assert topo.edge_list(g1) == topo.edge_list(g2)


@pytest.mark.parametrize(
    ("kind", "params", "msg"),
    [
        ("hypercube", {"n": 4}, "unknown topology 'hypercube'"),
        ("ring", {"n": 5, "q": 1}, "does not take \\['q'\\]"),
        ("barabasi_albert", {"n": 5, "m": 5}, "1 <= m < n"),
        ("edges", {"n": 3, "edges": [[0, 3]]}, "outside 0..2"),
        ("edges", {"n": 3, "edges": [[1, 1]]}, "self-loop"),
        ("random_geometric", {"n": 3, "radius": 0}, "radius > 0"),
    ],
)
def test_bad_topologies_name_the_problem(
    kind: str, params: dict[str, Any], msg: str
) -> None:
    with pytest.raises(topo.TopologyError, match=msg):
        topo.build_topology(kind, **params)


# ------------------------------------------------------------------- scenarios


def test_example_scenarios_load() -> None:
    files = sorted(EXAMPLES.glob("*.yaml")) + sorted(EXAMPLES.glob("*.toml"))
    assert files, "examples/scenarios is empty"
    for f in files:
        s = load_scenario(f)
        assert s.rounds >= 1


def test_toml_and_yaml_are_equivalent(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text(
        'name = "t"\nrounds = 5\n[topology]\nkind = "ring"\nn = 6\n'
        '[[events]]\nround = 2\naction = "remove_nodes"\nnodes = [1]\n'
    )
    data = {
        "name": "t",
        "rounds": 5,
        "topology": {"kind": "ring", "n": 6},
        "events": [{"round": 2, "action": "remove_nodes", "nodes": [1]}],
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    assert load_scenario(tmp_path / "s.toml") == load_scenario(tmp_path / "s.yaml")


@pytest.mark.parametrize(
    ("over", "msg"),
    [
        ({"rounds": 0}, "rounds: Input should be greater than or equal to 1"),
        ({"colour": "red"}, "colour: Extra inputs are not permitted"),
        ({"training": {"lr": 0}}, "training.lr: Input should be greater than 0"),
        ({"training": {"momentum": 0.9}}, "training: .*plain SGD"),
        ({"training": {"optimizer": "adam"}}, "training: .*plain SGD"),
        ({"topology": {"kind": "ring", "n": 8, "m": 2}}, "does not take \\['m'\\]"),
        (
            {"mixing": {"rule": "gossip"}},
            "mixing.rule: unknown mixing rule 'gossip'; available: "
            "clipped_gossip, decavg",
        ),
        ({"events": [{"round": 1, "action": "explode"}]}, "does not match any of the"),
        (
            {"events": [{"round": 1, "action": "remove_nodes"}]},
            "give exactly one of nodes and target",
        ),
        (
            {
                "events": [
                    {
                        "round": 1,
                        "action": "remove_nodes",
                        "target": {"by": "degree", "fraction": 0.1, "count": 2},
                    }
                ]
            },
            "give exactly one of fraction and count",
        ),
        (
            {
                "events": [
                    {
                        "round": 1,
                        "action": "remove_nodes",
                        "target": {"by": "pagerank", "count": 2},
                    }
                ]
            },
            "events.0.remove_nodes.target.by",
        ),
        (
            {"events": [{"round": 1, "action": "remove_nodes", "nodes": [9]}]},
            "events.0 \\(remove_nodes\\): nodes \\[9\\] do not exist",
        ),
        ({"events": [{"round": 10, "action": "heal"}]}, "round 10 is not before"),
        (
            {"events": [{"round": 1, "action": "cut_links", "edges": [[0, 4]]}]},
            "link \\[0, 4\\] is not in the topology",
        ),
        (
            {"events": [{"round": 1, "action": "partition", "groups": [[0, 1]]}]},
            "groups must cover every node",
        ),
        (
            {"events": [{"round": 1, "action": "battery", "nodes": [1]}]},
            "lifetime: Field required",
        ),
        (
            {
                "events": [
                    {
                        "round": 1,
                        "action": "partition",
                        "parts": 2,
                        "method": "geometric",
                    }
                ]
            },
            "needs a random_geometric",
        ),
    ],
)
def test_invalid_scenarios_fail_with_clear_errors(
    over: dict[str, Any], msg: str
) -> None:
    with pytest.raises(ScenarioError, match=msg):
        parse_scenario(_scenario(**over), "s.yaml")


def test_load_scenario_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="does not exist"):
        load_scenario(tmp_path / "nope.yaml")
    (tmp_path / "s.json").write_text("{}")
    with pytest.raises(ScenarioError, match=r"use \.toml, \.yaml or \.yml"):
        load_scenario(tmp_path / "s.json")
    (tmp_path / "bad.yaml").write_text("name: [unclosed")
    with pytest.raises(ScenarioError, match="cannot parse"):
        load_scenario(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ScenarioError, match="mapping at the top level"):
        load_scenario(tmp_path / "list.yaml")


# ---------------------------------------------------------------------- replay


def test_remove_top_degree_hubs_and_rejoin() -> None:
    s = parse_scenario(
        _scenario(
            topology={"kind": "barabasi_albert", "n": 30, "m": 2},
            events=[
                {
                    "round": 2,
                    "action": "remove_nodes",
                    "target": {"by": "degree", "fraction": 0.1},
                },
                {"round": 5, "action": "rejoin", "nodes": "removed"},
            ],
        )
    )
    net = NetworkState(s)
    degree = dict(net.base.degree())
    top3 = sorted(sorted(degree, key=lambda v: (-degree[v], v))[:3])
    assert net.advance(0) == [] and net.advance(1) == []
    (ch,) = net.advance(2)
    assert ch.kind == "gossip_node_removed" and list(ch.nodes) == top3
    assert ch.details == {"reason": "degree", "with_data": True}
    g = net.graph()
    assert set(g.nodes()) == set(range(30)) - set(top3)
    assert all(net.has_data(v) for v in range(30))
    (back,) = net.advance(5)
    assert back.kind == "gossip_node_rejoined" and list(back.nodes) == top3
    assert net.graph().number_of_edges() == net.base.number_of_edges()


def test_relay_only_nodes_hold_no_data_from_the_start() -> None:
    s = parse_scenario(
        _scenario(
            topology={"kind": "barabasi_albert", "n": 20, "m": 2},
            events=[
                {
                    "round": 3,
                    "action": "remove_nodes",
                    "with_data": False,
                    "target": {"by": "betweenness", "count": 2},
                }
            ],
        )
    )
    net = NetworkState(s)
    bc = nx.betweenness_centrality(net.base)
    top2 = set(sorted(bc, key=lambda v: (-bc[v], v))[:2])
    assert net.relay == top2
    assert not any(net.has_data(v) for v in top2)
    (ch,) = net.advance(3)
    assert set(ch.nodes) == top2 and ch.details["with_data"] is False


def test_random_removal_repeats_with_seed_and_differs_across_seeds() -> None:
    def chosen(seed: int) -> tuple[int, ...]:
        s = parse_scenario(
            _scenario(
                seed=seed,
                topology={"kind": "ring", "n": 40},
                events=[
                    {
                        "round": 1,
                        "action": "remove_nodes",
                        "target": {"by": "random", "count": 5},
                    }
                ],
            )
        )
        net = NetworkState(s)
        return net.advance(1)[0].nodes

    assert chosen(1) == chosen(1)
    assert len({chosen(s) for s in range(5)}) > 1


def test_partition_heal_cut_links_and_battery() -> None:
    s = parse_scenario(
        _scenario(
            events=[
                {"round": 1, "action": "partition", "parts": 2},
                {"round": 2, "action": "cut_links", "edges": [[1, 2]]},
                {"round": 3, "action": "heal"},
                {"round": 4, "action": "heal_links"},
                {"round": 1, "action": "battery", "nodes": [5], "lifetime": 4},
            ]
        )
    )
    net = NetworkState(s)
    (part,) = net.advance(1)
    assert part.kind == "gossip_partition"
    assert part.details["groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert set(part.edges) == {(0, 7), (3, 4)}
    assert topo.components(net.graph()) == 2 and net.blocked(3, 4)
    (cut,) = net.advance(2)
    assert cut.edges == ((1, 2),) and topo.components(net.graph()) == 3
    (heal,) = net.advance(3)
    assert heal.kind == "gossip_heal" and topo.components(net.graph()) == 1
    assert net.graph().number_of_edges() == 7  # the cut link stays cut
    (healed,) = net.advance(4)
    assert healed.edges == ((1, 2),) and net.graph().number_of_edges() == 8
    (dead,) = net.advance(5)
    assert dead.kind == "gossip_node_removed" and dead.nodes == (5,)
    assert dead.details["reason"] == "battery"
    assert net.neighbours(4) == [3, 5]  # topology neighbours, alive or not
    with pytest.raises(ValueError, match="rounds must increase"):
        net.advance(2)


def test_geometric_partition_splits_by_position() -> None:
    s = parse_scenario(
        _scenario(
            topology={"kind": "random_geometric", "n": 40, "radius": 0.3},
            events=[
                {"round": 1, "action": "partition", "parts": 2, "method": "geometric"}
            ],
        )
    )
    net = NetworkState(s)
    (part,) = net.advance(1)
    left, right = part.details["groups"]
    xs = {v: net.base.nodes[v]["pos"][0] for v in net.base}
    assert max(xs[v] for v in left) <= min(xs[v] for v in right)
    assert not any(net.graph().has_edge(u, v) for u in left for v in right)


def test_random_link_cuts() -> None:
    s = parse_scenario(
        _scenario(
            events=[
                {
                    "round": 1,
                    "action": "cut_links",
                    "target": {"by": "random", "count": 3},
                },
            ]
        )
    )
    net = NetworkState(s)
    (cut,) = net.advance(1)
    assert len(cut.edges) == 3 and net.graph().number_of_edges() == 5
    with pytest.raises(ScenarioError, match="by: random"):
        parse_scenario(
            _scenario(
                events=[
                    {
                        "round": 1,
                        "action": "cut_links",
                        "target": {"by": "degree", "count": 3},
                    }
                ]
            )
        )

"""The gossip page's data: the topology, the graph at any round, node accuracy.

Read-only and free of Streamlit, like :mod:`fedplat.ui.data`. It follows the store
contract of :mod:`fedplat.gossip.recorder` (config ``mode: gossip`` and
``topology``, ``gossip.*`` metrics, ``gossip_*`` graph-change events) without
importing it, so the monitor needs neither networkx nor torch for this page.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from fedplat.ui.data import round_series

from fedplat.store import EventRecord, MetricRecord, RunRecord

METRIC_GOSSIP_NODE_ACC = "gossip.accuracy"
GOSSIP_RUN_METRICS = (
    "gossip.mean_accuracy",
    "gossip.min_accuracy",
    "gossip.consensus_distance",
    "gossip.components",
)

#: Event kinds that change the gossip graph, and what each does.
NODE_DOWN = ("gossip_node_removed",)
NODE_UP = ("gossip_node_rejoined",)
LINK_DOWN = ("gossip_link_cut", "gossip_partition")
LINK_UP = ("gossip_link_healed", "gossip_heal")

Edge = tuple[str, str]


def _edge(u: object, v: object) -> Edge:
    a, b = str(u), str(v)
    return (a, b) if a <= b else (b, a)


@dataclass(frozen=True)
class GossipTopology:
    """The base graph of a gossip run, with node ids as strings."""

    nodes: tuple[str, ...]
    edges: tuple[Edge, ...]
    positions: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: Nodes that forward models but hold no data (``topology.relay``).
    relay: frozenset[str] = frozenset()


def gossip_topology(run: RunRecord) -> GossipTopology | None:
    """The graph from the run config's ``topology`` (``None`` if absent)."""
    topo = run.config.get("topology")
    if not isinstance(topo, dict):
        return None
    raw_edges = topo.get("edges") or []
    edges = tuple(sorted({_edge(e[0], e[1]) for e in raw_edges if len(e) >= 2}))
    nodes = [str(n) for n in topo.get("nodes") or []]
    for u, v in edges:  # tolerate an edge list without a node list
        nodes.extend((u, v))
    ordered = tuple(dict.fromkeys(nodes))
    if not ordered:
        return None
    pos: dict[str, tuple[float, float]] = {}
    raw_pos = topo.get("positions") or topo.get("pos") or {}
    if isinstance(raw_pos, dict):
        for k, xy in raw_pos.items():
            if isinstance(xy, list | tuple) and len(xy) >= 2:
                pos[str(k)] = (float(xy[0]), float(xy[1]))
    if set(pos) != set(ordered):
        pos = spring_layout(ordered, edges)
    relay = frozenset(str(v) for v in topo.get("relay") or [])
    return GossipTopology(ordered, edges, pos, relay)


def spring_layout(
    nodes: Sequence[str], edges: Sequence[Edge], iterations: int = 150, seed: int = 0
) -> dict[str, tuple[float, float]]:
    """Fruchterman-Reingold positions in ``[0, 1]^2``, deterministic for a graph.

    A few lines of numpy instead of networkx, which the monitor does not depend
    on; ``O(n^2)`` per iteration is instant for the few hundred nodes one can
    read on a screen.
    """
    n = len(nodes)
    if n == 0:
        return {}
    if n == 1:
        return {nodes[0]: (0.5, 0.5)}
    index = {v: i for i, v in enumerate(nodes)}
    rng = np.random.default_rng(seed)
    # Start on a circle (not at random) so rings and sparse graphs stay readable.
    angle = np.linspace(0, 2 * np.pi, n, endpoint=False)
    xy = np.stack([np.cos(angle), np.sin(angle)], axis=1) + rng.normal(0, 0.01, (n, 2))
    adj = np.zeros((n, n))
    for u, v in edges:
        if u in index and v in index:
            adj[index[u], index[v]] = adj[index[v], index[u]] = 1.0
    k = 1.0 / math.sqrt(n)  # ideal edge length for a unit area
    temp = 0.1
    for _ in range(iterations):
        delta = xy[:, None, :] - xy[None, :, :]  # [n, n, 2]
        dist = np.maximum(np.linalg.norm(delta, axis=-1), 1e-3)  # [n, n]
        force = k * k / dist - adj * dist * dist / k  # repulsion - attraction
        disp = np.einsum("ij,ijk->ik", force / dist, delta)  # [n, 2]
        length = np.maximum(np.linalg.norm(disp, axis=1, keepdims=True), 1e-9)
        xy += disp / length * np.minimum(length, temp)
        temp *= 0.97
    xy -= xy.min(axis=0)
    xy /= np.maximum(xy.max(axis=0), 1e-9)
    return {v: (float(xy[i, 0]), float(xy[i, 1])) for v, i in index.items()}


@dataclass(frozen=True)
class GraphState:
    """Which nodes are dead and which links are cut during one round."""

    round: int
    dead: frozenset[str]
    cut: frozenset[Edge]
    changes: tuple[str, ...]


def graph_state(events: Iterable[EventRecord], round_number: int) -> GraphState:
    """Replay ``gossip_*`` events up to the graph used *during* ``round_number``.

    A change recorded at round ``r`` is applied after round ``r``'s exchange and
    holds from round ``r + 1`` (changes at round 0 hold from the first round), so
    the graph during round ``R`` has every change with ``r < R``. Events carry the
    affected ``nodes`` and ``edges`` (``[u, v]`` pairs) in ``details``.
    """
    dead: set[str] = set()
    cut: set[Edge] = set()
    messages: list[str] = []
    ordered = sorted(
        (e for e in events if e.kind.startswith("gossip_")),
        key=lambda e: (e.round_number or 0, e.created_at, e.id),
    )
    for e in ordered:
        if (e.round_number or 0) >= round_number:
            continue
        nodes = {str(n) for n in e.details.get("nodes") or []}
        edges = {
            _edge(x[0], x[1])
            for x in e.details.get("edges") or []
            if isinstance(x, list | tuple) and len(x) >= 2
        }
        if e.kind in NODE_DOWN:
            dead |= nodes
        elif e.kind in NODE_UP:
            dead -= nodes
        elif e.kind in LINK_DOWN:
            cut |= edges
        elif e.kind in LINK_UP:
            cut -= edges
        else:
            continue
        messages.append(f"round {e.round_number or 0}: {e.message}")
    return GraphState(round_number, frozenset(dead), frozenset(cut), tuple(messages))


def node_accuracy_at(
    metrics: Iterable[MetricRecord], round_number: int
) -> dict[str, float]:
    """Each node's latest ``gossip.accuracy`` at or before ``round_number``
    (accuracy is measured on evaluation rounds only)."""
    best: dict[str, tuple[int, float]] = {}
    for m in metrics:
        if m.name != METRIC_GOSSIP_NODE_ACC or m.client_id is None:
            continue
        r = m.round_number or 0
        if r > round_number:
            continue
        prev = best.get(m.client_id)
        if prev is None or r >= prev[0]:
            best[m.client_id] = (r, m.value)
    return {c: v for c, (_, v) in best.items()}


def gossip_graph_frames(
    topo: GossipTopology, state: GraphState, accuracy: dict[str, float]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(nodes, edges)`` frames for the graph chart.

    ``nodes``: ``node, x, y, state ("alive"/"dead"), role ("data"/"relay"),
    accuracy, degree`` (live links);
    ``edges``: ``u, v, x, y, x2, y2, state ("up"/"cut"/"dead node")``. A link to a
    dead node is drawn as down even if it was never cut itself.
    """
    alive_degree = dict.fromkeys(topo.nodes, 0)
    edge_rows = []
    for u, v in topo.edges:
        if u in state.dead or v in state.dead:
            st = "dead node"
        elif (u, v) in state.cut:
            st = "cut"
        else:
            st = "up"
            alive_degree[u] += 1
            alive_degree[v] += 1
        (x, y), (x2, y2) = topo.positions[u], topo.positions[v]
        edge_rows.append(
            {"u": u, "v": v, "x": x, "y": y, "x2": x2, "y2": y2, "state": st}
        )
    node_rows = [
        {
            "node": n,
            "x": topo.positions[n][0],
            "y": topo.positions[n][1],
            "state": "dead" if n in state.dead else "alive",
            "role": "relay" if n in topo.relay else "data",
            "accuracy": accuracy.get(n),
            "degree": alive_degree[n],
        }
        for n in topo.nodes
    ]
    return (
        pd.DataFrame(
            node_rows,
            columns=["node", "x", "y", "state", "role", "accuracy", "degree"],
        ),
        pd.DataFrame(edge_rows, columns=["u", "v", "x", "y", "x2", "y2", "state"]),
    )


def live_components(topo: GossipTopology, state: GraphState) -> int:
    """Connected components among live nodes over links that are up."""
    parent = {n: n for n in topo.nodes if n not in state.dead}

    def find(v: str) -> str:
        while parent[v] != v:
            parent[v] = parent[parent[v]]  # path halving
            v = parent[v]
        return v

    for u, v in topo.edges:
        if u in parent and v in parent and (u, v) not in state.cut:
            parent[find(u)] = find(v)
    return len({find(v) for v in parent})


def gossip_series(metrics: Sequence[MetricRecord]) -> pd.DataFrame:
    """Long frame ``round, metric, value`` of the run-level gossip metrics."""
    frames = []
    for name in GOSSIP_RUN_METRICS:
        s = round_series(metrics, name)
        if not s.empty:
            frames.append(s.assign(metric=name.removeprefix("gossip.")))
    if not frames:
        return pd.DataFrame(columns=["round", "metric", "value"])
    return pd.concat(frames, ignore_index=True)[["round", "metric", "value"]]


def gossip_rounds(run: RunRecord, metrics: Sequence[MetricRecord]) -> int:
    """The last round a gossip run has data for (0 if none)."""
    seen = [m.round_number for m in metrics if m.round_number is not None]
    return max([run.current_round, *seen])


__all__ = [
    "GOSSIP_RUN_METRICS",
    "METRIC_GOSSIP_NODE_ACC",
    "GossipTopology",
    "GraphState",
    "gossip_graph_frames",
    "gossip_rounds",
    "gossip_series",
    "gossip_topology",
    "graph_state",
    "live_components",
    "node_accuracy_at",
    "spring_layout",
]

"""The communication graph as a scenario disrupts it, round by round.

:class:`NetworkState` replays a :class:`~fedplat.gossip.scenario.Scenario`'s events
deterministically (random choices are seeded by the scenario seed and the event's
position), so the simulation, the process launcher and every real peer that reads
the same file agree on which links are cut at which round.

Each applied event yields :class:`GraphChange` records - what the store keeps as
``gossip_*`` events so a monitor can redraw the graph at any round.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np

from fedplat.gossip.scenario import (
    Battery,
    CutLinks,
    Heal,
    HealLinks,
    Partition,
    Rejoin,
    RemoveNodes,
    Scenario,
    Target,
)

__all__ = ["CHANGE_KINDS", "GraphChange", "NetworkState", "select_nodes"]

#: Event kinds written to the store (``Store.add_event(kind=...)``).
CHANGE_KINDS = (
    "gossip_node_removed",
    "gossip_node_rejoined",
    "gossip_link_cut",
    "gossip_link_healed",
    "gossip_partition",
    "gossip_heal",
)

EdgeKey = tuple[int, int]


def _key(u: int, v: int) -> EdgeKey:
    return (u, v) if u < v else (v, u)


@dataclass(frozen=True)
class GraphChange:
    """One change of the graph, applied between round ``round`` and the next.

    Attributes
    ----------
    kind : str
        One of :data:`CHANGE_KINDS`.
    round : int
    nodes : tuple of int
        Nodes removed or rejoined (empty for link changes).
    edges : tuple of (int, int)
        Links cut or restored, ``u < v``.
    message : str
        Human-readable summary.
    details : dict
        JSON-able extras (``reason``, ``with_data``, ``groups``, ...).
    """

    kind: str
    round: int
    nodes: tuple[int, ...] = ()
    edges: tuple[EdgeKey, ...] = ()
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def to_details(self) -> dict[str, Any]:
        """The ``details`` JSON stored with the event (nodes/edges as lists)."""
        return {
            "nodes": list(self.nodes),
            "edges": [list(e) for e in self.edges],
            **self.details,
        }


def select_nodes(g: nx.Graph, target: Target, rng: np.random.Generator) -> list[int]:
    """The nodes of ``g`` a target picks: top by degree/betweenness, or random.

    Ties in centrality are broken by the smaller node id so the choice is
    reproducible. Betweenness is exact (Brandes' algorithm; fine for hundreds of
    nodes).
    """
    nodes = sorted(g.nodes())
    k = target.size(len(nodes))
    if k == 0:
        return []
    if target.by == "random":
        return sorted(int(v) for v in rng.choice(nodes, size=k, replace=False))
    if target.by == "degree":
        score: dict[int, float] = {v: float(d) for v, d in g.degree()}
    else:
        score = nx.betweenness_centrality(g)
    return sorted(sorted(nodes, key=lambda v: (-score[v], v))[:k])


class NetworkState:
    """Live nodes, data holders and cut links of a scenario at the current round.

    Parameters
    ----------
    scenario : Scenario
    graph : nx.Graph, optional
        The initial topology (built from the scenario if omitted).
    """

    def __init__(self, scenario: Scenario, graph: nx.Graph | None = None) -> None:
        self.scenario = scenario
        self.base = scenario.graph() if graph is None else graph
        self.n = self.base.number_of_nodes()
        self.alive: set[int] = set(range(self.n))
        self.removed: set[int] = set()
        self.cut: set[EdgeKey] = set()
        self.partition_cut: set[EdgeKey] = set()
        self._deaths: dict[int, set[int]] = defaultdict(set)
        self._rngs = [
            np.random.default_rng([scenario.seed, i])
            for i in range(len(scenario.events))
        ]
        # Relay-only nodes are chosen on the initial graph: they never hold data.
        self._preselected: dict[int, list[int]] = {}
        self.relay: set[int] = set()
        for i, ev in enumerate(scenario.events):
            if isinstance(ev, RemoveNodes) and not ev.with_data:
                chosen = self._choose(ev.nodes, ev.target, i)
                self._preselected[i] = chosen
                self.relay.update(chosen)
        self.round = 0

    # ------------------------------------------------------------------ queries
    def has_data(self, node: int) -> bool:
        return node not in self.relay

    def blocked(self, u: int, v: int) -> bool:
        """Whether the link ``u - v`` is cut by a ``cut_links`` or a partition."""
        k = _key(u, v)
        return k in self.cut or k in self.partition_cut

    def graph(self) -> nx.Graph:
        """The usable graph now: live nodes and the links between them not cut."""
        g = nx.Graph()
        g.add_nodes_from(sorted(self.alive))
        g.add_edges_from(
            (u, v)
            for u, v in self.base.edges()
            if u in self.alive and v in self.alive and not self.blocked(u, v)
        )
        return g

    def neighbours(self, node: int) -> list[int]:
        """Topology neighbours of ``node`` whose link is not cut (alive or not)."""
        return sorted(v for v in self.base.neighbors(node) if not self.blocked(node, v))

    # ------------------------------------------------------------------ replay
    def _choose(
        self, nodes: list[int] | None, target: Target | None, i: int
    ) -> list[int]:
        if nodes is not None:
            return sorted(nodes)
        assert target is not None
        return select_nodes(self.graph(), target, self._rngs[i])

    def advance(self, round: int) -> list[GraphChange]:
        """Apply the events scheduled after ``round`` (and battery deaths due then).

        Call once per round, in increasing order; rounds without events are cheap.
        """
        if round < self.round:
            raise ValueError(f"rounds must increase: at {self.round}, asked {round}")
        self.round = round
        out: list[GraphChange] = []
        for i, ev in enumerate(self.scenario.events):
            if ev.round == round:
                out.extend(self._apply(i, ev))
        due = sorted(self._deaths.pop(round, set()) & self.alive)
        if due:
            out.append(self._remove(due, round, reason="battery", with_data=True))
        return out

    def _remove(
        self, nodes: list[int], round: int, *, reason: str, with_data: bool
    ) -> GraphChange:
        nodes = [v for v in nodes if v in self.alive]
        self.alive.difference_update(nodes)
        self.removed.update(nodes)
        what = "with their data" if with_data else "relay-only"
        return GraphChange(
            "gossip_node_removed",
            round,
            tuple(nodes),
            message=f"{len(nodes)} node(s) removed ({reason}, {what})",
            details={"reason": reason, "with_data": with_data},
        )

    def _apply(self, i: int, ev: Any) -> list[GraphChange]:
        """Enact event number ``i`` (one handler per action)."""
        handlers: dict[type, Callable[[int, Any], list[GraphChange]]] = {
            RemoveNodes: self._on_remove,
            Battery: self._on_battery,
            CutLinks: self._on_cut,
            HealLinks: self._on_heal_links,
            Partition: self._on_partition,
            Heal: self._on_heal,
            Rejoin: self._on_rejoin,
        }
        handler = handlers.get(type(ev))
        if handler is None:  # pragma: no cover - the scenario schema forbids it
            raise TypeError(f"unknown event {ev!r}")
        return handler(i, ev)

    def _on_remove(self, i: int, ev: RemoveNodes) -> list[GraphChange]:
        chosen = (
            self._preselected[i]
            if i in self._preselected
            else self._choose(ev.nodes, ev.target, i)
        )
        by = ev.target.by if ev.target is not None else "list"
        return [self._remove(chosen, ev.round, reason=by, with_data=ev.with_data)]

    def _on_battery(self, i: int, ev: Battery) -> list[GraphChange]:
        for v in self._choose(ev.nodes, ev.target, i):
            self._deaths[ev.round + ev.lifetime].add(v)
        return []

    def _on_cut(self, i: int, ev: CutLinks) -> list[GraphChange]:
        if ev.edges is not None:
            edges = sorted({_key(u, v) for u, v in ev.edges} - self.cut)
        else:
            assert ev.target is not None
            live = sorted(_key(u, v) for u, v in self.graph().edges())
            k = ev.target.size(len(live))
            pick = self._rngs[i].choice(len(live), size=k, replace=False)
            edges = sorted(live[int(j)] for j in pick)
        self.cut.update(edges)
        return [
            GraphChange(
                "gossip_link_cut",
                ev.round,
                edges=tuple(edges),
                message=f"{len(edges)} link(s) cut",
            )
        ]

    def _on_heal_links(self, i: int, ev: HealLinks) -> list[GraphChange]:
        wanted = self.cut if ev.edges is None else {_key(u, v) for u, v in ev.edges}
        edges = sorted(wanted & self.cut)
        self.cut.difference_update(edges)
        return [
            GraphChange(
                "gossip_link_healed",
                ev.round,
                edges=tuple(edges),
                message=f"{len(edges)} link(s) restored",
            )
        ]

    def _on_partition(self, i: int, ev: Partition) -> list[GraphChange]:
        groups = self._groups(ev)
        side = {v: gi for gi, grp in enumerate(groups) for v in grp}
        edges = sorted(_key(u, v) for u, v in self.base.edges() if side[u] != side[v])
        self.partition_cut.update(edges)
        return [
            GraphChange(
                "gossip_partition",
                ev.round,
                edges=tuple(edges),
                message=f"network split into {len(groups)} groups "
                f"({len(edges)} links cut)",
                details={"groups": groups},
            )
        ]

    def _on_heal(self, i: int, ev: Heal) -> list[GraphChange]:
        edges = sorted(self.partition_cut)
        self.partition_cut.clear()
        return [
            GraphChange(
                "gossip_heal",
                ev.round,
                edges=tuple(edges),
                message=f"partition healed ({len(edges)} links back)",
            )
        ]

    def _on_rejoin(self, i: int, ev: Rejoin) -> list[GraphChange]:
        back: set[int] = set(self.removed) if ev.nodes == "removed" else set(ev.nodes)
        rejoined = sorted(back & self.removed)
        self.removed.difference_update(rejoined)
        self.alive.update(rejoined)
        for deaths in self._deaths.values():
            deaths.difference_update(rejoined)  # a new battery
        return [
            GraphChange(
                "gossip_node_rejoined",
                ev.round,
                tuple(rejoined),
                message=f"{len(rejoined)} node(s) rejoined",
            )
        ]

    def _groups(self, ev: Partition) -> list[list[int]]:
        if ev.groups is not None:
            return [sorted(grp) for grp in ev.groups]
        assert ev.parts is not None
        order = list(range(self.n))
        if ev.method == "geometric":
            # Vertical strips of the unit square: a river or a collapsed bridge.
            order.sort(key=lambda v: (self.base.nodes[v]["pos"][0], v))
        return [
            sorted(int(v) for v in part)
            for part in np.array_split(np.array(order), ev.parts)
        ]

"""Gossip runs in the fedplat store, through the store's public API (no schema change).

The contract a monitor can rely on:

**Run.** A gossip run is an ordinary run (``Store.create_run``) whose config JSON
holds ``"mode": "gossip"``, the scenario (``"scenario"``: name, rounds, data,
model, training, mixing rule, links, events) and the initial topology::

    "topology": {"kind": "barabasi_albert", "params": {"n": 100, "m": 2},
                 "nodes": ["0", "1", ...], "edges": [["0", "1"], ...],
                 "relay": ["7", ...]}

``relay`` lists nodes that never hold data. The run's layout is the model's
``Layout.to_dict()``; ``current_round`` advances as rounds finish and the status
goes ``running`` -> ``completed`` (``failed`` on error); ``best_accuracy`` is the
best mean accuracy over live nodes so far.

**Per-node metrics** (``Store.add_metrics(..., client_id=<node id>,
round_number=r)``): ``gossip.accuracy`` (evaluation rounds only),
``gossip.bytes_sent`` (bytes the node sent in round ``r``).

**Run-level metrics** (``client_id=None``, ``round_number=r``):
``gossip.mean_accuracy`` and ``gossip.min_accuracy`` (evaluation rounds, over live
nodes), ``gossip.consensus_distance``, ``gossip.components``, ``gossip.alive``,
``gossip.bytes_sent`` (all nodes).

**Graph changes** are events (``Store.add_event``) of kind ``gossip_*``
(:data:`fedplat.gossip.network.CHANGE_KINDS`: ``gossip_node_removed``,
``gossip_node_rejoined``, ``gossip_link_cut``, ``gossip_link_healed``,
``gossip_partition``, ``gossip_heal``), with ``round_number`` = the round after
which they happened and ``details = {"nodes": [...], "edges": [[u, v], ...],
...}`` (node ids as strings; ``gossip_partition`` adds ``"groups"``, removals add
``"reason"`` and ``"with_data"``). Replaying the events with ``round_number <=
r`` over the initial topology gives the graph during round ``r + 1``.

**Bytes per link**: one ``gossip_link_bytes`` event at the end of the run,
``details = {"links": {"u-v": bytes, ...}}`` (both directions summed).

Node ids are strings everywhere in the store (``str(i)`` for node ``i``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Protocol

from fedplat.gossip.network import GraphChange
from fedplat.gossip.scenario import Scenario
from fedplat.gossip.sim import GossipSimulation, RoundMetrics, RoundObserver, SimResult
from fedplat.gossip.topology import edge_list

__all__ = ["GossipRecorder", "RunStore", "gossip_run_config"]


class RunStore(Protocol):
    """The part of :class:`fedplat.store.Store` the recorder uses."""

    def create_run(
        self,
        name: str,
        config: dict[str, Any],
        layout: dict[str, Any],
        total_rounds: int,
    ) -> Any: ...

    def update_run(
        self,
        run_id: str,
        *,
        status: str | None = None,
        current_round: int | None = None,
        best_accuracy: float | None = None,
        started_at: datetime | None = None,
        finished_at: datetime | None = None,
    ) -> Any: ...

    def add_metrics(
        self,
        run_id: str,
        values: dict[str, float],
        *,
        round_number: int | None = None,
        client_id: str | None = None,
    ) -> None: ...

    def add_event(
        self,
        run_id: str | None,
        kind: str,
        message: str,
        *,
        level: str = "info",
        round_number: int | None = None,
        client_id: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None: ...


def gossip_run_config(
    scenario: Scenario, edges: list[list[int]], relay: set[int] | None = None
) -> dict[str, Any]:
    """The run config JSON of a gossip run (see the module docstring)."""
    n = scenario.graph().number_of_nodes()
    return {
        "mode": "gossip",
        "scenario": scenario.to_config(),
        "topology": {
            "kind": scenario.topology.kind,
            "params": scenario.topology.params,
            "nodes": [str(i) for i in range(n)],
            "edges": [[str(u), str(v)] for u, v in edges],
            "relay": [str(v) for v in sorted(relay or ())],
        },
    }


def _change_details(ch: GraphChange) -> dict[str, Any]:
    d = ch.to_details()
    d["nodes"] = [str(v) for v in d["nodes"]]
    d["edges"] = [[str(u), str(v)] for u, v in d["edges"]]
    if "groups" in d:
        d["groups"] = [[str(v) for v in grp] for grp in d["groups"]]
    return d


class GossipRecorder(RoundObserver):
    """Writes a gossip run into a store (simulation observer or launcher sink).

    Parameters
    ----------
    store : RunStore
        Usually :class:`fedplat.store.Store`.
    run_name : str, optional
        Defaults to the scenario's name (run names are unique in a store).
    """

    def __init__(self, store: RunStore, run_name: str | None = None) -> None:
        self.store = store
        self.run_name = run_name
        self.run_id: str | None = None
        self._best = float("-inf")

    # ----------------------------------------------------------- generic API
    def start(
        self,
        scenario: Scenario,
        layout: dict[str, Any],
        edges: list[list[int]],
        relay: set[int] | None = None,
    ) -> str:
        """Create the run (status ``running``) and return its id."""
        rec = self.store.create_run(
            self.run_name or scenario.name,
            gossip_run_config(scenario, edges, relay),
            layout,
            scenario.rounds,
        )
        self.run_id = str(rec.id)
        self.store.update_run(
            self.run_id, status="running", started_at=datetime.now(UTC)
        )
        return self.run_id

    def _id(self) -> str:
        if self.run_id is None:
            raise RuntimeError("GossipRecorder.start() was not called")
        return self.run_id

    def change(self, ch: GraphChange) -> None:
        """Record one graph change as a ``gossip_*`` event."""
        self.store.add_event(
            self._id(),
            ch.kind,
            ch.message,
            round_number=ch.round,
            details=_change_details(ch),
        )

    def round(self, m: RoundMetrics) -> None:
        """Record a round's run-level and per-node metrics."""
        rid = self._id()
        run: dict[str, float] = {
            "gossip.consensus_distance": m.consensus_distance,
            "gossip.components": float(m.components),
            "gossip.alive": float(m.alive),
            "gossip.bytes_sent": float(m.bytes_sent),
        }
        if m.mean_accuracy is not None and m.min_accuracy is not None:
            run["gossip.mean_accuracy"] = m.mean_accuracy
            run["gossip.min_accuracy"] = m.min_accuracy
        run = {k: v for k, v in run.items() if v == v}  # NaN: nobody alive
        self.store.add_metrics(rid, run, round_number=m.round)
        for v in sorted(set(m.node_accuracy) | set(m.node_bytes)):
            node: dict[str, float] = {}
            if v in m.node_accuracy:
                node["gossip.accuracy"] = m.node_accuracy[v]
            if v in m.node_bytes:
                node["gossip.bytes_sent"] = float(m.node_bytes[v])
            self.store.add_metrics(rid, node, round_number=m.round, client_id=str(v))
        if m.mean_accuracy is not None and m.mean_accuracy > self._best:
            self._best = m.mean_accuracy
            self.store.update_run(
                rid, current_round=m.round, best_accuracy=m.mean_accuracy
            )
        else:
            self.store.update_run(rid, current_round=m.round)

    def finish(
        self, link_bytes: dict[tuple[int, int], int], status: str = "completed"
    ) -> None:
        """Record bytes per link and close the run."""
        rid = self._id()
        self.store.add_event(
            rid,
            "gossip_link_bytes",
            f"bytes on {len(link_bytes)} links",
            details={
                "links": {
                    f"{u}-{v}": int(b) for (u, v), b in sorted(link_bytes.items())
                }
            },
        )
        self.store.update_run(rid, status=status, finished_at=datetime.now(UTC))

    # ------------------------------------------------------ simulation hooks
    def on_start(self, sim: GossipSimulation) -> None:
        self.start(
            sim.scenario,
            sim.stack.layout.to_dict(),
            edge_list(sim.network.base),
            sim.network.relay,
        )

    def on_change(self, change: GraphChange) -> None:
        self.change(change)

    def on_round(self, metrics: RoundMetrics) -> None:
        self.round(metrics)

    def on_finish(self, result: SimResult) -> None:
        self.finish(result.link_bytes)

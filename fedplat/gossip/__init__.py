"""Peer-to-peer gossip learning: no coordinator, through node and link failures.

* :mod:`~fedplat.gossip.mixing` - the maths (ClippedGossip, the default;
  Metropolis-Hastings, DecAvg, push-sum, NoLoCo pairs, consensus distance),
  pure functions over ``[n, d]``;
* :mod:`~fedplat.gossip.topology` - communication graphs (networkx);
* :mod:`~fedplat.gossip.scenario` / :mod:`~fedplat.gossip.network` - declarative
  disruption scenarios and their deterministic replay;
* :mod:`~fedplat.gossip.sim` - the in-process simulation, vectorised over nodes;
* :mod:`~fedplat.gossip.node` - a real peer (gRPC ``Peer`` service + loop), and
  :mod:`~fedplat.gossip.launcher` - many peer processes driven by a scenario;
* :mod:`~fedplat.gossip.recorder` - the store contract of gossip runs.

Names are loaded on first use, so importing this package stays cheap (a peer
process starts faster without the simulation's ``torch.func`` machinery) and
never imports gRPC unless a peer module is used.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CHANGE_KINDS": "network",
    "GraphChange": "network",
    "NetworkState": "network",
    "Scenario": "scenario",
    "ScenarioError": "scenario",
    "load_scenario": "scenario",
    "parse_scenario": "scenario",
    "Byzantine": "sim",
    "GossipSimulation": "sim",
    "RoundMetrics": "sim",
    "SimResult": "sim",
    "simulate": "sim",
    "TOPOLOGIES": "topology",
    "TopologyError": "topology",
    "build_topology": "topology",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'fedplat.gossip' has no attribute {name!r}")
    return getattr(importlib.import_module(f"fedplat.gossip.{_EXPORTS[name]}"), name)

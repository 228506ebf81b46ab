"""Peer-to-peer gossip learning: no coordinator, through node and link failures.

* :mod:`~fedplat.gossip.mixing` - the maths (Metropolis-Hastings, DecAvg,
  push-sum, NoLoCo pairs, consensus distance), pure functions over ``[n, d]``;
* :mod:`~fedplat.gossip.topology` - communication graphs (networkx);
* :mod:`~fedplat.gossip.scenario` / :mod:`~fedplat.gossip.network` - declarative
  disruption scenarios and their deterministic replay;
* :mod:`~fedplat.gossip.sim` - the in-process simulation, vectorised over nodes;
* :mod:`~fedplat.gossip.node` - a real peer (gRPC ``Peer`` service + loop), and
  :mod:`~fedplat.gossip.launcher` - many peer processes driven by a scenario;
* :mod:`~fedplat.gossip.recorder` - the store contract of gossip runs.

Importing this package does not import gRPC; the peer modules do.
"""

from fedplat.gossip.network import CHANGE_KINDS, GraphChange, NetworkState
from fedplat.gossip.scenario import (
    Scenario,
    ScenarioError,
    load_scenario,
    parse_scenario,
)
from fedplat.gossip.sim import GossipSimulation, RoundMetrics, SimResult, simulate
from fedplat.gossip.topology import TOPOLOGIES, TopologyError, build_topology

__all__ = [
    "CHANGE_KINDS",
    "TOPOLOGIES",
    "GossipSimulation",
    "GraphChange",
    "NetworkState",
    "RoundMetrics",
    "Scenario",
    "ScenarioError",
    "SimResult",
    "TopologyError",
    "build_topology",
    "load_scenario",
    "parse_scenario",
    "simulate",
]

"""In-process gossip simulation: every node's model is a row of one ``[n, d]`` matrix.

Each round: live nodes with data train locally (all at once, see
:class:`~fedplat.gossip.batched.StackedModel`), then every live node mixes with
its live, uncut neighbours by the scenario's rule, vectorised as one ``W @ X``
product (ClippedGossip: one clipped difference per directed edge; or push-sum /
NoLoCo pairs), then metrics are taken and the scenario's events for that round
change the graph. Removed nodes keep their row but take no part in training,
mixing or metrics; a rejoined node restarts from the average of its live
neighbours, as a restarted peer process catches up.

Byzantine nodes (:class:`Byzantine`, an evaluation hook, not a scenario field)
send an attack's vector to every neighbour instead of their model, computed
from all honest live nodes' public models of the round (the omniscient threat
model of :mod:`fedplat.aggregators.attacks`, whose attacks fit as they are).
They do not train, and the metrics cover the honest nodes only. NoLoCo pairs
exchange exact models, so the hook does not reach them.

Bytes per link: every live link carries one encoded model each way per round
(only the matched pairs under NoLoCo), ``Payload.nbytes`` of the scenario's link
compressor. With a compressor other than ``identity`` nodes mix with the public
copies ``x_hat`` of their neighbours (see :mod:`fedplat.gossip.links`); NoLoCo
pairs exchange exact models, so compression is refused with that rule.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import networkx as nx
import torch

from fedplat.compression import dense_size
from fedplat.gossip import mixing as mx
from fedplat.gossip.batched import StackedModel
from fedplat.gossip.links import make_compressor
from fedplat.gossip.network import GraphChange, NetworkState
from fedplat.gossip.scenario import Scenario
from fedplat.gossip.setup import NodeData, load_node_data, model_for, test_subset
from fedplat.gossip.topology import adjacency, components
from fedplat.vectors import flatten

__all__ = ["Byzantine", "GossipSimulation", "RoundMetrics", "SimResult", "simulate"]

log = logging.getLogger("fedplat.gossip.sim")


@dataclass(frozen=True)
class RoundMetrics:
    """Metrics after one round (accuracies only on evaluation rounds).

    Attributes
    ----------
    round : int
    alive : int
        Live nodes.
    components : int
        Connected components of the live graph.
    consensus_distance : float
        RMS distance of live models to their mean (see
        :func:`fedplat.gossip.mixing.consensus_distance`).
    bytes_sent : int
        Bytes all nodes sent this round.
    mean_accuracy, min_accuracy : float or None
        Over live nodes.
    node_accuracy : dict
        Node id -> test accuracy (evaluation rounds only).
    node_bytes : dict
        Node id -> bytes sent this round.
    """

    round: int
    alive: int
    components: int
    consensus_distance: float
    bytes_sent: int
    mean_accuracy: float | None = None
    min_accuracy: float | None = None
    node_accuracy: dict[int, float] = field(default_factory=dict)
    node_bytes: dict[int, int] = field(default_factory=dict)


#: ``(honest [h, d], f) -> [f, d]``: the signature of
#: :class:`fedplat.aggregators.attacks.Attack`.
AttackFn = Callable[[torch.Tensor, int], torch.Tensor]


@dataclass(frozen=True)
class Byzantine:
    """Nodes that lie: each sends its row of ``attack(honest, f)`` to every
    neighbour, every round.

    Attributes
    ----------
    nodes : tuple of int
        The ``f`` Byzantine node ids.
    attack : callable
        ``(honest [h, d], f) -> [f, d]``, ``honest`` being the public models of
        the live honest nodes this round.
    """

    nodes: tuple[int, ...]
    attack: AttackFn


@dataclass(frozen=True)
class SimResult:
    """Outcome of :meth:`GossipSimulation.run`."""

    scenario: str
    rounds: list[RoundMetrics]
    changes: list[GraphChange]
    link_bytes: dict[tuple[int, int], int]
    seconds: float
    final_graph: nx.Graph

    @property
    def final(self) -> RoundMetrics:
        return self.rounds[-1]

    @property
    def final_mean_accuracy(self) -> float | None:
        return self.final.mean_accuracy

    @property
    def final_min_accuracy(self) -> float | None:
        return self.final.min_accuracy


class RoundObserver:
    """Receives the simulation's progress (all methods are no-ops here).

    :class:`~fedplat.gossip.recorder.GossipRecorder` implements it to write the
    store.
    """

    def on_start(self, sim: GossipSimulation) -> None:
        """Before the first round (the initial graph is ``sim.network.base``)."""

    def on_change(self, change: GraphChange) -> None:
        """A graph change was applied."""

    def on_round(self, metrics: RoundMetrics) -> None:
        """A round finished."""

    def on_finish(self, result: SimResult) -> None:
        """The run finished."""


class GossipSimulation:
    """Run a scenario in one process.

    Parameters
    ----------
    scenario : Scenario
    data : NodeData, optional
        Pre-loaded node data (loaded from ``scenario.data`` if omitted); must
        match the scenario's relays (empty datasets for them).
    observers : list of RoundObserver
        Progress sinks (store recorder, progress bar).
    byzantine : Byzantine, optional
        Nodes that send an attack instead of their model (evaluation only).
    """

    def __init__(
        self,
        scenario: Scenario,
        data: NodeData | None = None,
        observers: list[RoundObserver] | None = None,
        byzantine: Byzantine | None = None,
    ) -> None:
        self.scenario = scenario
        self.network = NetworkState(scenario)
        n = self.network.n
        self.byzantine = byzantine
        self._liars = torch.zeros(n, dtype=torch.bool)
        if byzantine is not None:
            bad = sorted(set(byzantine.nodes) - set(range(n)))
            if bad or not byzantine.nodes:
                raise ValueError(f"Byzantine nodes {bad or '()'} are not 0..{n - 1}")
            self._liars[list(byzantine.nodes)] = True
        self.data = data or load_node_data(
            scenario.data, n, scenario.seed, self.network.relay
        )
        if len(self.data.train) != n:
            raise ValueError(f"{len(self.data.train)} datasets for {n} nodes")
        test = self.data.test
        self.test_round = test_subset(test, scenario.data.test_examples, scenario.seed)
        self.test_final = test_subset(
            test, scenario.data.final_test_examples, scenario.seed
        )
        self.template = model_for(scenario.model, test, scenario.seed)
        self.stack = StackedModel(self.template)
        self.init = flatten(self.template, self.stack.layout)
        self.x = self.init.repeat(n, 1)
        self.sizes = self.data.sizes
        self.observers = list(observers or [])
        self.rule = mx.get_mixing_rule(scenario.mixing.rule)
        pairs = self.rule.exchange == "pairs"
        self._pushsum_w = torch.ones(n, dtype=torch.float64)
        self._phi = self.x.clone() if pairs else None
        self._momentum = torch.zeros_like(self.x) if pairs else None
        self._pair_gen = torch.Generator().manual_seed(scenario.seed)
        links = scenario.links
        self._compressor = (
            None
            if links.compressor == "identity"
            else make_compressor(links.compressor, links.params)
        )
        if self._compressor is not None and pairs:
            raise ValueError(
                f"compressed links are not supported with rule {self.rule.name}"
            )
        self._x_hat = torch.zeros_like(self.x) if self._compressor else None
        self._dense_bytes = dense_size(self.stack.dim)
        self._link_bytes: dict[tuple[int, int], int] = defaultdict(int)

    # ------------------------------------------------------------------ steps
    def _alive_mask(self) -> torch.Tensor:
        m = torch.zeros(self.network.n, dtype=torch.bool)
        m[list(self.network.alive)] = True
        return m

    def _train(self, round: int) -> None:
        s = self.scenario
        nodes = sorted(
            v
            for v in self.network.alive
            if len(self.data.train[v]) > 0 and not self._liars[v]
        )
        if not nodes:
            return
        idx = torch.tensor(nodes)
        start = (
            mx.push_sum_estimate(self.x[idx], self._pushsum_w[idx])
            if self.rule.debiased
            else self.x[idx]
        )
        # Per node and round seeds, so a run repeats exactly.
        seeds = [(s.seed * 1_000_003 + round) * 100_003 + v for v in nodes]
        trained = self.stack.train(
            start,
            [self.data.train[v] for v in nodes],
            seeds,
            s.training,
        )
        if self.rule.debiased:
            # SGP (Assran et al. 2019): the local step changes the numerator.
            self.x[idx] += trained - start
        else:
            self.x[idx] = trained

    def _broadcast(
        self, alive: torch.Tensor, round: int
    ) -> tuple[torch.Tensor, list[int]]:
        """What neighbours receive from each node, and its payload size in bytes."""
        n = self.network.n
        if self._compressor is None or self._x_hat is None:
            return self.x, [self._dense_bytes] * n
        sizes = [0] * n
        for v in torch.nonzero(alive).reshape(-1).tolist():
            payload = self._compressor.encode(
                self.x[v] - self._x_hat[v], round=round, seed=self.scenario.seed
            )
            self._x_hat[v] += self._compressor.decode(payload)
            sizes[v] = payload.nbytes
        return self._x_hat, sizes

    def _mix(self, round: int, g: nx.Graph) -> dict[int, int]:
        n = self.network.n
        adj = adjacency(g, n)
        alive = self._alive_mask()
        rule = self.rule
        sent: dict[int, int] = defaultdict(int)
        if rule.exchange == "pairs":
            partner = mx.random_pairs(adj, self._pair_gen)
            adj = torch.zeros_like(adj)
            paired = torch.nonzero(partner != torch.arange(n)).reshape(-1)
            adj[paired, partner[paired]] = True
        public, nbytes = self._broadcast(alive, round)
        public = self._forge(public, alive)
        deg = adj.sum(1)
        for v in torch.nonzero(deg).reshape(-1).tolist():
            sent[v] = int(deg[v]) * nbytes[v]
        for u, v in torch.nonzero(torch.triu(adj)).tolist():
            self._link_bytes[(u, v)] += nbytes[u] + nbytes[v]

        if rule.exchange == "pairs":
            self._pair_step(partner)
            return sent
        w = rule.weights(adj, self.sizes)
        if rule.debiased:  # push-sum: the weights split like the numerators
            self._pushsum_w = w @ self._pushsum_w
        # Own share stays exact; neighbours' shares arrive as public copies.
        self.x = rule.mix(w, self.x, public)
        return sent

    def _forge(self, public: torch.Tensor, alive: torch.Tensor) -> torch.Tensor:
        """``public`` ``[n, d]`` with the live Byzantine rows replaced by the
        attack's vectors (unchanged without Byzantine nodes)."""
        liars = torch.nonzero(alive & self._liars).reshape(-1)
        honest = alive & ~self._liars
        if self.byzantine is None or liars.numel() == 0 or not bool(honest.any()):
            return public
        forged = self.byzantine.attack(public[honest], int(liars.numel()))
        if forged.shape != (liars.numel(), public.shape[1]):
            raise ValueError(
                f"attack returned {tuple(forged.shape)} for {liars.numel()} "
                f"Byzantine node(s) of dimension {public.shape[1]}"
            )
        out = public.clone()
        out[liars] = forged.to(public.dtype)
        return out

    def _pair_step(self, partner: torch.Tensor) -> None:
        """Average each matched pair (NoLoCo; optionally its outer step)."""
        m = self.scenario.mixing
        if m.outer_step:
            assert self._phi is not None and self._momentum is not None
            st = mx.noloco_outer_step(
                mx.NoLoCoState(self.x, self._phi, self._momentum),
                partner,
                m.alpha,
                m.beta,
            )
            self.x, self._phi, self._momentum = st.theta, st.phi, st.momentum
        else:
            self.x = mx.pair_average(partner, self.x)

    def _estimate(self) -> torch.Tensor:
        if self.rule.debiased:
            return mx.push_sum_estimate(self.x, self._pushsum_w)
        return self.x

    def _catch_up(self, nodes: tuple[int, ...]) -> None:
        """Rejoined nodes restart from the mean of their live neighbours' models."""
        g = self.network.graph()
        models = self._estimate()
        for v in nodes:
            nbrs = list(g.neighbors(v))
            start = models[nbrs].mean(0) if nbrs else self.init
            self.x[v] = start
            self._pushsum_w[v] = 1.0
            if self._phi is not None and self._momentum is not None:
                self._phi[v] = start
                self._momentum[v] = 0.0
            if self._x_hat is not None:
                self._x_hat[v] = 0.0  # a fresh process shares no reference yet

    # ------------------------------------------------------------------ run
    def run(self, on_round: Callable[[RoundMetrics], None] | None = None) -> SimResult:
        """Run every round of the scenario and return the metrics."""
        s = self.scenario
        t0 = time.perf_counter()
        self._link_bytes.clear()
        history: list[RoundMetrics] = []
        changes: list[GraphChange] = []
        for obs in self.observers:
            obs.on_start(self)

        def apply(round: int) -> None:
            for ch in self.network.advance(round):
                changes.append(ch)
                if ch.kind == "gossip_node_rejoined":
                    self._catch_up(ch.nodes)
                for obs in self.observers:
                    obs.on_change(ch)

        apply(0)
        for r in range(1, s.rounds + 1):
            self._train(r)
            g = self.network.graph()
            sent = self._mix(r, g)
            m = self._metrics(r, g, sent)
            history.append(m)
            for obs in self.observers:
                obs.on_round(m)
            if on_round is not None:
                on_round(m)
            if r < s.rounds:
                apply(r)
        result = SimResult(
            s.name,
            history,
            changes,
            dict(self._link_bytes),
            time.perf_counter() - t0,
            self.network.graph(),
        )
        for obs in self.observers:
            obs.on_finish(result)
        return result

    def _metrics(self, r: int, g: nx.Graph, sent: dict[int, int]) -> RoundMetrics:
        s = self.scenario
        alive = self._alive_mask() & ~self._liars  # a liar's model is no result
        models = self._estimate()
        last = r == s.rounds
        acc: dict[int, float] = {}
        mean_acc = min_acc = None
        if last or r % s.eval.every == 0:
            nodes = torch.nonzero(alive).reshape(-1)
            test = self.test_final if last else self.test_round
            a = self.stack.accuracy(models[nodes], test)
            acc = {int(v): float(x) for v, x in zip(nodes, a, strict=True)}
            if acc:
                mean_acc, min_acc = float(a.mean()), float(a.min())
        return RoundMetrics(
            round=r,
            alive=len(self.network.alive),
            components=components(g),
            consensus_distance=mx.consensus_distance(models, alive),
            bytes_sent=sum(sent.values()),
            mean_accuracy=mean_acc,
            min_accuracy=min_acc,
            node_accuracy=acc,
            node_bytes={v: sent.get(v, 0) for v in sorted(self.network.alive)},
        )


def simulate(
    scenario: Scenario,
    observers: list[RoundObserver] | None = None,
    on_round: Callable[[RoundMetrics], None] | None = None,
) -> SimResult:
    """Load the scenario's data and run it (see :class:`GossipSimulation`)."""
    torch_threads = torch.get_num_threads()
    log.debug("simulating %s with %d torch threads", scenario.name, torch_threads)
    result = GossipSimulation(scenario, observers=observers).run(on_round)
    if not math.isfinite(result.final.consensus_distance):
        log.warning("no live node left at the end of %s", scenario.name)
    return result

"""A real gossip peer: a gRPC ``Peer`` service plus a train -> exchange -> mix loop.

Lifecycle of :class:`PeerNode`:

1. **Bootstrap.** Say ``Hello`` to every seed (``host:port`` or ``id@host:port``);
   a seed that answers becomes a neighbour and tells which peers it knows. With
   ``target_degree`` the peer also links to known peers until it has that many
   neighbours (an emergent topology); otherwise the seeds *are* its neighbours (a
   given topology). Seeds that are down are retried in the background.
2. **Catch-up.** A peer that (re)starts while its neighbours are already past
   round 0 pulls their models, starts from their average and jumps to their
   round: a restarted peer rejoins instead of dragging the network back.
3. **Rounds.** Train locally; push the model (encoded for the link, see
   :mod:`fedplat.gossip.links`) to every live neighbour; wait until every live
   neighbour's model for this round arrived or ``round_timeout_s`` passes; mix
   with what arrived by the rule (:data:`fedplat.gossip.mixing.MIXING_RULES`;
   by default ClippedGossip, which bounds how far any one neighbour's model
   can move this peer's), or, for a pairwise rule (NoLoCo), pull one random
   neighbour's model and average with it.
4. **Failure detection.** A heartbeat pings every neighbour each
   ``heartbeat_s``; silence for ``dead_after_s`` marks it dead, so rounds stop
   waiting for it; an answer or a ``Hello`` marks it alive again.

Who may talk to a peer is decided by its :class:`~fedplat.gossip.security.
PeerSecurity`: members of the membership only, over mutual TLS, every message
signed and fresh (:mod:`fedplat.gossip.guard`). What they send is checked by
:mod:`fedplat.gossip.inbound`; the calls the peer makes are in
:mod:`fedplat.gossip.outbound`, its service in :mod:`fedplat.gossip.server`.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from concurrent import futures
from typing import Any

import torch
from torch import nn

from fedplat.compression import dense_size
from fedplat.gossip import mixing as mx
from fedplat.gossip.client import channel_options
from fedplat.gossip.config import PeerConfig
from fedplat.gossip.guard import Admission
from fedplat.gossip.inbound import Inbound
from fedplat.gossip.links import LinkDecoder, make_compressor
from fedplat.gossip.neighbours import NeighbourTable
from fedplat.gossip.network import NetworkState
from fedplat.gossip.outbound import Outbound
from fedplat.gossip.scenario import Scenario
from fedplat.gossip.security import PeerSecurity, warn_if_insecure
from fedplat.gossip.server import PeerServer, PeerService
from fedplat.gossip.setup import accuracy, load_node_data, model_for
from fedplat.gossip.signing import Signer
from fedplat.gossip.state import PeerState
from fedplat.models import train_epochs
from fedplat.models.training import TrainData
from fedplat.proto.serde import layout_to_proto
from fedplat.protocol.errors import FedplatError
from fedplat.protocol.peer import PeerStatus
from fedplat.transport.limits import RefusalLog
from fedplat.vectors import flatten, layout_of, load_vector

__all__ = ["PeerConfig", "PeerNode", "payload_bound", "peer_from_scenario"]

KiB = 1024


def payload_bound(compressor: str, params: dict[str, Any], dim: int) -> int:
    """Largest model payload a link carries for a ``[dim]`` model.

    A dense float32 vector, or a compressor's fixed-size encoding (a sketch)
    when that is larger; sparse encodings fall back to dense before exceeding
    it (:func:`fedplat.compression.sparse_payload`).
    """
    probe = make_compressor(compressor, params).encode(
        torch.zeros(dim), round=0, seed=0
    )
    return max(dense_size(dim), probe.nbytes)


class PeerNode:
    """One gossip peer; see the module docstring.

    Parameters
    ----------
    config : PeerConfig
    model : nn.Module
        The architecture and the starting weights (the same seeded init on
        every peer).
    train : TrainData, optional
        Local data, ``x [N, ...]`` of any shape and ``y`` int64 ``[N]``;
        ``None`` or empty for a relay-only peer.
    test : TrainData, optional
        Evaluation data for the reported accuracy.
    network : NetworkState, optional
        A scenario replay: links the scenario cuts are blocked at the scheduled
        rounds (node removals are enacted by killing processes instead).
    security : PeerSecurity
        Identity key, membership and TLS files (checked to fit ``node_id``).
    """

    def __init__(
        self,
        config: PeerConfig,
        model: nn.Module,
        train: TrainData | None = None,
        test: TrainData | None = None,
        network: NetworkState | None = None,
        *,
        security: PeerSecurity,
    ) -> None:
        security.check_for(config.node_id)
        self.config = config
        self.id = config.node_id
        self.log = logging.getLogger(f"fedplat.gossip.peer.{self.id}")
        self.security = security
        self.membership = security.membership
        self.signer = Signer(self.id, security.identity)
        self.model = model
        self.layout = layout_of(model)
        self.fingerprint = self.layout.fingerprint()
        self.dim = self.layout.numel
        self.rule = mx.get_mixing_rule(config.rule)
        self.state = PeerState(flatten(model, self.layout), self.rule.debiased)
        self.train_data = train if train is not None and len(train) > 0 else None
        self.test = test
        self.num_examples = 0 if self.train_data is None else len(self.train_data)
        self.network = network
        self._scenario_round = -1
        self.table = NeighbourTable(config.dead_after_s)
        self.compressor = make_compressor(config.compressor, config.compressor_params)
        self.decoder = LinkDecoder(self.compressor, self.dim)
        self.max_payload_bytes = min(
            config.max_model_bytes,
            payload_bound(config.compressor, config.compressor_params, self.dim),
        )
        self.admission = Admission(
            self.id,
            self.membership,
            tls=security.tls is not None,
            replay_window_s=security.replay_window_s,
        )
        self.refusals = RefusalLog(self.log)
        self.inbound = Inbound(self)
        self.outbound = Outbound(self)
        self.stopping = threading.Event()
        self.pool = futures.ThreadPoolExecutor(8, thread_name_prefix=f"peer{self.id}")
        self._serve_pool = futures.ThreadPoolExecutor(
            4, thread_name_prefix=f"rpc{self.id}"
        )
        self.server = self._make_server()
        self.port = self.server.port
        host = config.listen.rpartition(":")[0] or "127.0.0.1"
        self.address = config.advertise or f"{host}:{self.port}"
        self._heartbeat = threading.Thread(
            target=self.outbound.heartbeat_loop, name=f"heartbeat{self.id}", daemon=True
        )

    def _make_server(self) -> PeerServer:
        cfg = self.config
        # One message holds a chunk or a header (whose size the layout fixes).
        max_message = (
            cfg.chunk_bytes + layout_to_proto(self.layout).ByteSize() + 64 * KiB
        )
        options = [
            *channel_options(max_message),
            ("grpc.so_reuseport", 0),
            ("grpc.max_concurrent_streams", 2 * cfg.max_calls_per_caller),
            ("grpc.http2.min_ping_interval_without_data_ms", 5000),
            # No stream outlives its connection: recycle connections every 10
            # minutes, letting calls in flight finish within their own deadline.
            ("grpc.max_connection_age_ms", 600_000),
            ("grpc.max_connection_age_grace_ms", int(1000 * cfg.stream_deadline_s)),
            # What an outsider (who cannot finish mutual TLS) may hold: a
            # handshake for 10 s, one of a capped number of connections.
            ("grpc.server_handshake_timeout_ms", 10_000),
            ("grpc.max_allowed_incoming_connections", 4 * cfg.max_degree + 64),
        ]
        service = PeerService(self, self._serve_pool)
        return PeerServer(service, cfg.listen, self.security.tls, options)

    # ================================================================ views
    @property
    def round(self) -> int:
        return self.state.round

    @property
    def finished(self) -> bool:
        return self.state.finished

    @property
    def accuracy(self) -> float | None:
        return self.state.accuracy

    @property
    def x(self) -> torch.Tensor:
        """``[d]`` the model's numerator (the model itself except under push-sum)."""
        return self.state.x

    @property
    def push_weight(self) -> float:
        return self.state.push_weight

    def status(self) -> PeerStatus:
        return self.inbound.status()

    # ================================================================ lifecycle
    def start(self) -> None:
        """Serve, contact the seeds, start the heartbeat (non-blocking)."""
        warn_if_insecure(self.security, self.id)
        self.server.start()
        self.log.info("peer %s serving on %s", self.id, self.address)
        self.outbound.add_seeds(self.config.seeds)
        self.outbound.hello_pending()
        self._heartbeat.start()

    def run(self) -> None:
        """Start, run every round, linger, stop. Blocks."""
        self.start()
        try:
            self._wait_bootstrap()
            self._catch_up()
            if self.network is not None:
                self._apply_scenario(self.round)
            while self.round < self.config.rounds and not self.stopping.is_set():
                self.run_round(self.round + 1)
            self.state.finished = self.round >= self.config.rounds
            if self.finished:
                self.log.info(
                    "peer %s finished %d rounds (accuracy %s)",
                    self.id,
                    self.round,
                    self.accuracy,
                )
                self.stopping.wait(self.config.linger_s)
        finally:
            self.stop()

    def request_stop(self) -> None:
        """Ask :meth:`run` to finish (safe from a signal handler)."""
        self.stopping.set()

    def stop(self) -> None:
        self.stopping.set()
        self.state.wake()
        self.server.stop(grace=0.5)
        self.pool.shutdown(wait=False, cancel_futures=True)
        self._serve_pool.shutdown(wait=False, cancel_futures=True)
        self.outbound.close()

    def heard(
        self, node_id: str, round: int | None = None, degree: int | None = None
    ) -> None:
        """Contact with ``node_id``: it is alive (wake a waiting round if new)."""
        if self.table.heard_from(node_id, round, degree) is not None:
            self.log.info("neighbour %s is alive", node_id)
            self.state.wake()

    # ================================================================ bootstrap
    def _wait_bootstrap(self) -> None:
        """Wait until every seed answered (or the bootstrap timeout)."""
        end = time.monotonic() + self.config.bootstrap_timeout_s
        while time.monotonic() < end and not self.stopping.is_set():
            if not self.outbound.pending and all(n.alive for n in self.table.all()):
                return
            time.sleep(0.05)
        self.log.warning(
            "bootstrap: %d seed(s) not reachable; starting anyway",
            len(self.outbound.pending),
        )

    def _catch_up(self) -> None:
        """Start from the live neighbours' average if they are ahead of us."""
        if not self.config.catch_up or self.round > 0:
            return
        ahead = [n for n in self.table.live() if n.round > 0]
        models, rounds = [], []
        for n in ahead:
            try:
                msg, x = self.outbound.pull(n.node_id, n.address)
            except FedplatError as exc:
                self.log.warning("catch-up pull from %s failed: %s", n.node_id, exc)
                continue
            models.append(x)
            rounds.append(msg.header.round)
        if not models:
            return
        x = torch.stack(models).mean(0)
        st = self.state
        with st.lock:
            st.x = x
            st.phi = x.clone()
            st.round = max(rounds)
            st.publish()
        self.log.info(
            "caught up to round %d from %d neighbour(s)", st.round, len(models)
        )

    # ================================================================ rounds
    def run_round(self, r: int) -> None:
        """Train, exchange and mix once, as round ``r``."""
        cfg = self.config
        st = self.state
        t0 = time.monotonic()
        self._train(r)
        if self.rule.exchange == "pairs":
            self._pair_with_random_neighbour(r)
        else:
            self.outbound.push_all(r)
            self._wait_for(r)
            self._mix(r)
        if self.test is not None and (r % cfg.eval_every == 0 or r == cfg.rounds):
            load_vector(self.model, st.estimate(), self.layout)
            st.accuracy = accuracy(self.model, self.test)
        self.stopping.wait(max(0.0, cfg.min_round_s - (time.monotonic() - t0)))
        with st.lock:
            st.round = r
        if self.network is not None:
            self._apply_scenario(r)
        self.log.info(
            "round %d done: accuracy %s, %d live neighbour(s)",
            r,
            None if st.accuracy is None else round(st.accuracy, 4),
            len(self.table.live()),
        )

    def _train(self, r: int) -> None:
        st = self.state
        if self.train_data is None:
            st.publish()
            return
        cfg = self.config
        start = st.estimate().clone()
        load_vector(self.model, start, self.layout)
        train_epochs(
            self.model,
            self.train_data,
            **cfg.training.model_dump(),
            seed=(cfg.seed * 1_000_003 + r) * 7919
            + zlib.crc32(self.id.encode()) % 7919,
        )
        trained = flatten(self.model, self.layout)
        with st.lock:
            if self.rule.debiased:
                # SGP (Assran et al. 2019): the local step moves the numerator.
                st.x = st.x + (trained - start)
            else:
                st.x = trained
            st.publish()

    def _apply_scenario(self, upto: int) -> None:
        """Replay the scenario's events up to round ``upto``; block the cut links."""
        assert self.network is not None
        me = int(self.id)
        for r in range(self._scenario_round + 1, upto + 1):
            self.network.advance(r)
        self._scenario_round = max(self._scenario_round, upto)
        blocked = {
            str(v)
            for v in self.network.base.neighbors(me)
            if self.network.blocked(me, v)
        }
        self.table.set_blocked(blocked)

    def _wait_for(self, r: int) -> None:
        """Until every live neighbour's round-``r`` model arrived, or the timeout."""
        end = time.monotonic() + self.config.round_timeout_s
        st = self.state
        with st.arrived:
            while not self.stopping.is_set():
                missing = [
                    n.node_id for n in self.table.live() if st.round_of(n.node_id) < r
                ]
                left = end - time.monotonic()
                if not missing or left <= 0:
                    if missing:
                        self.log.info("round %d: no model from %s in time", r, missing)
                    return
                st.arrived.wait(min(left, 0.25))

    def _mix(self, r: int) -> None:
        st = self.state
        live = {n.node_id for n in self.table.live()}
        with st.lock:
            if self.rule.debiased:
                st.x = st.x + st.ps_x
                st.push_weight += st.ps_w
                st.ps_x = torch.zeros(self.dim)
                st.ps_w = 0.0
                return
            used = st.models_for(r, live, self.config.max_staleness)
            if not used:
                return
            nb = torch.stack([e.x for e in used])
            st.consensus_gap = float(((nb - st.x) ** 2).sum(1).mean().sqrt())
            # The declared degrees and sizes reach only the legacy rules that
            # read them; the default (clipped_gossip) ignores both.
            w = self.rule.row_weights(
                len(live),
                float(self.num_examples),
                torch.tensor([e.degree for e in used]),
                torch.tensor([float(e.num_examples) for e in used]),
            )
            st.x = self.rule.mix_row(w, st.x, nb)

    def _pair_with_random_neighbour(self, r: int) -> None:
        """Average with one random live neighbour's current model (pulled)."""
        cfg = self.config
        partner = self.outbound.random_live()
        if partner is None:
            return
        try:
            _, theta_j = self.outbound.pull(*partner)
        except FedplatError as exc:
            self.log.info("round %d: pull from %s failed: %s", r, partner[0], exc)
            return
        st = self.state
        with st.lock:
            theta_mean = 0.5 * (st.x + theta_j)
            st.consensus_gap = float((st.x - theta_j).norm())
            if cfg.outer_step:
                step = mx.noloco_local_step(
                    theta_mean, st.phi, st.momentum, cfg.alpha, cfg.beta
                )
                st.x, st.phi, st.momentum = step.theta, step.phi, step.momentum
            else:
                st.x = theta_mean


def peer_from_scenario(
    scenario: Scenario,
    node: int,
    *,
    listen: str,
    seeds: tuple[str, ...],
    security: PeerSecurity,
    relay: bool | None = None,
    **overrides: Any,
) -> PeerNode:
    """The peer for node ``node`` of a scenario (its data share, model, rule).

    With the app's data (``data.clients``) only this node's share is loaded.

    ``overrides`` are :class:`PeerConfig` fields (timeouts, pacing, ...). Only
    the scenario's nodes (and the membership's observers) are admitted.
    """
    network = NetworkState(scenario)
    is_relay = (not network.has_data(node)) if relay is None else relay
    data = load_node_data(
        scenario.data,
        network.n,
        scenario.seed,
        {node} if is_relay else set(),
        nodes={node},
    )
    test = data.test
    model = model_for(scenario.model, test, scenario.seed)
    t, m = scenario.training, scenario.mixing
    cfg = PeerConfig(
        node_id=str(node),
        listen=listen,
        seeds=seeds,
        rounds=scenario.rounds,
        rule=m.rule,
        outer_step=m.outer_step,
        alpha=m.alpha,
        beta=m.beta,
        training=t,
        compressor=scenario.links.compressor,
        compressor_params=dict(scenario.links.params),
        eval_every=scenario.eval.every,
        seed=scenario.seed,
        **overrides,
    )
    members = security.membership.restricted_to(str(i) for i in range(network.n))
    security = PeerSecurity(
        security.identity, members, security.tls, security.replay_window_s
    )
    return PeerNode(cfg, model, data.train[node], test, network, security=security)

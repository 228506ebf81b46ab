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
   with what arrived (Metropolis-Hastings, DecAvg, uniform, push-sum), or with
   NoLoCo pull one random neighbour's model and average with it.
4. **Failure detection.** A heartbeat pings every neighbour each
   ``heartbeat_s``; silence for ``dead_after_s`` marks it dead, so rounds stop
   waiting for it; an answer or a ``Hello`` marks it alive again.

Every received model is validated before it can touch anything (sender is a
neighbour on an uncut link, declared size within ``max_model_bytes``, checksum,
identical layout, payload well-formed, right length, finite): a bad one is
refused with a reason (``INVALID_ARGUMENT``) and counted; the peer keeps its model.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
import zlib
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
import torch
from torch import nn

from fedplat.compression import Payload, PayloadError, dense_payload
from fedplat.data import Dataset
from fedplat.gossip import mixing as mx
from fedplat.gossip.client import PeerClient, channel_options
from fedplat.gossip.links import (
    LinkDecoder,
    LinkEncoder,
    ReferenceMismatch,
    make_compressor,
)
from fedplat.gossip.messages import (
    Hello,
    HelloReply,
    ModelHeader,
    ModelMessage,
    PeerAddress,
    PeerStatus,
    PingReply,
    PushReply,
)
from fedplat.gossip.neighbours import NeighbourTable
from fedplat.gossip.network import NetworkState
from fedplat.gossip.scenario import Scenario
from fedplat.gossip.servicer import PeerServicer
from fedplat.gossip.setup import build_model, load_node_data
from fedplat.models import evaluate, train_epochs
from fedplat.proto import peer_pb2_grpc as pb_grpc
from fedplat.transport.codec import sha256_hex
from fedplat.transport.errors import (
    FedplatError,
    InvalidArgument,
    StaleUpdate,
    Unavailable,
    UnknownClient,
)
from fedplat.vectors import flatten, layout_of, load_vector

__all__ = ["PeerConfig", "PeerNode", "peer_from_scenario"]

MiB = 1024 * 1024


@dataclass(frozen=True)
class PeerConfig:
    """Settings of one peer (see the module docstring for the lifecycle).

    Attributes
    ----------
    node_id : str
        Unique name of the peer (``str(i)`` for node ``i`` of a scenario).
    listen : str
        ``host:port`` to serve on (port 0: any free port).
    advertise : str, optional
        Address others should use (default: the listen host and bound port).
    seeds : tuple of str
        Bootstrap peers, ``host:port`` or ``id@host:port``.
    target_degree : int
        Link to peers learned from the seeds until this many neighbours (0: the
        seeds only).
    max_degree : int
        Refuse new links beyond this many neighbours.
    rounds : int
    rule : str
        A :data:`fedplat.gossip.mixing.RULES` name.
    outer_step, alpha, beta
        NoLoCo's outer step (``rule="noloco"``).
    epochs, batch_size, lr
        Local SGD per round.
    heartbeat_s, dead_after_s, round_timeout_s, rpc_timeout_s, bootstrap_timeout_s
        Failure-detection and waiting times, seconds.
    max_model_bytes, chunk_bytes
        Largest model payload accepted, and stream chunk size.
    compressor, compressor_params
        Link compression (a :mod:`fedplat.compression` registry name).
    eval_every : int
        Evaluate on the test set every this many rounds (and after the last).
    max_staleness : int
        Mix a neighbour's model only if it is at most this many rounds old.
    catch_up : bool
        Start from the neighbours' average when they are ahead.
    linger_s : float
        Keep serving this long after the last round (slower neighbours may still
        need this peer's model), then stop.
    min_round_s : float
        Make each round last at least this long (paces demos and tests, or
        emulates a duty-cycled device).
    seed : int
    """

    node_id: str
    listen: str = "127.0.0.1:0"
    advertise: str | None = None
    seeds: tuple[str, ...] = ()
    target_degree: int = 0
    max_degree: int = 64
    rounds: int = 10
    rule: str = "metropolis_hastings"
    outer_step: bool = False
    alpha: float = 0.7
    beta: float = 0.5
    epochs: int = 1
    batch_size: int = 32
    lr: float = 0.05
    heartbeat_s: float = 0.5
    dead_after_s: float = 3.0
    round_timeout_s: float = 10.0
    rpc_timeout_s: float = 5.0
    bootstrap_timeout_s: float = 60.0
    max_model_bytes: int = 64 * MiB
    chunk_bytes: int = 1 * MiB
    compressor: str = "identity"
    compressor_params: dict[str, Any] = field(default_factory=dict)
    eval_every: int = 1
    max_staleness: int = 2
    catch_up: bool = True
    linger_s: float = 5.0
    min_round_s: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.node_id or "@" in self.node_id:
            raise ValueError(f"node id must be non-empty without '@': {self.node_id!r}")
        mx.get_mixing_rule(self.rule)  # an unknown name raises, listing valid ones
        if self.rounds < 1 or self.eval_every < 1:
            raise ValueError("rounds and eval_every must be >= 1")
        if self.heartbeat_s <= 0 or self.dead_after_s <= self.heartbeat_s:
            raise ValueError("need 0 < heartbeat_s < dead_after_s")
        if self.chunk_bytes < 1024:
            raise ValueError("chunk_bytes must be >= 1024")


@dataclass
class _Inbound:
    """The latest model a neighbour pushed (its ``x_hat`` for this link)."""

    round: int
    x: torch.Tensor
    num_examples: int
    degree: int


def _parse_seed(seed: str) -> tuple[str | None, str]:
    if "@" in seed:
        node_id, _, address = seed.partition("@")
        return node_id, address
    return None, seed


class PeerNode:
    """One gossip peer; see the module docstring.

    Parameters
    ----------
    config : PeerConfig
    model : nn.Module
        The architecture and the starting weights (the same seeded init on
        every peer).
    train : Dataset, optional
        Local data; ``None`` or empty for a relay-only peer.
    test : Dataset, optional
        Evaluation data for the reported accuracy.
    network : NetworkState, optional
        A scenario replay: links the scenario cuts are blocked at the scheduled
        rounds (node removals are enacted by killing processes instead).
    """

    def __init__(
        self,
        config: PeerConfig,
        model: nn.Module,
        train: Dataset | None = None,
        test: Dataset | None = None,
        network: NetworkState | None = None,
    ) -> None:
        self.config = config
        self.id = config.node_id
        self.log = logging.getLogger(f"fedplat.gossip.peer.{self.id}")
        self.model = model
        self.layout = layout_of(model)
        self.fingerprint = self.layout.fingerprint()
        self.dim = self.layout.numel
        self.x = flatten(model, self.layout)
        self.train_data = train if train is not None and len(train) > 0 else None
        self.test = test
        self.num_examples = 0 if self.train_data is None else len(self.train_data)
        self.network = network
        self.rule = mx.get_mixing_rule(config.rule)
        self._scenario_round = -1
        self.table = NeighbourTable(config.dead_after_s)
        self.round = 0
        self.finished = False
        self.accuracy: float | None = None
        self.consensus_gap: float | None = None
        self.rejected = 0
        self.last_rejection = ""
        self.bytes_sent = 0
        self.bytes_received = 0
        self._lock = threading.RLock()
        self._arrived = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._inbox: dict[str, _Inbound] = {}
        # Push-sum: weight and the mass received since the last mix.
        self.push_weight = 1.0
        self._ps_x = torch.zeros(self.dim)
        self._ps_w = 0.0
        self._ps_round: dict[str, int] = {}
        # NoLoCo outer state.
        self._phi = self.x.clone()
        self._momentum = torch.zeros(self.dim)
        self._published = self.x.clone()
        self._compressor = make_compressor(config.compressor, config.compressor_params)
        self._encoders: dict[str, LinkEncoder] = {}
        self._decoder = LinkDecoder(self._compressor, self.dim)
        self._clients: dict[str, PeerClient] = {}
        self._pending: dict[str, str | None] = {}  # seed address -> id if known
        self._known: dict[str, str] = {}  # peers heard of: id -> address
        self._rng = random.Random(f"{config.seed}:{self.id}")
        self._pool = futures.ThreadPoolExecutor(8, thread_name_prefix=f"peer{self.id}")
        self.server = grpc.server(
            futures.ThreadPoolExecutor(8, thread_name_prefix=f"rpc{self.id}"),
            options=[
                *channel_options(config.chunk_bytes + 4 * MiB),
                ("grpc.so_reuseport", 0),
            ],
        )
        pb_grpc.add_PeerServicer_to_server(PeerServicer(self), self.server)
        self.port = self.server.add_insecure_port(config.listen)
        if self.port == 0:
            raise OSError(f"cannot bind {config.listen}")
        host = config.listen.rpartition(":")[0] or "127.0.0.1"
        self.address = config.advertise or f"{host}:{self.port}"
        self._heartbeat = threading.Thread(
            target=self._heartbeat_loop, name=f"heartbeat{self.id}", daemon=True
        )

    # ================================================================ lifecycle
    def start(self) -> None:
        """Serve, contact the seeds, start the heartbeat (non-blocking)."""
        self.server.start()
        self.log.info("peer %s serving on %s", self.id, self.address)
        for seed in self.config.seeds:
            node_id, address = _parse_seed(seed)
            if node_id == self.id:
                continue
            if node_id is not None:
                self.table.add(node_id, address)
            self._pending[address] = node_id
        self._hello_pending()
        self._heartbeat.start()

    def run(self) -> None:
        """Start, run every round, linger, stop. Blocks."""
        self.start()
        try:
            self._wait_bootstrap()
            self._catch_up()
            if self.network is not None:
                self._apply_scenario(self.round)
            while self.round < self.config.rounds and not self._stop.is_set():
                self.run_round(self.round + 1)
            self.finished = self.round >= self.config.rounds
            if self.finished:
                self.log.info(
                    "peer %s finished %d rounds (accuracy %s)",
                    self.id,
                    self.round,
                    self.accuracy,
                )
                self._stop.wait(self.config.linger_s)
        finally:
            self.stop()

    def request_stop(self) -> None:
        """Ask :meth:`run` to finish (safe from a signal handler)."""
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        with self._arrived:
            self._arrived.notify_all()
        self.server.stop(grace=0.5).wait(2)
        self._pool.shutdown(wait=False, cancel_futures=True)
        for c in list(self._clients.values()):
            c.close()

    def _client(self, address: str) -> PeerClient:
        c = self._clients.get(address)
        if c is None:
            c = PeerClient(
                address,
                timeout=self.config.rpc_timeout_s,
                chunk_bytes=self.config.chunk_bytes,
                max_model_bytes=self.config.max_model_bytes,
            )
            self._clients[address] = c
        return c

    # ================================================================ bootstrap
    def _hello(self, address: str) -> HelloReply | None:
        try:
            reply = self._client(address).hello(
                Hello(
                    PeerAddress(self.id, self.address),
                    self.round,
                    self.fingerprint,
                    want_link=True,
                )
            )
        except FedplatError as exc:
            self.log.debug("hello to %s failed: %s", address, exc.reason)
            return None
        peer = reply.responder
        if reply.layout_fingerprint != self.fingerprint:
            self.log.warning(
                "peer %s at %s has another model layout; ignored", peer.node_id, address
            )
            return None
        for p in reply.known:
            if p.node_id != self.id:
                self._known.setdefault(p.node_id, p.address)
        if reply.linked:
            if self.table.add(peer.node_id, address):
                self.log.info("linked with %s at %s", peer.node_id, address)
            self._heard(peer.node_id, reply.round)
        return reply

    def _hello_pending(self) -> None:
        for address, _ in list(self._pending.items()):
            if self._hello(address) is not None:
                self._pending.pop(address, None)
        # Emergent topology: link to peers the seeds told us about.
        want = self.config.target_degree
        if want and len(self.table) < want:
            for node_id, address in sorted(self._known.items()):
                if len(self.table) >= want:
                    break
                if node_id not in self.table:
                    self._hello(address)

    def _wait_bootstrap(self) -> None:
        """Wait until every seed answered (or the bootstrap timeout)."""
        end = time.monotonic() + self.config.bootstrap_timeout_s
        while time.monotonic() < end and not self._stop.is_set():
            if not self._pending and all(n.alive for n in self.table.all()):
                return
            time.sleep(0.05)
        self.log.warning(
            "bootstrap: %d seed(s) not reachable; starting anyway", len(self._pending)
        )

    def _catch_up(self) -> None:
        """Start from the live neighbours' average if they are ahead of us."""
        if not self.config.catch_up or self.round > 0:
            return
        ahead = [n for n in self.table.live() if n.round > 0]
        if not ahead:
            return
        models, rounds = [], []
        for n in ahead:
            try:
                msg = self._client(n.address).pull(self.id)
                models.append(self._check_pulled(msg))
                rounds.append(msg.header.round)
            except (FedplatError, PayloadError) as exc:
                self.log.warning("catch-up pull from %s failed: %s", n.node_id, exc)
        if not models:
            return
        x = torch.stack(models).mean(0)
        with self._lock:
            self.x = x
            self._phi = x.clone()
            self._published = x.clone()
            self.round = max(rounds)
        self.log.info(
            "caught up to round %d from %d neighbour(s)", self.round, len(models)
        )

    def _check_pulled(self, msg: ModelMessage) -> torch.Tensor:
        mismatch = self.layout.describe_mismatch(msg.header.layout)
        if mismatch:
            raise PayloadError(f"wrong model shape: {mismatch}")
        payload = Payload.from_bytes(
            msg.data, expected_d=self.dim, expected_kinds=("dense",)
        )
        return payload.values.to(torch.float32)

    # ================================================================ heartbeat
    def _heard(
        self, node_id: str, round: int | None = None, degree: int | None = None
    ) -> None:
        t = self.table.heard_from(node_id, round, degree)
        if t is not None:
            self.log.info("neighbour %s is alive", node_id)
            with self._arrived:
                self._arrived.notify_all()

    def _ping(self, node_id: str, address: str) -> None:
        try:
            reply = self._client(address).ping(self.id, self.round)
        except FedplatError:
            return
        if reply.node_id == node_id:
            self._heard(node_id, reply.round, reply.degree)

    def _heartbeat_loop(self) -> None:
        last_hello = time.monotonic()
        while not self._stop.wait(self.config.heartbeat_s):
            try:
                jobs = [
                    self._pool.submit(self._ping, n.node_id, n.address)
                    for n in self.table.all()
                    if not n.blocked
                ]
            except RuntimeError:  # the pool shut down: we are stopping
                return
            futures.wait(jobs, timeout=self.config.heartbeat_s * 2)
            if self._pending and time.monotonic() - last_hello > 1.0:
                self._hello_pending()
                last_hello = time.monotonic()
            for t in self.table.refresh():
                self.log.warning(
                    "neighbour %s is dead (silent for %.1fs)",
                    t.node_id,
                    self.config.dead_after_s,
                )
                with self._arrived:
                    self._arrived.notify_all()

    # ================================================================ rounds
    def run_round(self, r: int) -> None:
        """Train, exchange and mix once, as round ``r``."""
        cfg = self.config
        t0 = time.monotonic()
        self._train(r)
        if self.rule.exchange == "pairs":
            self._noloco(r)
        else:
            self._push_all(r)
            self._wait_for(r)
            self._mix(r)
        if self.test is not None and (r % cfg.eval_every == 0 or r == cfg.rounds):
            with self._lock:
                load_vector(self.model, self._estimate(), self.layout)
            self.accuracy = evaluate(self.model, self.test).accuracy
        self._stop.wait(max(0.0, cfg.min_round_s - (time.monotonic() - t0)))
        with self._lock:
            self.round = r
        if self.network is not None:
            self._apply_scenario(r)
        self.log.info(
            "round %d done: accuracy %s, %d live neighbour(s)",
            r,
            None if self.accuracy is None else round(self.accuracy, 4),
            len(self.table.live()),
        )

    def _estimate(self) -> torch.Tensor:
        if self.rule.debiased:
            return self.x / self.push_weight
        return self.x

    def _train(self, r: int) -> None:
        if self.train_data is None:
            with self._lock:
                self._published = self._estimate().clone()
            return
        cfg = self.config
        with self._lock:
            start = self._estimate().clone()
        load_vector(self.model, start, self.layout)
        train_epochs(
            self.model,
            self.train_data,
            epochs=cfg.epochs,
            batch_size=cfg.batch_size,
            lr=cfg.lr,
            seed=(cfg.seed * 1_000_003 + r) * 7919
            + zlib.crc32(self.id.encode()) % 7919,
        )
        trained = flatten(self.model, self.layout)
        with self._lock:
            if self.rule.debiased:
                # SGP (Assran et al. 2019): the local step moves the numerator.
                self.x = self.x + (trained - start)
            else:
                self.x = trained
            self._published = self._estimate().clone()

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

    # ---------------------------------------------------------------- pushing
    def _push_all(self, r: int) -> None:
        live = self.table.live()
        with self._lock:
            if self.rule.debiased:
                share = mx.push_sum_share(self.x, self.push_weight, len(live))
                self.x, self.push_weight = share.x.clone(), share.w
                vec, weight = share.x, share.w
            else:
                vec, weight = self.x.clone(), 0.0
        try:
            jobs = {
                self._pool.submit(
                    self._push, n.node_id, n.address, r, vec, weight, len(live)
                ): n.node_id
                for n in live
            }
        except RuntimeError:  # stopped from another thread mid-round
            return
        for job in futures.as_completed(jobs):
            if not job.result() and self.rule.debiased:
                with self._lock:  # undelivered mass stays here (push-sum invariant)
                    self.x = self.x + vec
                    self.push_weight += weight

    def _push(
        self,
        node_id: str,
        address: str,
        r: int,
        vec: torch.Tensor,
        weight: float,
        degree: int,
    ) -> bool:
        enc = self._encoders.get(node_id)
        if enc is None:
            enc = self._encoders[node_id] = LinkEncoder(self._compressor, self.dim)
        client = self._client(address)
        for attempt in range(2):
            msg = enc.encode(vec, r, self.config.seed)
            header = ModelHeader(
                sender_id=self.id,
                round=r,
                layout=self.layout,
                num_examples=self.num_examples,
                degree=max(1, degree),
                push_weight=weight,
                base_version=msg.base_version,
                version=msg.version,
                total_bytes=len(msg.data),
                sha256=sha256_hex(msg.data),
            )
            try:
                client.push(ModelMessage(header, msg.data))
            except StaleUpdate as exc:  # the receiver lost our shared reference
                self.log.debug("push to %s: %s; resending in full", node_id, exc)
                enc.reset()
                continue
            except UnknownClient as exc:  # it forgot us (restarted): re-link
                self.log.debug("push to %s: %s", node_id, exc.reason)
                if attempt == 0 and self._hello(address) is not None:
                    enc.reset()
                    continue
                return False
            except Unavailable:
                return False
            except InvalidArgument as exc:
                self.log.error("%s refused our model: %s", node_id, exc.reason)
                return False
            enc.commit(msg)
            self._heard(node_id, None)
            with self._lock:
                self.bytes_sent += len(msg.data)
            self.table.count_bytes(node_id, sent=len(msg.data))
            return True
        return False

    def _wait_for(self, r: int) -> None:
        """Until every live neighbour's round-``r`` model arrived, or the timeout."""
        end = time.monotonic() + self.config.round_timeout_s
        with self._arrived:
            while not self._stop.is_set():
                missing = [
                    n.node_id
                    for n in self.table.live()
                    if self._round_of(n.node_id) < r
                ]
                left = end - time.monotonic()
                if not missing or left <= 0:
                    if missing:
                        self.log.info("round %d: no model from %s in time", r, missing)
                    return
                self._arrived.wait(min(left, 0.25))

    def _round_of(self, node_id: str) -> int:
        if self.rule.debiased:
            return self._ps_round.get(node_id, -1)
        entry = self._inbox.get(node_id)
        return -1 if entry is None else entry.round

    # ---------------------------------------------------------------- mixing
    def _mix(self, r: int) -> None:
        cfg = self.config
        live = {n.node_id for n in self.table.live()}
        with self._lock:
            if self.rule.debiased:
                self.x = self.x + self._ps_x
                self.push_weight += self._ps_w
                self._ps_x = torch.zeros(self.dim)
                self._ps_w = 0.0
                return
            used = [
                e
                for j, e in sorted(self._inbox.items())
                if j in live and e.round >= r - cfg.max_staleness
            ]
            if not used:
                return
            nb = torch.stack([e.x for e in used])
            self.consensus_gap = float(((nb - self.x) ** 2).sum(1).mean().sqrt())
            w = self.rule.row_weights(
                len(live),
                float(self.num_examples),
                torch.tensor([e.degree for e in used]),
                torch.tensor([float(e.num_examples) for e in used]),
            )
            self.x = mx.mix_row(w, self.x, nb)

    def _noloco(self, r: int) -> None:
        """Average with one random live neighbour's current model (pulled)."""
        cfg = self.config
        live = self.table.live()
        if not live:
            return
        partner = self._rng.choice(live)
        try:
            msg = self._client(partner.address).pull(self.id)
            theta_j = self._check_pulled(msg)
        except (FedplatError, PayloadError) as exc:
            self.log.info("round %d: pull from %s failed: %s", r, partner.node_id, exc)
            return
        self._heard(partner.node_id, msg.header.round)
        with self._lock:
            self.bytes_received += len(msg.data)
            theta_mean = 0.5 * (self.x + theta_j)
            self.consensus_gap = float((self.x - theta_j).norm())
            if cfg.outer_step:
                st = mx.noloco_local_step(
                    theta_mean, self._phi, self._momentum, cfg.alpha, cfg.beta
                )
                self.x, self._phi, self._momentum = st.theta, st.phi, st.momentum
            else:
                self.x = theta_mean

    # ================================================================ handlers
    def reject(self, reason: str, sender: str = "?") -> None:
        """Count and log a refused message (the model is left untouched)."""
        with self._lock:
            self.rejected += 1
            self.last_rejection = reason
        self.log.warning("rejected a model from %s: %s", sender, reason)

    def on_hello(self, h: Hello) -> HelloReply:
        if h.layout_fingerprint != self.fingerprint:
            raise InvalidArgument(
                f"model layout differs (fingerprint {h.layout_fingerprint[:12]}..., "
                f"mine {self.fingerprint[:12]}...)"
            )
        if h.sender.node_id == self.id:
            raise InvalidArgument(f"peer id {self.id!r} is mine")
        known = h.sender.node_id in self.table
        linked = h.want_link and (known or len(self.table) < self.config.max_degree)
        if linked:
            if self.table.add(h.sender.node_id, h.sender.address):
                self.log.info(
                    "linked with %s at %s (incoming)",
                    h.sender.node_id,
                    h.sender.address,
                )
            # A restarted peer starts a new link: forget its old reference.
            self._decoder.forget(h.sender.node_id)
            self._heard(h.sender.node_id, h.round)
        return HelloReply(
            PeerAddress(self.id, self.address),
            self.round,
            self.fingerprint,
            linked,
            tuple(p for p in self.table.addresses() if p.node_id != h.sender.node_id),
        )

    def on_ping(self, sender_id: str, round: int) -> PingReply:
        if sender_id in self.table:
            self._heard(sender_id, round)
        return PingReply(self.id, self.round, max(1, len(self.table.live())))

    def on_push(self, msg: ModelMessage) -> PushReply:
        h = msg.header
        try:
            x_hat, version = self._validate(msg)
        except FedplatError as exc:
            self.reject(exc.reason, h.sender_id)
            raise
        with self._arrived:
            self._decoder.commit(h.sender_id, x_hat, version)
            if self.rule.debiased:
                self._ps_x = self._ps_x + x_hat
                self._ps_w += h.push_weight
                self._ps_round[h.sender_id] = max(
                    self._ps_round.get(h.sender_id, -1), h.round
                )
            else:
                self._inbox[h.sender_id] = _Inbound(
                    h.round, x_hat, h.num_examples, max(1, h.degree)
                )
            self.bytes_received += len(msg.data)
            self._arrived.notify_all()
        self.table.count_bytes(h.sender_id, received=len(msg.data))
        self._heard(h.sender_id, h.round, h.degree)
        return PushReply(True, "", self.round)

    def _validate(self, msg: ModelMessage) -> tuple[torch.Tensor, str]:
        h = msg.header
        if h.sender_id not in self.table:
            raise UnknownClient(
                f"{h.sender_id!r} is not a neighbour of {self.id!r}; say Hello first"
            )
        if self.table.is_blocked(h.sender_id):
            raise UnknownClient(f"link {h.sender_id}-{self.id} is cut")
        mismatch = self.layout.describe_mismatch(h.layout)
        if mismatch:
            raise InvalidArgument(f"wrong model shape: {mismatch}")
        if self.rule.debiased and not h.push_weight > 0:
            raise InvalidArgument("push-sum message without a positive weight")
        try:
            x_hat, version = self._decoder.decode(
                h.sender_id, msg.data, h.base_version, h.version
            )
        except ReferenceMismatch as exc:
            raise StaleUpdate(str(exc)) from None
        except ValueError as exc:  # PayloadError, CompressionError
            raise InvalidArgument(f"bad model payload: {exc}") from None
        norm = float(x_hat.norm())
        if not math.isfinite(norm):
            raise InvalidArgument("model norm is not finite")
        return x_hat, version

    def on_pull(self, sender_id: str) -> ModelMessage:
        if sender_id and self.table.is_blocked(sender_id):
            raise UnknownClient(f"link {sender_id}-{self.id} is cut")
        with self._lock:
            x = self._published.clone()
            r = self.round
        data = dense_payload(x).to_bytes()
        if sender_id in self.table:
            self._heard(sender_id)
            self.table.count_bytes(sender_id, sent=len(data))
        with self._lock:
            self.bytes_sent += len(data)
        return ModelMessage(
            ModelHeader(
                self.id,
                r,
                self.layout,
                self.num_examples,
                max(1, len(self.table.live())),
                0.0,
                "",
                "pull",
                len(data),
                sha256_hex(data),
            ),
            data,
        )

    def status(self) -> PeerStatus:
        with self._lock:
            digest = sha256_hex(self.x.numpy().tobytes())
            return PeerStatus(
                node_id=self.id,
                round=self.round,
                finished=self.finished,
                accuracy=self.accuracy,
                num_examples=self.num_examples,
                model_sha256=digest,
                rejected=self.rejected,
                last_rejection=self.last_rejection,
                bytes_sent=self.bytes_sent,
                bytes_received=self.bytes_received,
                consensus_gap=self.consensus_gap,
                neighbours=tuple(self.table.views()),
            )


def peer_from_scenario(
    scenario: Scenario,
    node: int,
    *,
    listen: str,
    seeds: tuple[str, ...],
    relay: bool | None = None,
    **overrides: Any,
) -> PeerNode:
    """The peer for node ``node`` of a scenario (its data share, model, rule).

    ``overrides`` are :class:`PeerConfig` fields (timeouts, pacing, ...).
    """
    network = NetworkState(scenario)
    is_relay = (not network.has_data(node)) if relay is None else relay
    data = load_node_data(
        scenario.data, network.n, scenario.seed, {node} if is_relay else set()
    )
    test = data.test
    model = build_model(
        scenario.model, test.input_shape, test.num_classes, scenario.seed
    )
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
        epochs=t.epochs,
        batch_size=t.batch_size,
        lr=t.lr,
        compressor=scenario.links.compressor,
        compressor_params=dict(scenario.links.params),
        eval_every=scenario.eval.every,
        seed=scenario.seed,
        **overrides,
    )
    return PeerNode(cfg, model, data.train[node], test, network)

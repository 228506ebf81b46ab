"""The calls a peer makes: hellos to seeds, model pushes, heartbeats, pulls.

One :class:`~fedplat.gossip.client.PeerClient` per neighbour (its certificate's
name checked on every connection). A seed given by address only is greeted
first; its signed answer says which member it is, and later calls use a
channel that checks that member's certificate. Peers a neighbour lists are
only hints: linking to one needs its own signed answer, and a hint never
changes the address of a peer already known.
"""

from __future__ import annotations

import hashlib
import random
import time
from concurrent import futures
from typing import TYPE_CHECKING

import torch

from fedplat.compression import Payload, PayloadError
from fedplat.gossip.client import PeerClient
from fedplat.gossip.config import parse_seed
from fedplat.gossip.links import LinkEncoder
from fedplat.gossip.mixing import push_sum_share
from fedplat.protocol.errors import (
    FedplatError,
    InvalidArgument,
    StaleUpdate,
    Unavailable,
    UnknownClient,
)
from fedplat.protocol.peer import HelloReply, ModelHeader, ModelMessage, PeerAddress

if TYPE_CHECKING:
    from fedplat.gossip.node import PeerNode

__all__ = ["Outbound"]


class Outbound:
    """Calls from one peer to the others (thread-safe; runs on the node's pool)."""

    def __init__(self, node: PeerNode) -> None:
        self.node = node
        self._clients: dict[tuple[str | None, str], PeerClient] = {}
        self._encoders: dict[str, LinkEncoder] = {}
        self.pending: dict[str, str | None] = {}  # seed address -> id if known
        self.known: dict[str, str] = {}  # peers heard of: id -> address
        self._rng = random.Random(f"{node.config.seed}:{node.id}")

    def client(self, node_id: str | None, address: str) -> PeerClient:
        key = (node_id, address)
        c = self._clients.get(key)
        if c is None:
            cfg = self.node.config
            c = PeerClient(
                address,
                signer=self.node.signer,
                membership=self.node.membership,
                server_id=node_id,
                tls=self.node.security.tls,
                timeout=cfg.rpc_timeout_s,
                chunk_bytes=cfg.chunk_bytes,
                max_model_bytes=self.node.max_payload_bytes,
            )
            self._clients[key] = c
        return c

    def close(self) -> None:
        for c in list(self._clients.values()):
            c.close()

    # ------------------------------------------------------------ bootstrap
    def add_seeds(self, seeds: tuple[str, ...]) -> None:
        node = self.node
        for seed in seeds:
            node_id, address = parse_seed(seed)
            if node_id is None:  # a pinned address names its member
                m = node.membership.by_address(address)
                node_id = None if m is None else m.node_id
            if node_id == node.id:
                continue
            if node_id is not None:
                m = node.membership.peer(node_id)
                if m is None:
                    node.log.warning("seed %s is not a member; ignored", seed)
                    continue
                node.table.add(node_id, m.address or address)
            self.pending[address] = node_id

    def hello(self, address: str, node_id: str | None = None) -> HelloReply | None:
        """Greet the peer at ``address``; link with it if it agrees."""
        node = self.node
        try:
            reply = self.client(node_id, address).hello(
                PeerAddress(node.id, node.address), node.state.round, node.fingerprint
            )
        except FedplatError as exc:
            node.log.debug("hello to %s failed: %s", address, exc.reason)
            return None
        peer = reply.responder.node_id
        if reply.layout_fingerprint != node.fingerprint:
            node.log.warning("peer %s at %s has another model layout", peer, address)
            return None
        for p in reply.known:  # hints only: never re-address a known peer
            m = node.membership.peer(p.node_id)
            if m is not None and p.node_id != node.id and p.node_id not in node.table:
                self.known.setdefault(p.node_id, m.address or p.address)
        if reply.linked:
            member = node.membership.peer(peer)
            assert member is not None  # the client verified it
            if node.table.add(peer, member.address or address):
                node.log.info("linked with %s at %s", peer, address)
            node.heard(peer, reply.round)
        return reply

    def hello_pending(self) -> None:
        node = self.node
        for address, node_id in list(self.pending.items()):
            if self.hello(address, node_id) is not None:
                self.pending.pop(address, None)
        # Emergent topology: link to peers the seeds told us about.
        want = node.config.target_degree
        if want and len(node.table) < want:
            for node_id, address in sorted(self.known.items()):
                if len(node.table) >= want:
                    break
                if node_id not in node.table:
                    self.hello(address, node_id)

    # ------------------------------------------------------------ pushing
    def push_all(self, r: int) -> None:
        """Push this round's model to every live neighbour (in parallel)."""
        node = self.node
        st = node.state
        live = node.table.live()
        with st.lock:
            if node.rule.debiased:
                share = push_sum_share(st.x, st.push_weight, len(live))
                st.x, st.push_weight = share.x.clone(), share.w
                vec, weight = share.x, share.w
            else:
                vec, weight = st.x.clone(), 0.0
        try:
            jobs = {
                node.pool.submit(
                    self.push, n.node_id, n.address, r, vec, weight, len(live)
                ): n.node_id
                for n in live
            }
        except RuntimeError:  # stopped from another thread mid-round
            return
        for job in futures.as_completed(jobs):
            if not job.result() and node.rule.debiased:
                with st.lock:  # undelivered mass stays here (push-sum invariant)
                    st.x = st.x + vec
                    st.push_weight += weight

    def push(
        self,
        node_id: str,
        address: str,
        r: int,
        vec: torch.Tensor,
        weight: float,
        degree: int,
    ) -> bool:
        """Push ``vec`` ``[d]`` to one neighbour; whether it was accepted."""
        node = self.node
        enc = self._encoders.get(node_id)
        if enc is None:
            enc = self._encoders[node_id] = LinkEncoder(node.compressor, node.dim)
        client = self.client(node_id, address)
        for attempt in range(2):
            msg = enc.encode(vec, r, node.config.seed)
            header = ModelHeader(
                node.id,
                r,
                node.layout,
                node.num_examples,
                max(1, degree),
                weight,
                msg.base_version,
                msg.version,
                len(msg.data),
                hashlib.sha256(msg.data).hexdigest(),
            )
            try:
                client.push(header, msg.data, node.fingerprint)
            except StaleUpdate as exc:  # the receiver lost our shared reference
                node.log.debug("push to %s: %s; resending in full", node_id, exc)
                enc.reset()
                continue
            except UnknownClient as exc:  # it forgot us (restarted): re-link
                node.log.debug("push to %s: %s", node_id, exc.reason)
                if attempt == 0 and self.hello(address, node_id) is not None:
                    enc.reset()
                    continue
                return False
            except Unavailable:
                return False
            except FedplatError as exc:
                node.log.error("%s refused our model: %s", node_id, exc.reason)
                return False
            enc.commit(msg)
            node.heard(node_id)
            node.state.count_bytes(sent=len(msg.data))
            node.table.count_bytes(node_id, sent=len(msg.data))
            return True
        return False

    # ------------------------------------------------------------ heartbeat
    def ping(self, node_id: str, address: str) -> None:
        try:
            reply = self.client(node_id, address).ping(self.node.state.round)
        except FedplatError:
            return
        if reply.node_id == node_id:
            self.node.heard(node_id, reply.round, reply.degree)

    def heartbeat_loop(self) -> None:
        """Ping every neighbour each ``heartbeat_s``; mark the silent ones dead."""
        node = self.node
        cfg = node.config
        last_hello = time.monotonic()
        while not node.stopping.wait(cfg.heartbeat_s):
            try:
                jobs = [
                    node.pool.submit(self.ping, n.node_id, n.address)
                    for n in node.table.all()
                    if not n.blocked
                ]
            except RuntimeError:  # the pool shut down: we are stopping
                return
            futures.wait(jobs, timeout=cfg.heartbeat_s * 2)
            if self.pending and time.monotonic() - last_hello > 1.0:
                self.hello_pending()
                last_hello = time.monotonic()
            for t in node.table.refresh():
                node.log.warning(
                    "neighbour %s is dead (silent for %.1fs)",
                    t.node_id,
                    cfg.dead_after_s,
                )
                node.state.wake()

    # ------------------------------------------------------------ pulling
    def pull(self, node_id: str, address: str) -> tuple[ModelMessage, torch.Tensor]:
        """A neighbour's signed current model, as ``[d]`` float32.

        Raises
        ------
        FedplatError
            The call failed, or the answer is not that neighbour's.
        InvalidArgument
            The model has another layout or a malformed payload.
        """
        node = self.node
        msg = self.client(node_id, address).pull(node.state.round)
        mismatch = node.layout.describe_mismatch(msg.header.layout)
        if mismatch:
            raise InvalidArgument(f"pulled model has a wrong shape: {mismatch}")
        try:
            payload = Payload.from_bytes(
                msg.data, expected_d=node.dim, expected_kinds=("dense",)
            )
        except PayloadError as exc:
            raise InvalidArgument(f"pulled model: {exc}") from None
        node.heard(node_id, msg.header.round)
        node.state.count_bytes(received=len(msg.data))
        return msg, payload.values.to(torch.float32)

    def random_live(self) -> tuple[str, str] | None:
        """A random live neighbour ``(id, address)`` (NoLoCo's partner)."""
        live = self.node.table.live()
        if not live:
            return None
        n = self._rng.choice(live)
        return n.node_id, n.address

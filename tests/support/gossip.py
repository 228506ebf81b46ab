"""Gossip peers for tests: secured clusters, in-process peers and rings, clients
that sign as a member or an observer, a valid request of every ``Peer`` call
(for tests and fuzzers) and raw calls that send arbitrary bytes."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import torch

from fedplat.compression import dense_payload
from fedplat.gossip.client import PeerClient, channel_options
from fedplat.gossip.messages import Hello, ModelHeader, ModelMessage, PeerAddress
from fedplat.gossip.node import PeerConfig, PeerNode
from fedplat.gossip.pki import OBSERVER, ClusterFiles, make_cluster
from fedplat.gossip.scenario import ModelSpec
from fedplat.gossip.server import SERVICE
from fedplat.gossip.setup import NodeData, build_model
from fedplat.gossip.signing import Signer
from fedplat.gossip.tls import PeerTls, open_channel
from fedplat.proto import peer_pb2 as pb
from fedplat.proto import peer_serde as serde
from fedplat.vectors import Layout
from tests.support.configs import free_port

#: Members that never run a peer: the tests' "compromised member".
SPARE = "spare"

#: Each call's path and whether its request is a stream.
PEER_RPCS: dict[str, bool] = {
    "Hello": False,
    "Ping": False,
    "PushModel": True,
    "PullModel": False,
    "GetStatus": False,
}


def peer_files(
    root: Path,
    ids: Iterable[str],
    *,
    tls: bool = True,
    addresses: Mapping[str, str] | None = None,
    spares: Iterable[str] = (SPARE,),
) -> ClusterFiles:
    """CA, certificates, identity keys and a membership for ``ids`` (+ spares)."""
    return make_cluster(root, [*ids, *spares], tls=tls, addresses=addresses)


#: The small digits model of the in-process peers.
MODEL = ModelSpec(name="mlp", params={"hidden": [16]})


def make_peer(
    data: NodeData,
    files: ClusterFiles,
    i: int,
    port: int,
    seeds: tuple[str, ...] = (),
    **over: Any,
) -> PeerNode:
    """In-process peer ``str(i)`` on 127.0.0.1:``port`` training digits share
    ``i`` (``over``: :class:`PeerConfig` fields)."""
    cfg: dict[str, Any] = {
        "node_id": str(i),
        "listen": f"127.0.0.1:{port}",
        "seeds": seeds,
        "rounds": 5,
        "lr": 0.1,
        "batch_size": 16,
        "heartbeat_s": 0.2,
        "dead_after_s": 1.5,
        "round_timeout_s": 5.0,
        "linger_s": 0.5,
        "bootstrap_timeout_s": 20.0,
    }
    cfg.update(over)
    model = build_model(MODEL, (1, 8, 8), 10, 0)
    return PeerNode(
        PeerConfig(**cfg),
        model,
        data.train[i],
        data.test,
        security=files.security(str(i)),
    )


def make_ring(
    data: NodeData, files: ClusterFiles, n: int, **over: Any
) -> list[PeerNode]:
    """Peers ``0 .. n-1`` on a ring, each seeded with its two neighbours."""
    ports = [free_port() for _ in range(n)]
    return [
        make_peer(
            data,
            files,
            i,
            ports[i],
            tuple(f"{j}@127.0.0.1:{ports[j]}" for j in ((i - 1) % n, (i + 1) % n)),
            **over,
        )
        for i in range(n)
    ]


def start_peers(nodes: list[PeerNode]) -> list[threading.Thread]:
    """Run every peer in a thread (see :func:`join_peers`)."""
    threads = [threading.Thread(target=nd.run, daemon=True) for nd in nodes]
    for t in threads:
        t.start()
    return threads


def join_peers(threads: list[threading.Thread], timeout: float = 60) -> None:
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a peer did not finish"


def run_peers(nodes: list[PeerNode], timeout: float = 60) -> None:
    join_peers(start_peers(nodes), timeout)


def member_tls(files: ClusterFiles, node_id: str) -> PeerTls | None:
    if not files.tls:
        return None
    return PeerTls.load(files.ca, files.cert(node_id), files.key(node_id))


def client_as(
    files: ClusterFiles,
    node_id: str,
    address: str,
    server_id: str | None,
    *,
    timeout: float = 5.0,
    tls: PeerTls | str | None = "own",
) -> PeerClient:
    """A client signing as ``node_id`` (a member, or :data:`OBSERVER`) with its
    own certificate, or ``tls`` (``None``: plaintext)."""
    return PeerClient(
        address,
        signer=Signer(node_id, files.identity(node_id)),
        membership=files.load_membership(),
        server_id=server_id,
        tls=member_tls(files, node_id) if tls == "own" else tls,  # type: ignore[arg-type]
        timeout=timeout,
    )


def observer(files: ClusterFiles, address: str, server_id: str) -> PeerClient:
    return client_as(files, OBSERVER, address, server_id)


@dataclass(frozen=True)
class PeerRequests:
    """One valid, signed request of each ``Peer`` call."""

    hello: pb.HelloRequest
    ping: pb.PingRequest
    push: list[pb.ModelChunk]
    pull: pb.PullRequest
    status: pb.StatusRequest

    def serialized(self) -> dict[str, list[bytes]]:
        """Call name -> its request messages as bytes (a stream for PushModel)."""
        return {
            "Hello": [self.hello.SerializeToString()],
            "Ping": [self.ping.SerializeToString()],
            "PushModel": [c.SerializeToString() for c in self.push],
            "PullModel": [self.pull.SerializeToString()],
            "GetStatus": [self.status.SerializeToString()],
        }


def valid_peer_requests(
    files: ClusterFiles,
    sender_id: str,
    receiver_id: str,
    layout: Layout,
    *,
    round: int = 0,
    sender_address: str = "127.0.0.1:1",
    vec: torch.Tensor | None = None,
    chunk_bytes: int = 64 * 1024,
) -> PeerRequests:
    """A valid request of every call from member ``sender_id`` to
    ``receiver_id`` (fresh nonces each time): what a structure-aware fuzzer
    mutates. The push carries ``vec`` (zeros by default) as a dense model."""
    signer = Signer(sender_id, files.identity(sender_id))
    fp = layout.fingerprint()
    hello = signer.hello(
        Hello(PeerAddress(sender_id, sender_address), round, fp, True, receiver_id)
    )
    data = dense_payload(vec if vec is not None else torch.zeros(layout.numel))
    body = data.to_bytes()
    header = signer.model(
        ModelHeader(
            sender_id,
            round,
            layout,
            len(body) // 4,
            1,
            0.0,
            "",
            f"{sender_id}:1",
            len(body),
            hashlib.sha256(body).hexdigest(),
            receiver_id=receiver_id,
        ),
        fp,
    )

    def call(rpc: str) -> pb.CallAuth:
        return serde.call_to_proto(signer.call(rpc, receiver_id, round))

    return PeerRequests(
        hello=serde.hello_to_proto(hello),
        ping=pb.PingRequest(auth=call("ping")),
        push=list(serde.model_to_chunks(ModelMessage(header, body), chunk_bytes)),
        pull=pb.PullRequest(auth=call("pull")),
        status=pb.StatusRequest(auth=call("status")),
    )


def raw_channel(
    files: ClusterFiles, address: str, *, as_id: str | None, server_id: str
) -> grpc.Channel:
    """A channel presenting ``as_id``'s certificate (``None``: plaintext)."""
    tls = None if as_id is None else member_tls(files, as_id)
    return open_channel(address, tls, server_id, channel_options(8 * 1024 * 1024))


def send_raw(
    channel: grpc.Channel, rpc: str, messages: list[bytes], timeout: float = 5.0
) -> tuple[grpc.StatusCode, str]:
    """Send ``messages`` (raw bytes) to ``rpc``; its status code and details."""
    path = f"/{SERVICE}/{rpc}"
    ident: Any = lambda b: b  # noqa: E731 - bytes go out as they are
    try:
        if PEER_RPCS[rpc]:
            channel.stream_unary(path, ident, ident)(iter(messages), timeout=timeout)
        elif rpc == "PullModel":
            for _ in channel.unary_stream(path, ident, ident)(
                messages[0], timeout=timeout
            ):
                pass
        else:
            channel.unary_unary(path, ident, ident)(messages[0], timeout=timeout)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""

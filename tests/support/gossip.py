"""Gossip peers for tests: secured clusters, in-process peers and rings, and
clients that sign as a member or an observer (requests by hand:
:mod:`fedplat.testing.peer`)."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fedplat.gossip.client import PeerClient
from fedplat.gossip.node import PeerConfig, PeerNode
from fedplat.gossip.pki import OBSERVER, ClusterFiles, make_cluster
from fedplat.gossip.scenario import ModelSpec
from fedplat.gossip.setup import NodeData, build_model
from fedplat.gossip.signing import Signer
from fedplat.gossip.tls import PeerTls
from fedplat.protocol.task import TrainingSettings
from fedplat.testing.peer import member_tls
from tests.support.configs import free_port

#: Members that never run a peer: the tests' "compromised member".
SPARE = "spare"


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
        "training": TrainingSettings(lr=0.1, batch_size=16),
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

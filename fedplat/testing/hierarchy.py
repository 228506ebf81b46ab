"""A root, its edges and their clients in one process, over real gRPC sockets on
127.0.0.1: the hierarchical run of the scale benchmark and of the tests, and the
flat run it is compared with (``edges=0``).

Each coordinator is a :class:`~fedplat.server.app.BackgroundServer` with its own
store; each client is an SDK :class:`~fedplat.client.Client` thread. An edge's
run file is the root's with its own name, store, checkpoints and port, and its
selection sized to its share of the clients.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import torch

from fedplat.client import Client
from fedplat.server.app import BackgroundServer
from fedplat.server.config import parse_config
from fedplat.server.upstream import UpstreamSettings, attach_upstream
from fedplat.store import Store

#: ``make_client(i, address, enrolment_token)``: client ``i`` of the run.
MakeClient = Callable[[int, str, str], Client]


@dataclass(frozen=True)
class HierarchyRun:
    """What the root saw: its final model and, per round, bytes in and time."""

    weights: torch.Tensor  # [d] the root's final global model
    root_bytes_in: list[int]  # per root round: the uploads' bytes
    round_seconds: list[float]  # per root round, as the root recorded it
    wall_seconds: float
    edge_metrics: dict[str, float]  # client.edge.* of the last round, summed


def reference_clients(n: int, dataset: str = "digits", hidden: int = 64) -> MakeClient:
    """``make_client`` for plaintext gRPC reference clients: client ``i`` trains
    an MLP with one hidden layer of ``hidden`` on partition ``i`` of ``n`` of
    ``dataset`` and is named ``client-i`` (as ``fedplat client`` names it)."""
    from fedplat.reference.clients import ReferenceSpec, reference_parts

    def make(i: int, address: str, token: str) -> Client:
        spec = ReferenceSpec(
            dataset=dataset,
            model="mlp",
            model_params={"hidden": [hidden]},
            num_partitions=n,
            partition_id=i,
        )
        p = reference_parts(spec)
        return Client(
            address, p.model, p.train, num_examples=p.num_examples,
            name=f"client-{i}", insecure=True, enrolment_token=token,
            poll_seconds=1.0,
        )  # fmt: skip

    return make


def _tokens(store_url: str, run_name: str, n: int) -> list[str]:
    with Store(store_url) as store:
        made = store.create_tokens(
            n, expires_at=datetime.now(UTC) + timedelta(hours=2), run_name=run_name
        )
    return [secret for _, secret in made]


def _sized(run: dict[str, Any], clients: int) -> dict[str, Any]:
    sel = run.setdefault("selection", {})
    sel.update(clients_per_round=clients, min_available=clients, quorum=clients)
    return run


def _edge_run(root: dict[str, Any], tmp: Path, e: int, clients: int) -> dict[str, Any]:
    run = copy.deepcopy(root)
    d = tmp / f"edge-{e}"
    d.mkdir(parents=True, exist_ok=True)
    run["run"] = {**run["run"], "name": f"edge-{e}"}
    run["store"] = {"url": str(d / "fedplat.db")}
    run["checkpoints"] = {"dir": str(d / "ckpt")}
    run["server"] = {**run.get("server", {}), "address": "127.0.0.1:0"}
    return _sized(run, clients)


def run_hierarchy(
    tmp: Path,
    root_run: dict[str, Any],
    clients: int,
    edges: int,
    make_client: MakeClient,
    *,
    timeout: float = 600.0,
) -> HierarchyRun:
    """Run ``root_run`` (a run file's mapping) with ``clients`` clients split
    evenly over ``edges`` edges (0: the clients enrol at the root directly)."""
    if edges and clients % edges:
        raise ValueError("clients must split evenly over the edges")
    root_run = _sized(copy.deepcopy(root_run), edges or clients)
    root_run["server"] = {**root_run.get("server", {}), "address": "127.0.0.1:0"}
    cfg = parse_config(root_run)
    servers = [BackgroundServer(cfg).start()]
    root = servers[0]
    root_addr = f"127.0.0.1:{root.port}"
    workers: list[Client] = []
    try:
        if edges == 0:
            toks = _tokens(cfg.store.url, cfg.run.name, clients)
            workers = [make_client(i, root_addr, toks[i]) for i in range(clients)]
        per = clients // edges if edges else 0
        up = _tokens(cfg.store.url, cfg.run.name, edges) if edges else []
        for e in range(edges):
            ecfg = parse_config(_edge_run(root_run, tmp, e, per))
            srv = BackgroundServer(ecfg)
            attach_upstream(
                srv.coord,
                UpstreamSettings(
                    address=root_addr,
                    state_dir=str(tmp / f"edge-{e}" / "upstream"),
                    name=f"edge-{e}",
                    insecure=True,
                    enrolment_token=up[e],
                    poll_seconds=1.0,
                ),
            )
            servers.append(srv.start())
            toks = _tokens(ecfg.store.url, ecfg.run.name, per)
            addr = f"127.0.0.1:{srv.port}"
            workers += [make_client(e * per + j, addr, toks[j]) for j in range(per)]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        end = time.monotonic() + timeout
        while not root.coord.finished:
            if time.monotonic() > end:
                raise TimeoutError(f"the root's run did not finish in {timeout:.0f} s")
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        return _read_root(root, wall)
    finally:
        for w in workers:
            w.stop(5)
        for s in reversed(servers):
            s.stop()


def _read_root(root: BackgroundServer, wall: float) -> HierarchyRun:
    coord = root.coord
    store, run_id = root.server.store, coord.run_id
    coord.ctx.recorder.flush()
    rounds = [r.number for r in store.list_rounds(run_id) if r.status == "completed"]
    bytes_in = [
        sum(p.bytes_up for p in store.list_participations(run_id, n)) for n in rounds
    ]
    seconds = {
        m.round_number: m.value
        for m in store.list_metrics(run_id, "round_seconds")
        if m.client_id is None
    }
    last = max(rounds)
    edge: dict[str, float] = {}
    for m in store.list_metrics(run_id):
        if m.round_number == last and m.name.startswith("client.edge."):
            edge[m.name] = edge.get(m.name, 0.0) + m.value
    return HierarchyRun(
        coord.weights.clone(),
        bytes_in,
        [seconds[n] for n in rounds],
        wall,
        edge,
    )


__all__ = ["HierarchyRun", "MakeClient", "reference_clients", "run_hierarchy"]

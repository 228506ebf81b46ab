"""Byzantine clients through the client SDK: simulated coalitions and a real gRPC run
where the coordinator stores the robust rule's per-client flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from fedplat.client import Client
from fedplat.client.middleware import OutgoingUpdate
from fedplat.server.config import parse_config

from fedplat.protocol.messages import Task, TaskKind, UploadAck
from fedplat.reference.byzantine import AttackLayer, Coalition
from fedplat.sim import simulate
from fedplat.store import Store
from fedplat.transport.health import wait_healthy
from tests.support import (
    Procs,
    digits_client,
    issue_tokens,
    run_config,
    wait_for,
    write_config,
)


def test_attack_layer_without_coalition_flips_own_update() -> None:
    sent: list[torch.Tensor] = []

    def send(u: OutgoingUpdate) -> UploadAck:
        sent.append(u.vector)
        return UploadAck(True, "", 0)

    layer = AttackLayer("sign_flip", {"scale": 3.0})
    layer(
        OutgoingUpdate(Task(TaskKind.TRAIN, round=1), torch.tensor([1.0, -2.0]), 1),
        send,
    )
    assert sent[0].tolist() == [-3.0, 6.0]


def test_coalition_sees_honest_updates() -> None:
    co = Coalition(2)
    co.record(1, torch.tensor([1.0, 0.0]))
    co.record(1, torch.tensor([3.0, 2.0]))
    layer = AttackLayer("sign_flip", coalition=co)
    out: list[torch.Tensor] = []
    for _ in range(2):
        layer(
            OutgoingUpdate(Task(TaskKind.TRAIN, round=1), torch.zeros(2), 1),
            lambda u: out.append(u.vector) or UploadAck(True, "", 0),
        )
    assert [o.tolist() for o in out] == [[-2.0, -1.0], [-2.0, -1.0]]


def _sim(tmp: Path, aggregator: dict[str, Any], name: str) -> list[float]:
    n, f = 6, 2
    cfg = parse_config(
        run_config(
            tmp,
            name=name,
            rounds=4,
            clients=n,
            aggregator=aggregator,
            client_training={"epochs": 2, "lr": 0.1},
        )
    )
    co = Coalition(f)

    def build(i: int, factory: Any) -> Client:
        # Clients are stepped in index order: the attackers come last.
        layer = AttackLayer("alie", coalition=co) if i >= n - f else co.observer()
        client: Client = digits_client(i, factory, n, middleware=[layer])
        return client

    res = simulate(cfg, build, n)
    return [r.accuracy or 0.0 for r in res.rounds]


def test_median_resists_alie_better_than_mean(tmp_path: Path) -> None:
    mean = _sim(tmp_path / "a", {"name": "fedavg", "weighted": False}, "mean")
    med = _sim(
        tmp_path / "b",
        {"name": "median", "weighted": False},
        "median",
    )
    # Both learn something, but the honest majority matters only for the median.
    assert med[-1] > 0.5, med
    assert med[-1] >= mean[-1] - 0.05, (med, mean)


@pytest.mark.integration
def test_grpc_run_with_attacker_stores_krum_flags(tmp_path: Path, procs: Procs) -> None:
    cfg = run_config(
        tmp_path,
        rounds=2,
        clients=5,
        aggregator={"name": "krum", "params": {"f": 1}, "weighted": False},
    )
    address = cfg["server"]["address"]
    coord = procs.coordinator(write_config(tmp_path, cfg))
    wait_healthy(address, 180)
    tokens = issue_tokens(cfg, 5)
    for i in range(4):
        procs.client(address, i, 5, token=tokens[i])
    procs.client(
        address,
        4,
        5,
        "--attack",
        "sign_flip",
        "--attack-params",
        '{"scale": 20.0}',
        "--name",
        "attacker",
        token=tokens[4],
    )
    wait_for(lambda: coord.poll() is not None, 300, "the run to finish", procs=procs)
    assert coord.returncode == 0, procs.log("coordinator")
    store = Store(cfg["store"]["url"], migrate=False)
    run = store.get_run_by_name("test")
    assert run is not None and run.status == "completed"
    names = {c.id: c.name for c in store.list_clients(run.id)}
    for rnd in (1, 2):
        parts = {names[p.client_id]: p for p in store.list_participations(run.id, rnd)}
        bad = parts["attacker"]
        assert bad.verdict.selected is False and "excluded" in bad.verdict.flags
        assert bad.weight == 0.0
        assert sum(bool(p.verdict.selected) for p in parts.values()) == 1  # Krum
    store.close()

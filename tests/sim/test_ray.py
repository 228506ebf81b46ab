"""The Ray backend: its bytes-only transport (in process) and real Ray on
127.0.0.1 with 2 CPUs (integration)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fedplat.server.config import RunConfig, parse_config

from fedplat.protocol.errors import Unauthenticated
from fedplat.sim.clients import ReferencePopulation
from fedplat.sim.engine import VirtualCoordinator, drive, step_client
from fedplat.sim.ray_wire import CoordinatorEndpoint, RayConnection
from fedplat.sim.simulation import admit
from fedplat.store import Store
from fedplat.transport.inmemory import InMemoryConnection
from tests.support import REPO, run_config, write_config


def _run(cfg: RunConfig, connect: Callable[[VirtualCoordinator], Any]) -> Any:
    """A 10-client run whose clients reach the coordinator through
    ``connect(coord)()``; returns the final model and the bytes each sent."""
    store = Store(cfg.store.url)
    coord = VirtualCoordinator(cfg, store)
    population = ReferencePopulation.of(cfg, 10)
    clients = [population.build(i, connect(coord)) for i in range(10)]
    admit(store, cfg, clients)
    for c in clients:
        c.enroll()
    by_id = {c.client_id: c for c in clients}
    drive(coord, lambda ids: [step_client(by_id[cid]) for cid in ids])
    sent = [
        sorted(p.bytes_up for p in store.list_participations(coord.run_id, n))
        for n in (1, 2)
    ]
    store.close()
    return coord.weights.clone(), sent


def test_bytes_transport_gives_the_in_memory_result(tmp_path: Path) -> None:
    def cfg(sub: str) -> RunConfig:
        (tmp_path / sub).mkdir()
        return parse_config(run_config(tmp_path / sub, rounds=2, clients=4))

    def over_bytes(coord: VirtualCoordinator) -> Callable[[], RayConnection]:
        endpoint = CoordinatorEndpoint(coord)
        return lambda: RayConnection(
            lambda method, *a: getattr(endpoint, method)(*a), lambda h: h
        )

    w_mem, sent_mem = _run(cfg("mem"), lambda c: lambda: InMemoryConnection(c))
    w_ray, sent_ray = _run(cfg("ray"), over_bytes)
    assert torch.equal(w_mem, w_ray)
    assert sent_mem == sent_ray  # gRPC-equivalent byte counts on both transports


def test_endpoint_refuses_bad_bytes_and_maps_errors(tmp_path: Path) -> None:
    cfg = parse_config(run_config(tmp_path))
    store = Store(cfg.store.url)
    coord = VirtualCoordinator(cfg, store)
    endpoint = CoordinatorEndpoint(coord)
    assert endpoint.enroll(b"\xff\x00garbage")[:2] == ("err", "invalid_argument")
    huge = b"\x00" * (cfg.server.max_message_bytes + 1)
    assert endpoint.enroll(huge)[:2] == ("err", "invalid_argument")
    # An unknown id is answered as a wrong token is: nothing about who exists.
    assert endpoint.upload("nobody", "t", b"", b"")[:2] == ("err", "unauthenticated")
    conn = RayConnection(lambda m, *a: getattr(endpoint, m)(*a), lambda h: h)
    conn._client_id, conn._token = "c1", "forged"
    with pytest.raises(Unauthenticated):
        conn.get_task(0.0)
    population = ReferencePopulation.of(cfg, 2)
    c = population.build(0, lambda: conn)
    admit(store, cfg, [c])
    c.enroll()
    conn._token = "forged"
    with pytest.raises(Unauthenticated):
        conn.get_task(0.0)
    store.close()


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    import ray

    from fedplat.sim.ray_backend import local_ray, ray_temp_dir

    tmp = ray_temp_dir()  # short enough for Ray's socket paths
    before = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"  # a Ray of our own on 127.0.0.1
    local_ray(tmp, num_cpus=2)
    yield
    ray.shutdown()
    if before is None:
        os.environ.pop("RAY_AUTH_MODE", None)
    else:
        os.environ["RAY_AUTH_MODE"] = before
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.integration
def test_ray_simulation_runs_the_coordinator(tmp_path: Path, local_ray: None) -> None:
    from fedplat.sim.ray_backend import simulate_ray

    cfg = parse_config(run_config(tmp_path, rounds=2, clients=4, min_available=12))
    seen: list[int] = []
    run = simulate_ray(
        cfg,
        ReferencePopulation.of(cfg, 12),
        12,
        on_round=lambda o: seen.append(o.number),
    )
    assert [r.completed for r in run.result.rounds] == [True, True]
    assert seen == [1, 2] and run.hosts == 2
    with Store(cfg.store.url) as store:
        assert store.count_clients(run.result.run_id) == 12
        parts = [store.list_participations(run.result.run_id, n) for n in (1, 2)]
    assert [len(p) for p in parts] == [4, 4]
    assert all(p.status == "succeeded" and p.bytes_up > 0 for ps in parts for p in ps)
    assert run.coordinator_peak_rss_mb > 0 and min(run.host_peak_rss_mb) > 0


@pytest.mark.integration
def test_sim_command_on_ray(tmp_path: Path) -> None:
    path = write_config(tmp_path, run_config(tmp_path, rounds=1, clients=3))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "TMPDIR": "/tmp"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedplat.cli",
            "sim",
            "--config",
            str(path),
            "--clients",
            "6",
            "--backend",
            "ray",
            "--hosts",
            "2",
            "--no-progress",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["backend"] == "ray" and out["rounds"] == 1 and out["hosts"] == 2


def test_sim_flags_for_ray_need_the_ray_backend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedplat.cli import main

    path = write_config(tmp_path, run_config(tmp_path))
    assert main(["sim", "--config", str(path), "--address", "auto"]) == 2
    assert "--backend ray" in capsys.readouterr().err

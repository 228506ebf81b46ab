"""``fedplat demo``: a coordinator and client processes on one machine.

Starts ``fedplat coordinator`` and ``--clients`` reference ``fedplat client``
processes on 127.0.0.1, prints each completed round's accuracy from the store, and
writes a JSON summary (``bench/results/demo.json`` by default).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fedplat.store import Store
from fedplat.transport.health import wait_healthy


@dataclass(frozen=True)
class DemoArgs:
    clients: int = 10
    rounds: int = 20
    alpha: float = 0.5
    dataset: str = "fashion_mnist"
    model: str = "mlp"
    seed: int = 0
    workdir: str = "runs/demo"
    output: str = "bench/results/demo.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def demo_config(
    workdir: Path,
    *,
    address: str,
    rounds: int,
    clients: int,
    dataset: str,
    model: str,
    seed: int,
) -> dict[str, Any]:
    return {
        "run": {"name": f"demo-{int(time.time())}", "rounds": rounds, "seed": seed},
        "model": {"name": model},
        "data": {"dataset": dataset},
        "selection": {
            "clients_per_round": clients,
            "min_available": clients,
            "quorum": max(1, clients - 2),
        },
        "deadlines": {"round_seconds": 300},
        "client_training": {"epochs": 2, "batch_size": 32, "lr": 0.05},
        "aggregator": {"name": "fedavg"},
        "server_optimizer": {"name": "fedavg", "lr": 1.0},
        "store": {"url": str(workdir / "fedplat.db")},
        "checkpoints": {"dir": str(workdir / "checkpoints")},
        "server": {"address": address, "insecure": True},
    }


def run_demo(args: DemoArgs) -> int:
    """Start a coordinator and client processes; write the result JSON."""
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    address = f"127.0.0.1:{_free_port()}"
    cfg = demo_config(
        workdir,
        address=address,
        rounds=args.rounds,
        clients=args.clients,
        dataset=args.dataset,
        model=args.model,
        seed=args.seed,
    )
    cfg_path = workdir / "demo.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    exe = [sys.executable, "-m", "fedplat.cli"]
    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    procs: list[subprocess.Popen[bytes]] = []
    with (logs / "coordinator.log").open("wb") as clog:
        coord = subprocess.Popen(
            [*exe, "coordinator", "--config", str(cfg_path)],
            stdout=clog,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        wait_healthy(address, 120)
        print(f"coordinator up at {address}; starting {args.clients} clients")
        for i in range(args.clients):
            with (logs / f"client-{i}.log").open("wb") as f:
                procs.append(
                    subprocess.Popen(
                        [
                            *exe,
                            "client",
                            "--address",
                            address,
                            "--insecure",
                            "--dataset",
                            args.dataset,
                            "--model",
                            args.model,
                            "--partition",
                            f"dirichlet:{args.alpha}",
                            "--num-partitions",
                            str(args.clients),
                            "--partition-id",
                            str(i),
                            "--seed",
                            str(args.seed),
                            "--name",
                            f"demo-client-{i}",
                            "--give-up-after",
                            "60",
                        ],
                        stdout=f,
                        stderr=subprocess.STDOUT,
                        env=env,
                    )
                )
        store = Store(cfg["store"]["url"], migrate=False)
        run = None
        last = 0
        while coord.poll() is None:
            time.sleep(1.0)
            run = run or store.get_run_by_name(cfg["run"]["name"])
            if run is None:
                continue
            for r in store.list_rounds(run.id):
                if r.status == "completed" and r.number > last:
                    last = r.number
                    print(
                        f"round {r.number:3d}/{args.rounds}: accuracy {r.accuracy:.4f} "
                        f"({time.perf_counter() - t0:.0f}s)",
                        flush=True,
                    )
        rc = coord.returncode
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        if coord.poll() is None:
            coord.terminate()
            coord.wait(timeout=30)
    seconds = time.perf_counter() - t0
    run = store.get_run_by_name(cfg["run"]["name"])
    if run is None or rc != 0:
        print(f"demo failed (coordinator exit {rc}); see {logs}", file=sys.stderr)
        return 1
    rounds = [r for r in store.list_rounds(run.id) if r.status == "completed"]
    parts = store.list_participations(run.id)
    result = {
        "dataset": args.dataset,
        "model": args.model,
        "clients": args.clients,
        "partition": f"dirichlet({args.alpha})",
        "rounds": len(rounds),
        "final_accuracy": rounds[-1].accuracy if rounds else None,
        "accuracy_per_round": [r.accuracy for r in rounds],
        "seconds": round(seconds, 1),
        "bytes_up": sum(p.bytes_up for p in parts),
        "bytes_down": sum(p.bytes_down for p in parts),
        "run_id": run.id,
        "store": cfg["store"]["url"],
    }
    store.close()
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"final accuracy {result['final_accuracy']:.4f} after {len(rounds)} rounds "
        f"in {seconds:.0f}s"
    )
    print(f"results: {out}\nstore:   {cfg['store']['url']}\nlogs:    {logs}")
    return 0

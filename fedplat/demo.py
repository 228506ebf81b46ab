"""``fedplat demo``: a coordinator and client processes on one machine.

Makes a CA and a server certificate (``fedplat certs``) and one enrolment token
per client, starts ``fedplat coordinator`` (TLS, token admission) and
``--clients`` reference ``fedplat client`` processes on 127.0.0.1, prints each
completed round's accuracy from the store (and, while nothing completes, what
the coordinator is doing: clients enrolled, the round being trained), and
writes a JSON summary (``runs/demo/demo.json`` by default; bench/demo.py runs
it twice with one seed for bench/results/demo.json).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
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
    output: str | None = None  # default: WORKDIR/demo.json


_EXE = [sys.executable, "-m", "fedplat.cli"]
_ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


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
    tls: dict[str, str],
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
        # The demo runs like a deployment: TLS with a CA of its own, and every
        # client admitted by a single-use enrolment token.
        "server": {"address": address, "tls": tls},
        "admission": {"mode": "tokens"},
    }


def _pki(workdir: Path) -> dict[str, str]:
    """A CA and a server certificate for 127.0.0.1 (made once per workdir)."""
    from fedplat.security.certs import CA_CERT, create_ca, issue

    pki = workdir / "pki"
    if not (pki / CA_CERT).exists():
        create_ca(pki, name="fedplat demo CA")
    if not (pki / "server.pem").exists():
        issue(pki, "server", server=True, sans=("localhost", "127.0.0.1"))
    return {"cert": str(pki / "server.pem"), "key": str(pki / "server.key")}


def _tokens(cfg: dict[str, Any], n: int, logs: Path) -> list[Path]:
    """One enrolment token per client, each in a file only its owner reads."""
    with Store(cfg["store"]["url"]) as store:
        made = store.create_tokens(
            n,
            expires_at=datetime.now(UTC) + timedelta(hours=6),
            run_name=cfg["run"]["name"],
        )
    paths = []
    for i, (_, secret) in enumerate(made):
        p = logs / f"token-{i}"
        p.write_text(secret)
        p.chmod(0o600)
        paths.append(p)
    return paths


def _start_clients(
    args: DemoArgs, address: str, ca: str, tokens: list[Path], logs: Path, workdir: Path
) -> list[subprocess.Popen[bytes]]:
    procs = []
    for i in range(args.clients):
        with (logs / f"client-{i}.log").open("wb") as f:
            procs.append(subprocess.Popen(
                [*_EXE, "client", "--address", address, "--root-cert", ca,
                 "--token-file", str(tokens[i]), "--state-dir",
                 str(workdir / "clients" / f"client-{i}"),
                 "--dataset", args.dataset, "--model", args.model,
                 "--partition", f"dirichlet:{args.alpha}",
                 "--num-partitions", str(args.clients), "--partition-id", str(i),
                 "--seed", str(args.seed), "--name", f"demo-client-{i}",
                 "--give-up-after", "60"],
                stdout=f, stderr=subprocess.STDOUT, env=_ENV,
            ))  # fmt: skip
    return procs


#: Seconds without a completed round after which the demo says what goes on.
QUIET_SECONDS = 10.0


def _follow(
    coord: subprocess.Popen[bytes], store: Store, name: str, rounds: int, t0: float
) -> None:
    """Print each completed round's accuracy until the coordinator exits, and
    every :data:`QUIET_SECONDS` of silence the coordinator's phase (from its
    heartbeat): clients enrolled, or the round in training."""
    run, last, said = None, 0, time.perf_counter()
    while coord.poll() is None:
        time.sleep(1.0)
        run = run or store.get_run_by_name(name)
        if run is None:
            continue
        for r in store.list_rounds(run.id):
            if r.status == "completed" and r.number > last:
                last, said = r.number, time.perf_counter()
                print(
                    f"round {r.number:3d}/{rounds}: accuracy {r.accuracy:.4f} "
                    f"({said - t0:.0f}s)",
                    flush=True,
                )
        if time.perf_counter() - said >= QUIET_SECONDS:
            said = time.perf_counter()
            print(f"  {_activity(store, run.id, last, rounds)} ({said - t0:.0f}s)")


def _activity(store: Store, run_id: str, last: int, rounds: int) -> str:
    """One line: what the coordinator is doing, from its heartbeat."""
    run = store.get_run(run_id)
    phase = run.phase if run is not None else None
    if phase in (None, "starting", "waiting_for_clients"):
        return f"waiting for clients: {store.count_clients(run_id)} enrolled"
    live = run.live_clients if run is not None else None
    doing = "aggregating" if phase == "aggregating" else "training"
    return f"round {last + 1}/{rounds}: {doing} ({live} clients connected)"


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


def run_demo(args: DemoArgs) -> int:
    """Start a coordinator and client processes; write the result JSON."""
    workdir = Path(args.workdir).resolve()
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    address = f"127.0.0.1:{_free_port()}"
    tls = _pki(workdir)
    cfg = demo_config(
        workdir, address=address, rounds=args.rounds, clients=args.clients,
        dataset=args.dataset, model=args.model, seed=args.seed, tls=tls,
    )  # fmt: skip
    cfg_path = workdir / "demo.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    tokens = _tokens(cfg, args.clients, logs)
    ca = str(workdir / "pki" / "ca.pem")
    t0 = time.perf_counter()
    with (logs / "coordinator.log").open("wb") as clog:
        coord = subprocess.Popen(
            [*_EXE, "coordinator", "--config", str(cfg_path)],
            stdout=clog, stderr=subprocess.STDOUT, env=_ENV,
        )  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []
    store = Store(cfg["store"]["url"], migrate=False)
    try:
        wait_healthy(address, 120, credentials=grpc.ssl_channel_credentials(
            Path(ca).read_bytes()))  # fmt: skip
        print(f"coordinator up at {address} (TLS); starting {args.clients} clients")
        procs = _start_clients(args, address, ca, tokens, logs, workdir)
        _follow(coord, store, cfg["run"]["name"], args.rounds, t0)
        rc = coord.returncode
    finally:
        _stop([*procs, coord])
    return _summary(args, store, cfg, rc, time.perf_counter() - t0, logs)


def _summary(
    args: DemoArgs,
    store: Store,
    cfg: dict[str, Any],
    rc: int | None,
    seconds: float,
    logs: Path,
) -> int:
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
        "seed": args.seed,
        "run_id": run.id,
    }
    store.close()
    out = Path(args.output) if args.output else Path(args.workdir) / "demo.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"final accuracy {result['final_accuracy']:.4f} after {len(rounds)} rounds "
        f"in {seconds:.0f}s"
    )
    print(f"results: {out}\nstore:   {cfg['store']['url']}\nlogs:    {logs}")
    return 0

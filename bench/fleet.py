"""What the coordinator benchmarks share (vs_flower, round_overhead, load).

* :func:`flat_model`: a model of exactly ``numel`` float32 parameters (a 64->10
  linear head, so the coordinator's evaluation on digits stays negligible, plus
  one padding tensor);
* :func:`run_config` / :class:`CoordinatorProcess`: a run file and the
  coordinator serving it as ``python -m fedplat.cli coordinator`` in a process
  group of its own (so :class:`bench.common.PeakRss` can watch it), on
  127.0.0.1, SQLite store, one checkpoint kept;
* :func:`round_records`: the rounds the coordinator wrote to its store;
* ``python -m bench.fleet clients ...``: SDK clients (:class:`fedplat.client.Client`)
  as threads of one process; client ``i`` does not train, it adds
  ``1e-3 * (i + 1)`` to the model, so every client returns a distinct array.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import nn

from bench.common import PeakRss

REPO = Path(__file__).resolve().parents[1]
MODEL_SPEC = "bench.fleet:flat_model"
MiB = 1024 * 1024
#: The coordinator's ``server`` section in every benchmark run (grpc.aio: a
#: waiting client holds no thread; these bound messages and concurrent decodes).
SERVER: dict[str, Any] = {
    "insecure": True,
    # Fewer, larger messages: a 4 MiB chunk in an 8 MiB message limit.
    "max_message_bytes": 8 * MiB,
    "chunk_bytes": 4 * MiB,
    "max_concurrent_uploads": 16,
}


class FlatModel(nn.Module):
    """A 64->10 linear head plus one padding tensor: ``numel`` float32 values.

    ``forward``: ``float32 [B, 1, 8, 8]`` -> logits ``[B, num_classes]``.
    """

    def __init__(
        self, input_shape: Sequence[int], num_classes: int, numel: int
    ) -> None:
        super().__init__()
        fan_in = int(np.prod(input_shape))
        head = fan_in * num_classes + num_classes
        if numel < head + 1:
            raise ValueError(f"numel must be > {head} (the head alone), got {numel}")
        self.head = nn.Linear(fan_in, num_classes)
        self.pad = nn.Parameter(torch.zeros(numel - head))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x.flatten(1))


def flat_model(input_shape: Sequence[int], num_classes: int, numel: int) -> FlatModel:
    """Model factory for ``model.name = "bench.fleet:flat_model"``."""
    return FlatModel(input_shape, num_classes, numel)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_config(
    workdir: Path,
    *,
    clients: int,
    rounds: int,
    numel: int,
    selected: int | None = None,
    aggregator: dict[str, Any] | None = None,
    round_seconds: float = 600.0,
    **sections: dict[str, Any],
) -> dict[str, Any]:
    """A run of ``rounds`` rounds over ``clients`` enrolled clients, ``selected``
    of them (default all) per round, every one needed (quorum); only the final
    round evaluates (on 32 digits examples). ``sections`` update whole sections."""
    k = selected or clients
    cfg: dict[str, Any] = {
        "run": {"name": "bench", "rounds": rounds, "seed": 0},
        "model": {"name": MODEL_SPEC, "params": {"numel": numel}},
        "data": {"dataset": "digits", "eval_every": 1_000_000},
        "evaluation": {"max_examples": 32},
        "selection": {"clients_per_round": k, "min_available": clients, "quorum": k},
        "deadlines": {"round_seconds": round_seconds},
        "aggregator": aggregator or {"name": "fedavg"},
        "store": {"url": str(workdir / "fedplat.db")},
        "checkpoints": {"dir": str(workdir / "ckpt"), "keep_last": 1},
        "server": {
            "address": f"127.0.0.1:{free_port()}",
            **SERVER,
            # Every device of a benchmark fleet calls from 127.0.0.1: the
            # per-address cap on enrolments in flight is the fleet's size, as
            # for a fleet behind one NAT (docs/security.md).
            "max_unauthenticated_per_address": max(16, clients),
            "max_unauthenticated": max(256, clients),
        },
    }
    for name, values in sections.items():
        cfg[name] = {**cfg.get(name, {}), **values}
    return cfg


def bench_env() -> dict[str, str]:
    """Child processes: repository on the path, one BLAS thread each."""
    path = os.environ.get("PYTHONPATH", "")
    return {
        **os.environ,
        "PYTHONPATH": f"{REPO}{os.pathsep}{path}" if path else str(REPO),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def spawn(
    args: list[str], log: Path, *, group: bool = False
) -> subprocess.Popen[bytes]:
    """``python *args`` from the repository root, output to ``log``; ``group``:
    in a new session (its own process group, for :class:`PeakRss`)."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=bench_env(),
            start_new_session=group,
        )


def stop(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout``; waits for the exit."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def tail(path: Path, n: int = 3000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else ""


def wait_listening(
    port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 120.0
) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited ({proc.returncode}):\n{tail(log)}")
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port} after {timeout}s")


class CoordinatorProcess:
    """``fedplat coordinator`` for ``cfg`` in a process group of its own."""

    def __init__(self, cfg: dict[str, Any], workdir: Path) -> None:
        self.cfg = cfg
        self.workdir = workdir
        self.log = workdir / "coordinator.log"
        self.address = str(cfg["server"]["address"])
        self.port = int(self.address.rsplit(":", 1)[1])
        path = workdir / "run.yaml"
        path.write_text(yaml.safe_dump(cfg))
        self.proc = spawn(
            ["-m", "fedplat.cli", "coordinator", "--config", str(path)],
            self.log,
            group=True,
        )
        wait_listening(self.port, self.proc, self.log)


def serve_to_end(
    server: subprocess.Popen[bytes],
    clients: list[subprocess.Popen[bytes]],
    peak: PeakRss,
    timeout: float,
    log: Path,
) -> float:
    """Wait for ``server`` to exit (the run is over), then for its ``clients``;
    stop whatever is left either way. Returns the server's peak RSS (MB, from
    ``peak``); raises with the end of ``log`` if the server failed, or at once
    if a client process fails while the server runs (it would wait for it)."""
    try:
        end = time.monotonic() + timeout
        while (rc := server.poll()) is None:
            failed = [p.returncode for p in clients if p.poll() not in (None, 0)]
            if failed:
                raise RuntimeError(
                    f"a client process exited {failed[0]} while the server ran:\n"
                    f"{tail(log)}"
                )
            if time.monotonic() > end:
                raise RuntimeError(
                    f"server still running after {timeout:.0f}s:\n{tail(log)}"
                )
            time.sleep(0.2)
        mb = peak.stop()
        if rc != 0:
            raise RuntimeError(f"server exited {rc}:\n{tail(log)}")
        for p in clients:
            p.wait(120)
    finally:
        peak.stop()
        for p in [server, *clients]:
            stop(p)
    return mb


@dataclass(frozen=True)
class RoundRow:
    number: int
    status: str
    started: float  # unix seconds
    finished: float | None
    num_selected: int
    num_succeeded: int
    bytes_up: int
    bytes_down: int


def round_records(store_url: str, run_name: str = "bench") -> list[RoundRow]:
    """The run's rounds as the coordinator recorded them."""
    from fedplat.store import Store

    with Store(store_url, migrate=False) as store:
        run = store.get_run_by_name(run_name)
        if run is None:
            return []
        return [
            RoundRow(
                r.number,
                r.status,
                r.started_at.replace(tzinfo=UTC).timestamp(),
                None
                if r.finished_at is None
                else r.finished_at.replace(tzinfo=UTC).timestamp(),
                r.num_selected,
                r.num_succeeded,
                r.bytes_up,
                r.bytes_down,
            )
            for r in store.list_rounds(run.id)
        ]


def intervals(completed_at: Sequence[float]) -> list[float]:
    """Round durations as the time between consecutive round completions; the
    first round (no predecessor) is dropped, so ``k`` completions give
    ``k - 1`` durations."""
    return [b - a for a, b in itertools.pairwise(completed_at)]


# ------------------------------------------------------------- SDK clients
def _rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024 / 1e6
    return 0.0


def sdk_clients(
    address: str, tokens: list[str], numel: int, first: int, report: Path | None = None
) -> int:
    """Run one :class:`fedplat.client.Client` per token as threads; returns the
    number that did not finish the run. ``report`` receives the process's
    resident set before the clients were built and its peak (MB)."""
    from fedplat.client import Client, FitResult

    torch.set_num_threads(1)
    baseline = _rss_mb("VmRSS")

    def make(i: int) -> Client:
        model = flat_model((1, 8, 8), 10, numel)
        shift = 1e-3 * (i + 1)

        def train(m: nn.Module, config: Any) -> FitResult:
            with torch.no_grad():
                m.pad.add_(shift)  # type: ignore[operator]
            return FitResult(10)

        return Client(
            address,
            model,
            train,
            num_examples=10,
            name=f"c{i}",
            insecure=True,
            enrolment_token=tokens[i - first],
            poll_seconds=10,
            give_up_after=120,
        )

    clients = [make(first + j) for j in range(len(tokens))]
    threads = [threading.Thread(target=c._run_safely) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if report is not None:
        peak = _rss_mb("VmHWM")
        report.write_text(
            json.dumps(
                {
                    "clients": len(clients),
                    "baseline_rss_mb": baseline,
                    "peak_rss_mb": peak,
                }
            )
        )
    return sum(not c.finished for c in clients)


def start_sdk_clients(
    address: str, tokens: list[str], numel: int, procs: int, workdir: Path
) -> list[subprocess.Popen[bytes]]:
    """``len(tokens)`` SDK clients spread evenly over ``procs`` processes; each
    writes ``workdir/clients-P.json`` (see :func:`sdk_clients`)."""
    out = []
    per = -(-len(tokens) // procs)
    for p, first in enumerate(range(0, len(tokens), per)):
        path = workdir / f"tokens-{p}"
        path.write_text("\n".join(tokens[first : first + per]))
        args = ["-m", "bench.fleet", "clients", "--address", address]
        args += ["--tokens", str(path), "--numel", str(numel), "--first", str(first)]
        args += ["--report", str(workdir / f"clients-{p}.json")]
        out.append(spawn(args, workdir / f"clients-{p}.log"))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="SDK client processes for benchmarks")
    sub = ap.add_subparsers(dest="role", required=True)
    c = sub.add_parser("clients")
    c.add_argument("--address", required=True)
    c.add_argument("--tokens", required=True, help="one enrolment token a line")
    c.add_argument("--numel", type=int, required=True)
    c.add_argument("--first", type=int, default=0)
    c.add_argument("--report", type=Path)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    tokens = Path(args.tokens).read_text().split()
    unfinished = sdk_clients(args.address, tokens, args.numel, args.first, args.report)
    print(f"clients: {len(tokens) - unfinished} finished, {unfinished} did not")
    return 1 if unfinished else 0


if __name__ == "__main__":
    sys.exit(main())

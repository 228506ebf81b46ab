"""Shared fixtures: configs, free ports, real coordinator/client processes."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_config(
    tmp: Path,
    *,
    name: str = "test",
    rounds: int = 3,
    clients: int = 4,
    quorum: int | None = None,
    min_available: int | None = None,
    address: str | None = None,
    **sections: Any,
) -> dict[str, Any]:
    """A small digits run writing into ``tmp``; ``sections`` override whole sections."""
    cfg: dict[str, Any] = {
        "run": {"name": name, "rounds": rounds, "seed": 0},
        "model": {"name": "mlp", "params": {"hidden": [64]}},
        "data": {"dataset": "digits"},
        "selection": {
            "clients_per_round": clients,
            "min_available": min_available or clients,
            "quorum": quorum or clients,
        },
        "deadlines": {"round_seconds": 60},
        "client_training": {"epochs": 1, "batch_size": 16, "lr": 0.1},
        "store": {"url": str(tmp / "fedplat.db")},
        "checkpoints": {"dir": str(tmp / "ckpt")},
        "server": {"address": address or f"127.0.0.1:{free_port()}", "insecure": True},
    }
    for k, v in sections.items():
        cfg[k] = {**cfg.get(k, {}), **v}
    return cfg


def digits_client(
    i: int,
    factory: Any,
    num_partitions: int,
    *,
    label_flip: bool = False,
    **client_kw: Any,
) -> Any:
    """In-process client ``c{i}`` of a digits run: partition ``i`` of
    ``num_partitions``, the 64-unit MLP of ``run_config``, trained by the reference
    train function and connected through ``factory``. ``client_kw`` goes to
    :class:`fedplat.client.Client` (``state_dir``, ``middleware``, ...)."""
    from fedplat.client import Client
    from fedplat.client.reference import ReferenceSpec, reference_parts

    p = reference_parts(
        ReferenceSpec(
            dataset="digits",
            model="mlp",
            model_params={"hidden": [64]},
            num_partitions=num_partitions,
            partition_id=i,
            label_flip=label_flip,
        )
    )
    return Client(
        None,
        p.model,
        p.train,
        num_examples=p.num_examples,
        connection_factory=factory,
        name=f"c{i}",
        **client_kw,
    )


def write_config(tmp: Path, cfg: dict[str, Any]) -> Path:
    p = tmp / "run.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


class Procs:
    """Starts processes with logs in a folder; kills them all at teardown."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = (self.logdir / f"{name}.log").open("ab")
        p = subprocess.Popen(
            [sys.executable, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_env(),
            cwd=REPO,
        )
        log.close()
        self.procs.append(p)
        return p

    def coordinator(
        self, cfg_path: Path, name: str = "coordinator"
    ) -> subprocess.Popen[bytes]:
        return self.start(
            name, ["-m", "fedplat.cli", "coordinator", "--config", str(cfg_path)]
        )

    def client(
        self, address: str, i: int, n: int, *extra: str
    ) -> subprocess.Popen[bytes]:
        return self.start(
            f"client-{i}",
            [
                "-m",
                "fedplat.cli",
                "client",
                "--address",
                address,
                "--insecure",
                "--dataset",
                "digits",
                "--model",
                "mlp",
                "--model-params",
                '{"hidden": [64]}',
                "--num-partitions",
                str(n),
                "--partition-id",
                str(i),
                "--name",
                f"client-{i}",
                "--give-up-after",
                "60",
                *extra,
            ],
        )

    def log(self, name: str) -> str:
        p = self.logdir / f"{name}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def cleanup(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    logdir = tmp_path / "logs"
    logdir.mkdir()
    pr = Procs(logdir)
    yield pr
    pr.cleanup()


def wait_for(
    pred: Any,
    timeout: float,
    what: str,
    interval: float = 0.2,
    procs: Procs | None = None,
) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    logs = ""
    if procs is not None:
        logs = "\n".join(
            f"--- {f.name}\n{f.read_text(errors='replace')[-3000:]}"
            for f in sorted(procs.logdir.glob("*.log"))
        )
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs}")

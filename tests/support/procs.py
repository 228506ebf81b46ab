"""Real processes for integration tests: start, log, kill at teardown; polling."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.configs import REPO


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

    def start(
        self, name: str, args: list[str], *, nofile: int | None = None
    ) -> subprocess.Popen[bytes]:
        """``nofile``: the process's open-file limit (soft and hard), as
        ``ulimit -n`` would set it (util-linux's prlimit; no pre-exec hook in a
        process that runs gRPC threads)."""
        limit = [] if nofile is None else ["prlimit", f"--nofile={nofile}:{nofile}"]
        log = (self.logdir / f"{name}.log").open("ab")
        p = subprocess.Popen(
            [*limit, sys.executable, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_env(),
            cwd=REPO,
        )
        log.close()
        self.procs.append(p)
        return p

    def coordinator(
        self, cfg_path: Path, name: str = "coordinator", *, nofile: int | None = None
    ) -> subprocess.Popen[bytes]:
        return self.start(
            name,
            ["-m", "fedplat.cli", "coordinator", "--config", str(cfg_path)],
            nofile=nofile,
        )

    def client(
        self, address: str, i: int, n: int, *extra: str, token: str | None = None
    ) -> subprocess.Popen[bytes]:
        """Reference client ``i`` of ``n`` on digits (``token``: its enrolment
        token, handed over in a file as an operator would)."""
        if token is not None:
            path = self.logdir / f"token-{i}"
            path.write_text(token)
            extra = (*extra, "--token-file", str(path))
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

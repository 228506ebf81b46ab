"""Run the app on Flower's simulation or deployment engine on this machine.

Starts a SuperLink (and, for the deployment engine, one SuperNode per
partition) on 127.0.0.1, writes the connection into a private ``FLWR_HOME``,
runs ``flwr run . <connection> --stream`` and stops every process it started::

    python examples/flower/launch.py --engine simulation --supernodes 4 \\
        --run-config "num-server-rounds=3 max-steps=20"

The tests and ``bench/vs_flower_sim.py`` use :class:`FlowerRuntime` the same
way. Flower runs offline here only with runtime dependency installation off
(it would ``uv sync`` the app's dependencies), so fedplat[flower] must be
installed in this environment.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

APP_DIR = Path(__file__).resolve().parent
_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def flower_env(home: Path) -> dict[str, str]:
    """This environment with a private Flower home and no phoning out; Flower
    finds its own helper commands (flower-superexec, ...) on PATH."""
    return {
        **os.environ,
        "PATH": f"{_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "FLWR_HOME": str(home),
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "disabled",
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
    }


class FlowerRuntime:
    """A SuperLink on 127.0.0.1 (plus SuperNodes for ``engine="deployment"``)
    and the ``FLWR_HOME`` naming it; a context manager that stops them all.

    Each process gets its own session, so stopping kills what it spawned too
    (SuperExec, the ServerApp and ClientApp processes, Ray).
    """

    def __init__(
        self,
        engine: str,
        supernodes: int,
        workdir: Path,
        *,
        client_cpus: int = 1,
        ray_cpus: int = 2,
    ) -> None:
        if engine not in ("simulation", "deployment"):
            raise ValueError(f"engine must be simulation or deployment: {engine!r}")
        self.engine, self.supernodes, self.workdir = engine, supernodes, workdir
        self.home = workdir / "flwr-home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.env = flower_env(self.home)
        self.port = free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.federation_config = (
            f"num-supernodes={supernodes} client-resources-num-cpus={client_cpus} "
            f"init-args-num-cpus={ray_cpus}"
        )
        self._write_connection()

    @property
    def connection(self) -> str:
        return "local" if self.engine == "simulation" else "deploy"

    def _write_connection(self) -> None:
        lines = [
            "[superlink]",
            f'default = "{self.connection}"',
            "",
            f"[superlink.{self.connection}]",
            f'address = "127.0.0.1:{self.port}"',
            "insecure = true",
        ]
        (self.home / "config.toml").write_text("\n".join(lines) + "\n")

    def _start(self, name: str, args: list[str]) -> None:
        log = (self.workdir / f"{name}.log").open("ab")
        self.procs.append(
            subprocess.Popen(
                [str(_BIN / args[0]), *args[1:]],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.workdir,
                start_new_session=True,
            )
        )
        log.close()

    def start(self) -> FlowerRuntime:
        link = ["flower-superlink", "--insecure"]
        link += ["--disable-runtime-dependency-installation"]
        link += ["--host", "127.0.0.1", "--port", str(self.port)]
        if self.engine == "simulation":
            link.append("--simulation")
        self._start("superlink", link)
        self._wait_listening(self.port, 60)
        if self.engine == "deployment":
            for i in range(self.supernodes):
                node = ["flower-supernode", "--insecure"]
                node += ["--superlink", f"127.0.0.1:{self.port}"]
                node += ["--host", "127.0.0.1", "--port", str(free_port())]
                cfg = f"partition-id={i} num-partitions={self.supernodes}"
                self._start(f"supernode-{i}", [*node, "--node-config", cfg])
        return self

    def _wait_listening(self, port: int, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.procs[0].poll() is not None:
                raise RuntimeError(f"SuperLink exited:\n{self.log('superlink')}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", port), timeout=1),
            ):
                return
            time.sleep(0.2)
        raise RuntimeError(f"SuperLink not listening after {timeout}s")

    def run(
        self, run_config: str = "", app: Path = APP_DIR, timeout: float = 900
    ) -> subprocess.CompletedProcess[str]:
        """``flwr run APP <connection> --stream`` until the run ends."""
        args = [str(_BIN / "flwr"), "run", str(app), self.connection, "--stream"]
        if run_config:
            args += ["--run-config", run_config]
        if self.engine == "simulation":
            args += ["--federation-config", self.federation_config]
        return subprocess.run(
            args,
            env=self.env,
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def log(self, name: str) -> str:
        p = self.workdir / f"{name}.log"
        return p.read_text(errors="replace")[-5000:] if p.exists() else ""

    def stop(self) -> None:
        """SIGTERM every process group, SIGKILL what is left after 10 s."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in self.procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, sig)
            end = time.monotonic() + 10
            for p in self.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=max(0.1, end - time.monotonic()))
            if all(p.poll() is not None for p in self.procs):
                break

    def __enter__(self) -> FlowerRuntime:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--engine", choices=["simulation", "deployment"], default="simulation"
    )
    ap.add_argument("--supernodes", type=int, default=4)
    ap.add_argument("--run-config", default="")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fedplat-flower-") as tmp:
        with FlowerRuntime(args.engine, args.supernodes, Path(tmp)) as rt:
            done = rt.run(args.run_config)
        sys.stdout.write(done.stdout)
        sys.stderr.write(done.stderr)
        sys.exit(done.returncode)


if __name__ == "__main__":
    main()

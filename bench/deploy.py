"""A live deployment on 127.0.0.1 for the trust benchmarks (``bench/fuzz.py``,
``bench/faults.py``, ``bench/attacks_live.py``).

Everything goes through the ``fedplat`` command as an operator would use it:
``fedplat certs init`` makes the CA and the server certificate, ``fedplat
tokens create`` the enrolment tokens, ``fedplat coordinator`` serves the run
(TLS + tokens, the default secure configuration) and ``fedplat client`` runs
each reference client (digits, a small MLP) in a process of its own;
``fedplat store check`` checks the store at the end. Processes log to files in
the deployment's folder and are killed by :meth:`Deployment.close`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from fedplat.store import Store

REPO = Path(__file__).resolve().parents[1]

#: The clients' and the coordinator's model (the run file's ``model`` section).
MODEL: dict[str, Any] = {"name": "mlp", "params": {"hidden": [32]}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    # One thread per process: 9 processes share 2 cores.
    return {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def run_file(
    workdir: Path, address: str, *, rounds: int, clients: int, **sections: Any
) -> dict[str, Any]:
    """A digits run under TLS with token admission (sections override keys)."""
    cfg: dict[str, Any] = {
        "run": {"name": "live", "rounds": rounds, "seed": 0},
        "model": MODEL,
        "data": {"dataset": "digits"},
        "selection": {
            "clients_per_round": clients,
            "min_available": clients,
            "quorum": clients,
        },
        "deadlines": {"round_seconds": 60, "liveness_seconds": 30},
        "client_training": {"epochs": 1, "batch_size": 16, "lr": 0.1},
        "store": {"url": str(workdir / "fedplat.db")},
        "checkpoints": {"dir": str(workdir / "ckpt")},
        "server": {
            "address": address,
            "tls": {
                "cert": str(workdir / "pki" / "server.pem"),
                "key": str(workdir / "pki" / "server.key"),
            },
        },
    }
    for k, v in sections.items():
        cfg[k] = {**cfg.get(k, {}), **v}
    return cfg


class Processes:
    """``fedplat`` processes logging to files in one folder; :meth:`close`
    stops them all (SIGTERM, then SIGKILL)."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(
        self, name: str, args: list[str], prefix: Sequence[str] = ()
    ) -> subprocess.Popen[bytes]:
        """``fedplat ARGS`` in the background, logging to ``NAME.log``;
        ``prefix``: a command that execs it (``prlimit --nofile=1024:1024``),
        so the process keeps its pid (never ``preexec_fn``: it is unsafe in a
        process running gRPC's threads)."""
        with (self.dir / f"{name}.log").open("ab") as log:
            p = subprocess.Popen(
                [*prefix, sys.executable, "-m", "fedplat.cli", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_env(),
                cwd=REPO,
            )
        self.procs[name] = p
        return p

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``fedplat ARGS`` to completion."""
        proc = subprocess.run(
            [sys.executable, "-m", "fedplat.cli", *args],
            cwd=REPO,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"fedplat {' '.join(args)}: {proc.stderr[-2000:]}")
        return proc

    def log(self, name: str) -> str:
        p = self.dir / f"{name}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def log_names(self, prefix: str = "") -> list[str]:
        return sorted(p.stem for p in self.dir.glob(f"{prefix}*.log"))

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs.get(name)
        if p is not None and p.poll() is None:
            p.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(30)

    def close(self) -> None:
        for name in list(self.procs):
            self.kill(name, signal.SIGTERM)
        for name in list(self.procs):
            self.kill(name)


class Deployment(Processes):
    """One run's folder, PKI, run file, coordinator and clients (see the module
    docstring)."""

    def __init__(self, workdir: Path, cfg: dict[str, Any]) -> None:
        super().__init__(workdir)
        self.cfg = cfg
        self.address = cfg["server"]["address"]
        self.db = cfg["store"]["url"]
        self.config = self.dir / "run.yaml"
        self.config.write_text(yaml.safe_dump(cfg))
        self.ca = self.dir / "pki" / "ca.pem"
        if not self.ca.exists():
            self.cli("certs", "init", "--dir", str(self.dir / "pki"))

    def tokens(self, count: int, max_examples: int | None = None) -> list[str]:
        """``count`` enrolment tokens for the run (``max_examples``: the
        aggregation weight cap the operator registers with each)."""
        cap = [] if max_examples is None else ["--max-examples", str(max_examples)]
        out = self.cli(
            "tokens", "create", "--db", self.db, "--count", str(count),
            "--expires", "24h", "--run", self.cfg["run"]["name"], *cap,
        )  # fmt: skip
        return out.stdout.split()

    def store_check(self) -> tuple[bool, str]:
        """``fedplat store check``: (passed, its output)."""
        p = self.cli("store", "check", "--db", self.db, check=False)
        return p.returncode == 0, (p.stdout + p.stderr).strip()

    def store(self) -> Store:
        return Store(self.db, migrate=False)

    def coordinator(
        self, name: str = "coordinator", prefix: Sequence[str] = ()
    ) -> subprocess.Popen[bytes]:
        return self.start(name, ["coordinator", "--config", str(self.config)], prefix)

    def client(
        self, i: int, n: int, token: str | None, *extra: str
    ) -> subprocess.Popen[bytes]:
        """Reference client ``i`` of ``n`` (its own state folder, so a restart
        of the coordinator finds it again under the same identity)."""
        args = [
            "client", "--address", self.address, "--root-cert", str(self.ca),
            "--dataset", "digits", "--model", MODEL["name"],
            "--model-params", json.dumps(MODEL["params"]),
            "--num-partitions", str(n), "--partition-id", str(i),
            "--name", f"client-{i}", "--state-dir", str(self.dir / f"state-{i}"),
            "--give-up-after", "300", *extra,
        ]  # fmt: skip
        if token is not None:
            path = self.dir / f"token-{i}"
            path.write_text(token)
            args += ["--token-file", str(path)]
        return self.start(f"client-{i}", args)

    def channel_credentials(self) -> Any:
        import grpc

        return grpc.ssl_channel_credentials(self.ca.read_bytes())

    def wait_serving(self, timeout: float = 900) -> None:
        """Until the coordinator answers health checks over TLS."""
        from fedplat.transport.health import wait_healthy

        wait_healthy(self.address, timeout, credentials=self.channel_credentials())


def snapshot(dep: Deployment) -> dict[int, str]:
    """Every completed round's records as canonical JSON (round -> text): the
    round row (status, counters, bytes, accuracy, loss, checkpoint hash, model
    version) and its participations (client, status, bytes, examples, verdict)."""
    out = {}
    with dep.store() as store:
        run = store.get_run_by_name(dep.cfg["run"]["name"])
        if run is None:
            return {}
        for r in store.list_rounds(run.id):
            if r.status != "completed":
                continue
            parts = [
                {
                    "client": p.client_id,
                    "status": p.status,
                    "bytes_up": p.bytes_up,
                    "bytes_down": p.bytes_down,
                    "examples": p.num_examples,
                    "verdict": repr(p.verdict),
                }
                for p in store.list_participations(run.id, r.number)
            ]
            rec = {
                "status": r.status,
                "selected": r.num_selected,
                "succeeded": r.num_succeeded,
                "failed": r.num_failed,
                "aggregated": r.num_aggregated,
                "bytes": [r.bytes_up, r.bytes_down],
                "accuracy": r.accuracy,
                "loss": r.loss,
                "checkpoint": r.checkpoint_sha256,
                "model_version": r.model_version,
                "participations": sorted(parts, key=lambda p: str(p["client"])),
            }
            out[r.number] = json.dumps(rec, sort_keys=True, default=str)
    return out


def peer_status(files: Any, address: str, node_id: str) -> Any:
    """A gossip peer's ``GetStatus`` as the cluster's observer (``files``: its
    :class:`~fedplat.gossip.pki.ClusterFiles`); ``None`` while it does not
    serve."""
    from fedplat.gossip.client import PeerClient
    from fedplat.gossip.pki import OBSERVER
    from fedplat.gossip.signing import Signer

    c = PeerClient(
        address,
        signer=Signer(OBSERVER, files.identity(OBSERVER)),
        membership=files.load_membership(),
        server_id=node_id,
        tls=files.observer_tls(),
        timeout=5,
    )
    try:
        return c.status()
    except Exception:  # not serving (yet, or any more)
        return None
    finally:
        c.close()


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident set so far (``VmHWM``), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def open_fds(pid: int) -> int:
    """How many file descriptors the process has open now."""
    return len(os.listdir(f"/proc/{pid}/fd"))


class ProcessWatch:
    """Samples a process until it exits: its peak RSS (the kernel's ``VmHWM``
    is monotone: the last reading is the peak) and its most open file
    descriptors (``/proc/PID/fd``, every 0.1 s: a peak between two samples
    is missed)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = float("nan")
        self.peak_fds = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                mb = peak_rss_mb(self.pid)
                fds = open_fds(self.pid)
            except (OSError, ValueError):
                return
            if mb == mb:  # a zombie has no VmHWM any more (nan)
                self.peak = mb
            self.peak_fds = max(self.peak_fds, fds)
            time.sleep(0.1)


def wait_until(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.25)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def store_mb(db: str) -> float:
    """Bytes of a SQLite store with its WAL, or of a PostgreSQL store's database
    (``pg_database_size``), in MiB."""
    if db.startswith("postgresql"):
        import sqlalchemy as sa

        engine = sa.create_engine(db)
        try:
            with engine.connect() as conn:
                size = conn.execute(
                    sa.text("SELECT pg_database_size(current_database())")
                ).scalar_one()
        finally:
            engine.dispose()
        return int(size) / (1024 * 1024)
    paths = [Path(db), Path(db + "-wal"), Path(db + "-shm")]
    return sum(p.stat().st_size for p in paths if p.exists()) / (1024 * 1024)


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL binaries to start a throwaway cluster with (the reason)."""


@contextlib.contextmanager
def throwaway_postgres() -> Iterator[str]:
    """A PostgreSQL cluster for one benchmark row (``scripts/pg_throwaway.sh``,
    on a free port, in a folder of its own under the system's temporary
    directory, which the cluster's owner can enter): its URL, then it is
    stopped and its files deleted. :class:`PostgresUnavailable` when it cannot
    start."""
    import shutil
    import tempfile

    script = REPO / "scripts" / "pg_throwaway.sh"
    pgbin = os.environ.get("PGBIN") or "/usr/lib/postgresql/15/bin"
    if not Path(pgbin, "initdb").exists():
        raise PostgresUnavailable(f"no PostgreSQL binaries ({pgbin}/initdb)")
    pgdir = Path(tempfile.mkdtemp(prefix="fedplat-bench-pg-"))
    p = subprocess.run(
        ["bash", str(script), "start", str(pgdir), str(free_port())],
        capture_output=True,
        text=True,
        timeout=180,
    )
    url = next(
        (
            line.split("=", 1)[1]
            for line in p.stdout.splitlines()
            if line.startswith("export FEDPLAT_TEST_PG_URL=")
        ),
        None,
    )
    try:
        if p.returncode != 0 or url is None:
            raise PostgresUnavailable(
                f"pg_throwaway.sh start failed: {p.stderr.strip()[-500:]}"
            )
        yield url
    finally:
        subprocess.run(
            ["bash", str(script), "stop", str(pgdir)],
            capture_output=True,
            timeout=180,
        )
        shutil.rmtree(pgdir, ignore_errors=True)


def postgres_database(url: str, name: str) -> str:
    """A fresh database ``name`` in the cluster of ``url`` (a store per run):
    its URL."""
    import sqlalchemy as sa

    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    finally:
        engine.dispose()
    return url.rsplit("/", 1)[0] + "/" + name


__all__ = [
    "MODEL",
    "Deployment",
    "PostgresUnavailable",
    "ProcessWatch",
    "Processes",
    "free_port",
    "open_fds",
    "peak_rss_mb",
    "peer_status",
    "postgres_database",
    "run_file",
    "snapshot",
    "store_mb",
    "throwaway_postgres",
    "wait_until",
]

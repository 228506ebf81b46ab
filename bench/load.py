"""A fleet of light clients against one coordinator (issue 15).

1,000 clients stay connected to one ``fedplat coordinator`` process on this
2-core machine while it runs 10 rounds of 200 selected clients over a
100k-parameter model (FedAvg). The clients are written against the wire
protocol with ``grpc.aio`` (not the SDK), many per process, each with its
own channel (its own TCP connection), identity key and single-use enrolment
token: enrol (challenge, Ed25519 proof), long-poll ``GetTask`` (10 s), and when
selected download the model, then upload a dense update (``1e-3 * (i + 1)``
everywhere, 400 kB) whose header is signed over the task's nonce, as
:mod:`fedplat.testing.protocol` does.

Measured:

* ``connected``: clients that enrolled and were still polling when the run
  finished (every one holds a connection for the whole run;
  ``max_established_connections`` counts the coordinator's established TCP
  connections, sampled every 0.5 s from ``/proc/net/tcp``);
* ``task_latency_*``: from the round's publication to the selected client
  receiving its task: the coordinator takes the round's opening time, and
  the task's deadline is that time plus ``deadlines.round_seconds``, so the
  client computes ``received - (deadline - round_seconds)`` on the same clock
  (the round's store write and model serialization fall inside the latency);
* ``tasks_woken_mid_poll``: tasks that reached a long poll which was already
  waiting when the round opened (the coordinator woke it);
* ``updates_per_s``: accepted updates over the sum of the rounds' durations
  (store ``started_at`` to ``finished_at``);
* ``failures``: client RPCs that failed, and selected clients that did not
  succeed in the store;
* ``coordinator_peak_rss_mb``: the coordinator process's VmHWM;
* ``coordinator_peak_threads`` / ``coordinator_threads_at_max_connections``:
  its thread count (``/proc/PID/status``), sampled with the connections: with
  the grpc.aio server a waiting client holds a connection, not a thread.

Writes ``bench/results/load.json``; ``--tiny`` runs 40 clients for the tests.

Usage::

    nice -n 10 python -m bench.load
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # allow ``python bench/load.py``
    sys.path.insert(0, str(REPO))

from bench import fleet  # noqa: E402
from bench.common import (  # noqa: E402
    PeakRss,
    check_out,
    environment,
    loadavg,
    shared_machine,
    tiny_parser,
    write_results,
)
from fedplat.testing.tokens import issue_tokens  # noqa: E402

DEFAULT_OUT = REPO / "bench" / "results" / "load.json"
ROUND_SECONDS = 120.0
LONG_POLL = 10.0
P99_GOAL_S = 1.0
RSS_GOAL_MB = 1000.0


@dataclass(frozen=True)
class Setup:
    clients: int
    per_round: int
    rounds: int
    params: int
    client_procs: int


FULL = Setup(clients=1000, per_round=200, rounds=10, params=100_000, client_procs=4)
TINY = Setup(clients=40, per_round=10, rounds=3, params=10_000, client_procs=2)


# ------------------------------------------------------------------ clients
class Fleet:
    """What one client process saw (written as JSON at the end)."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.enrolled = 0
        self.finished = 0
        self.accepted = 0
        self.woken = 0


async def one_client(
    i: int,
    token: str,
    address: str,
    numel: int,
    layout: Any,
    out: Fleet,
    gate: asyncio.Semaphore,
) -> None:
    import grpc

    from fedplat.proto import fedplat_pb2 as pb
    from fedplat.proto import fedplat_pb2_grpc as pb_grpc
    from fedplat.proto import serde
    from fedplat.protocol.messages import PAYLOAD_V1
    from fedplat.security.identity import ENROL, UPDATE, Identity, statement
    from fedplat.testing.protocol import RawClient, dense_payload_bytes
    from fedplat.transport.grpc import CLIENT_ID_KEY, TOKEN_KEY

    ident = Identity.generate()
    key = ident.public_key
    # A subchannel pool of its own: a connection of its own, as on a device.
    # 16 MiB messages, as the SDK accepts (the coordinator's chunks can be 4 MiB
    # plus framing, over gRPC's 4 MiB default).
    opts = [
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    ]
    async with grpc.aio.insecure_channel(address, options=opts) as channel:
        stub = pb_grpc.CoordinatorStub(channel)
        ch = (await stub.Challenge(pb.ChallengeRequest(), timeout=120)).challenge
        req = pb.EnrollRequest(
            name=f"light-{i}",
            num_examples=10,
            layout=serde.layout_to_proto(layout),
            public_key=key,
            challenge=ch,
            signature=ident.sign(ENROL, ch, "", key),
            enrolment_token=token,
        )
        e = await stub.Enroll(req, timeout=120)
        md = ((CLIENT_ID_KEY, e.client_id), (TOKEN_KEY, e.token))
        out.enrolled += 1
        while True:
            polled = time.time()
            t = await stub.GetTask(
                pb.GetTaskRequest(wait_seconds=LONG_POLL),
                metadata=md,
                timeout=LONG_POLL + 60,
            )
            got = time.time()
            if t.kind == pb.Task.FINISHED:
                out.finished += 1
                return
            if t.kind != pb.Task.TRAIN:
                continue
            opened = t.deadline_unix - ROUND_SECONDS
            out.latencies.append(got - opened)
            # A poll already waiting when the round opened: the coordinator woke
            # it (a server answering only at the start of a poll never does).
            out.woken += polled < opened
            size = 0
            async for part in stub.DownloadModel(
                pb.DownloadRequest(task_id=t.task_id), metadata=md, timeout=300
            ):
                size += len(part.data)
            if size != 4 * numel:
                raise RuntimeError(f"downloaded {size} bytes, expected {4 * numel}")
            # Built per upload, under the process's gate: a client holds its
            # update (and its chunks) only while uploading it.
            async with gate:
                payload = dense_payload_bytes(
                    np.full(numel, 1e-3 * (i + 1), np.float32)
                )
                sha = hashlib.sha256(payload).hexdigest()
                h = pb.UpdateHeader(
                    task_id=t.task_id,
                    round=t.round,
                    num_examples=10,
                    layout=serde.layout_to_proto(layout),
                    encoding=PAYLOAD_V1,
                    total_bytes=len(payload),
                    sha256=sha,
                )
                h.signature = ident.key.sign(
                    statement(UPDATE, e.run_id, t.round, t.task_id, t.nonce, sha, 10,
                              h.encoding)
                )  # fmt: skip
                body = RawClient.body(payload, 256 * 1024)
                chunks = [pb.UpdateChunk(header=h), *body]
                ack = await stub.UploadUpdate(iter(chunks), metadata=md, timeout=300)
                if not ack.accepted:
                    raise RuntimeError(f"update not accepted: {ack.message}")
            out.accepted += 1


async def run_clients(
    address: str, tokens: list[str], first: int, numel: int, uploads: int = 0
) -> Fleet:
    """The clients of one process; ``uploads`` > 0 caps the updates it holds
    and sends at once (large models), 0 lets every client upload at once."""
    from bench.fleet import flat_model
    from fedplat.vectors import layout_of

    layout = layout_of(flat_model((1, 8, 8), 10, numel))
    out = Fleet()
    gate = asyncio.Semaphore(uploads or len(tokens) or 1)

    async def guarded(j: int, token: str) -> None:
        try:
            await one_client(first + j, token, address, numel, layout, out, gate)
        except Exception as exc:  # every failure is counted, none stops the others
            out.failures.append(f"client {first + j}: {type(exc).__name__}: {exc}")

    await asyncio.gather(*(guarded(j, t) for j, t in enumerate(tokens)))
    return out


# ------------------------------------------------------------------ driver
def _established(port: int) -> int:
    """Established TCP connections whose local port is ``port``."""
    n = 0
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(path).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "01" and int(f[1].rsplit(":", 1)[1], 16) == port:
                n += 1
    return n


def _threads(pid: int) -> int:
    """The number of threads of process ``pid`` (0 once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next(
        (int(x.split()[1]) for x in text.splitlines() if x.startswith("Threads:")), 0
    )


class Watcher(threading.Thread):
    """Samples, every 0.5 s, the coordinator's established connections and its
    thread count (a waiting client must cost a connection, not a thread)."""

    def __init__(self, port: int, pid: int) -> None:
        super().__init__(daemon=True)
        self.port, self.pid = port, pid
        self.peak_connections = self.peak_threads = 0
        self.threads_at_peak_connections = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            conns, threads = _established(self.port), _threads(self.pid)
            if conns > self.peak_connections:
                self.peak_connections = conns
                self.threads_at_peak_connections = threads
            self.peak_threads = max(self.peak_threads, threads)
            self.halt.wait(0.5)


def percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def start_clients(
    address: str,
    tokens: list[str],
    numel: int,
    procs: int,
    w: Path,
    *,
    uploads: int = 0,
    name: str = "fleet",
) -> list[subprocess.Popen[bytes]]:
    """``len(tokens)`` light clients spread evenly over ``procs`` processes
    (``python -m bench.load clients``); process ``P`` writes what it saw to
    ``w / f"{name}-P.json"``; ``uploads``: see :func:`run_clients`."""
    per = -(-len(tokens) // procs)
    out = []
    for p, first in enumerate(range(0, len(tokens), per)):
        path = w / f"tokens-{p}"
        path.write_text("\n".join(tokens[first : first + per]))
        args = ["-m", "bench.load", "clients", "--address", address]
        args += ["--tokens", str(path), "--first", str(first), "--numel", str(numel)]
        args += ["--out", str(w / f"{name}-{p}.json"), "--uploads", str(uploads)]
        out.append(fleet.spawn(args, w / f"clients-{p}.log"))
    return out


def run(s: Setup, w: Path) -> dict[str, Any]:
    cfg = fleet.run_config(
        w,
        clients=s.clients,
        rounds=s.rounds,
        numel=s.params,
        selected=s.per_round,
        round_seconds=ROUND_SECONDS,
        server={"long_poll_seconds": LONG_POLL, "max_concurrent_uploads": 32},
        # Enrolment is the setup, not the measurement: let 1,000 in at once.
        admission={"enrol_per_second": 1000.0, "enrol_burst": s.clients},
    )
    tokens = issue_tokens(cfg, s.clients)
    coord = fleet.CoordinatorProcess(cfg, w)
    peak = PeakRss(coord.proc.pid).start()
    watch = Watcher(coord.port, coord.proc.pid)
    watch.start()
    procs = start_clients(coord.address, tokens, s.params, s.client_procs, w)
    try:
        rss = fleet.serve_to_end(coord.proc, procs, peak, 1800, coord.log)
    finally:
        watch.halt.set()
    fleets = [
        json.loads((w / f"fleet-{p}.json").read_text()) for p in range(len(procs))
    ]
    rows = fleet.round_records(cfg["store"]["url"])
    return summarize(s, rss, watch, fleets, rows)


def summarize(
    s: Setup,
    rss: float,
    watch: Watcher,
    fleets: list[dict[str, Any]],
    rows: list[fleet.RoundRow],
) -> dict[str, Any]:
    lat = [x for f in fleets for x in f["latencies"]]
    failures = [x for f in fleets for x in f["failures"]]
    completed = [r for r in rows if r.status == "completed"]
    store_failures = sum(r.num_selected - r.num_succeeded for r in rows)
    busy = sum((r.finished or r.started) - r.started for r in completed)
    accepted = sum(r.num_succeeded for r in completed)
    return {
        "connected": min(
            sum(f["enrolled"] for f in fleets), sum(f["finished"] for f in fleets)
        ),
        "clients_per_round": s.per_round,
        "rounds_completed": len(completed),
        "failures": len(failures) + store_failures,
        "task_latency_p50_s": round(percentile(lat, 50), 4),
        "task_latency_p99_s": round(percentile(lat, 99), 4),
        "task_latency_max_s": round(max(lat, default=float("nan")), 4),
        "tasks_received": len(lat),
        "tasks_woken_mid_poll": sum(f.get("woken", 0) for f in fleets),
        "updates_per_s": round(accepted / busy, 1) if busy else 0.0,
        "coordinator_peak_rss_mb": rss,
        "max_established_connections": watch.peak_connections,
        "coordinator_threads_at_max_connections": watch.threads_at_peak_connections,
        "coordinator_peak_threads": watch.peak_threads,
        "round_seconds": [
            round((r.finished or r.started) - r.started, 3) for r in completed
        ],
        "failure_examples": failures[:10],
    }


def goals(r: dict[str, Any], s: Setup) -> dict[str, bool]:
    return {
        "all_connected_met": r["connected"] == s.clients,
        "all_rounds_met": r["rounds_completed"] == s.rounds,
        "no_failures_met": r["failures"] == 0,
        "p99_under_1s_met": r["task_latency_p99_s"] < P99_GOAL_S,
        "coordinator_under_1gb_met": r["coordinator_peak_rss_mb"] < RSS_GOAL_MB,
        # grpc.aio: a waiting client holds a connection, not a thread.
        "fewer_threads_than_clients_met": r["coordinator_peak_threads"] < s.clients,
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = tiny_parser(__doc__, DEFAULT_OUT)
    sub = ap.add_subparsers(dest="role")
    c = sub.add_parser("clients", help="(internal) one process of light clients")
    c.add_argument("--address", required=True)
    c.add_argument("--tokens", type=Path, required=True)
    c.add_argument("--first", type=int, required=True)
    c.add_argument("--numel", type=int, required=True)
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--uploads", type=int, default=0, help="at once (0: no cap)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.role == "clients":
        tokens = args.tokens.read_text().split()
        got = asyncio.run(
            run_clients(args.address, tokens, args.first, args.numel, args.uploads)
        )
        args.out.write_text(json.dumps(vars(got)))
        return 0
    check_out(ap, args.out)
    s = TINY if args.tiny else FULL
    started = time.perf_counter()
    load_start = loadavg()
    with tempfile.TemporaryDirectory(prefix="fedplat-load-") as tmp:
        result = run(s, Path(tmp))
    import grpc

    out = {
        "benchmark": "load",
        "tiny": args.tiny,
        **result,
        "goals": goals(result, s),
        "setup": {
            **asdict(s),
            "client": "grpc.aio wire-protocol clients, one channel (TCP "
            f"connection) each, {s.client_procs} processes; enrolment tokens, "
            "Ed25519 identities, signed dense updates of 4 x params bytes",
            "coordinator": "fedplat coordinator process, plaintext gRPC on "
            f"127.0.0.1, FedAvg, long poll {LONG_POLL:.0f} s, SQLite store, a "
            "checkpoint per round; enrolment rate limit raised to 1000/s",
            "task_latency": "client receive time - (task deadline - "
            "round_seconds), i.e. from the coordinator's round opening",
            **shared_machine(load_start),
        },
        "environment": environment(started, grpcio=grpc.__version__),
    }
    write_results(args.out, out, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""fedplat's coordinator against Flower's transports and the loopback floor (issue 15).

One workload, five systems, run in one invocation, interleaved:

* **fedplat**: ``fedplat coordinator`` (grpc.aio, FedAvg) in its own process and
  SDK clients (:class:`fedplat.client.Client`, :mod:`bench.fleet`);
* **flower_embedded**: Flower's deprecated ``start_server`` / ``start_client``
  (FedAvg, no evaluation) (:mod:`bench.vs_flower_peers`);
* **flower_deployment**: ``flower-superlink`` + one ``flower-supernode`` per
  client + ``flwr run bench/flower_noop deploy`` (Message API FedAvg, no
  evaluation; each SuperNode starts a ClientApp process per message);
* **loopback_floor**: the same bytes (the model down, one model-sized array up,
  per client) through plain TCP sockets between the same processes;
* **grpc_floor**: the same bytes through bare ``grpc.aio`` streams, in
  messages of the coordinator's chunk size both ways and with gRPC's default
  flow control, with nothing else (no authentication, hashing, decoding or
  store): what the transport alone costs, to read the loopback goal by (not
  one of the issue's systems; reported beside the goals, not as one).

Clients do not train: client ``i`` returns the model plus ``1e-3 * (i + 1)``
(fedplat's SDK sends that difference), so every reply is distinct and the same
size. Process layout, the same for every system: the server in one process,
every client in a process of its own with its own connection (gRPC channels
with the same arguments in one process would share one TCP connection); on the
deployment engine a SuperNode process per client, each starting a ClientApp
process per message, as Flower runs it.

**Round time**, the same for every system: the wall time between two
consecutive round completions as the server process sees them (fedplat: the
round's ``finished_at`` in the store, written after aggregation and the
checkpoint; Flower: when its strategy's aggregate call returned; the floor: when
the last client's bytes were in). ``rounds`` rounds give ``rounds - 1``
durations: the first round (connections, warm-up) is discarded. Per repetition
the median of those; the row reports the median over repetitions.

**Server memory**: the sum of the peak resident sets (VmHWM) of the server
process and the processes it started (fedplat: the coordinator; Flower
embedded: the server; Flower deployment: the SuperLink and what it starts,
SuperExec and the ServerApp process), sampled every 0.2 s.

Writes ``bench/results/vs_flower.json``::

    {"rows": [{"params", "clients", "bytes_per_round", "fedplat_round_s",
               "flower_embedded_round_s", "flower_deployment_round_s",
               "loopback_floor_s", "fedplat_peak_rss_mb",
               "flower_embedded_peak_rss_mb", "flower_deployment_peak_rss_mb",
               "goals": {...}, "repetitions": [...]}], "setup": {...}, "goals": {...}}

Usage::

    nice -n 10 python -m bench.vs_flower              # full (~40 min here)
    python -m bench.vs_flower --tiny --out X.json     # the test's tiny mode
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # allow ``python bench/vs_flower.py``
    sys.path.insert(0, str(REPO))

from bench import fleet  # noqa: E402
from bench.common import (  # noqa: E402
    PeakRss,
    check_out,
    environment,
    loadavg,
    median,
    shared_machine,
    tiny_parser,
    write_results,
)
from examples.flower.launch import FlowerRuntime  # noqa: E402
from fedplat.testing.tokens import issue_tokens  # noqa: E402

DEFAULT_OUT = REPO / "bench" / "results" / "vs_flower.json"
APP = REPO / "bench" / "flower_noop"
SYSTEMS = (
    "fedplat",
    "flower_embedded",
    "flower_deployment",
    "loopback_floor",
    "grpc_floor",
)
#: Goals of issue 15, on every row.
DEPLOYMENT_SPEEDUP_GOAL = 10.0
FLOOR_RATIO_GOAL = 3.0


@dataclass(frozen=True)
class Setup:
    cases: tuple[tuple[int, int], ...]  # (params, clients)
    rounds: int
    repetitions: int
    clients_per_process: int = 1
    timeout_s: float = 1200.0


FULL = Setup(
    cases=((1_000_000, 4), (1_000_000, 16), (10_000_000, 4), (10_000_000, 16)),
    rounds=6,
    repetitions=3,
)
TINY = Setup(cases=((100_000, 2),), rounds=3, repetitions=1)


@dataclass
class Measured:
    round_s: list[float]  # rounds 2.. of one repetition
    peak_rss_mb: float
    server_processes: list[str]

    @property
    def median_s(self) -> float:
        return median(self.round_s)


def _split(clients: int, per: int) -> list[tuple[int, int]]:
    """(first, count) of each client process."""
    return [(f, min(per, clients - f)) for f in range(0, clients, per)]


def _server_times(path: Path, rounds: int) -> list[float]:
    done = json.loads(path.read_text())["completed_at"]
    if len(done) != rounds:
        raise RuntimeError(f"{path}: {len(done)} of {rounds} rounds completed")
    return fleet.intervals(done)


def _range_args(first: int, count: int) -> list[str]:
    return ["--first", str(first), "--count", str(count)]


def _peer_run(
    server_role: str,
    client_role: str,
    numel: int,
    clients: int,
    s: Setup,
    w: Path,
    extra: Sequence[str] = (),
) -> Measured:
    """A server and client processes of :mod:`bench.vs_flower_peers`
    (``extra``: arguments for both roles)."""
    port, out = fleet.free_port(), w / "times.json"
    base = ["-m", "bench.vs_flower_peers"]
    size = ["--numel", str(numel), "--rounds", str(s.rounds), *extra]
    server_args = [server_role, "--port", str(port), "--clients", str(clients)]
    server = fleet.spawn(
        [*base, *server_args, *size, "--out", str(out)],
        w / "server.log",
        group=True,
    )
    peak = PeakRss(server.pid).start()
    procs = [
        fleet.spawn(
            [
                *base,
                client_role,
                "--port",
                str(port),
                *_range_args(first, count),
                *size,
            ],
            w / f"clients-{first}.log",
        )
        for first, count in _split(clients, s.clients_per_process)
    ]
    mb = fleet.serve_to_end(server, procs, peak, s.timeout_s, w / "server.log")
    return Measured(_server_times(out, s.rounds), mb, peak.processes())


def run_fedplat(numel: int, clients: int, s: Setup, w: Path) -> Measured:
    cfg = fleet.run_config(w, clients=clients, rounds=s.rounds, numel=numel)
    tokens = issue_tokens(cfg, clients)
    coord = fleet.CoordinatorProcess(cfg, w)
    peak = PeakRss(coord.proc.pid).start()
    procs = fleet.start_sdk_clients(
        coord.address, tokens, numel, -(-clients // s.clients_per_process), w
    )
    mb = fleet.serve_to_end(coord.proc, procs, peak, s.timeout_s, coord.log)
    rows = fleet.round_records(cfg["store"]["url"])
    bad = [
        r.number for r in rows if r.status != "completed" or r.num_succeeded < clients
    ]
    if len(rows) != s.rounds or bad:
        raise RuntimeError(f"fedplat: rounds {bad} incomplete of {len(rows)}")
    done = [r.finished for r in rows if r.finished is not None]
    return Measured(fleet.intervals(done), mb, peak.processes())


def run_flower_embedded(numel: int, clients: int, s: Setup, w: Path) -> Measured:
    return _peer_run("flower-server", "flower-clients", numel, clients, s, w)


def run_loopback(numel: int, clients: int, s: Setup, w: Path) -> Measured:
    return _peer_run("loop-server", "loop-clients", numel, clients, s, w)


def run_grpc_floor(numel: int, clients: int, s: Setup, w: Path) -> Measured:
    chunk = ["--chunk", str(fleet.SERVER["chunk_bytes"])]
    return _peer_run("grpc-server", "grpc-clients", numel, clients, s, w, chunk)


def run_flower_deployment(numel: int, clients: int, s: Setup, w: Path) -> Measured:
    out = w / "times.json"
    config = (
        f"num-server-rounds={s.rounds} numel={numel} num-nodes={clients} "
        f'results-path="{out}"'
    )
    with FlowerRuntime("deployment", clients, w) as rt:
        peak = PeakRss(rt.procs[0].pid).start()  # the SuperLink's session
        try:
            done = rt.run(config, app=APP, timeout=s.timeout_s)
        finally:
            mb = peak.stop()
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(
                f"flwr run failed ({done.returncode}): {done.stderr[-2000:]}\n"
                f"{rt.log('superlink')}"
            )
    return Measured(_server_times(out, s.rounds), mb, peak.processes())


RUNNERS: dict[str, Callable[[int, int, Setup, Path], Measured]] = {
    "fedplat": run_fedplat,
    "flower_embedded": run_flower_embedded,
    "flower_deployment": run_flower_deployment,
    "loopback_floor": run_loopback,
    "grpc_floor": run_grpc_floor,
}


def row_goals(row: dict[str, Any]) -> dict[str, Any]:
    """Issue 15's goals for one row (ratios and whether each is met)."""
    f = row["fedplat_round_s"]
    vs_deploy = row["flower_deployment_round_s"] / f
    vs_embedded = row["flower_embedded_round_s"] / f
    vs_floor = f / row["loopback_floor_s"]
    mem = row["fedplat_peak_rss_mb"] / row["flower_embedded_peak_rss_mb"]
    grpc_floor = row["grpc_floor_s"]
    return {
        "speedup_vs_deployment": round(vs_deploy, 2),
        "speedup_vs_deployment_met": vs_deploy >= DEPLOYMENT_SPEEDUP_GOAL,
        "speedup_vs_embedded": round(vs_embedded, 3),
        "no_slower_than_embedded_met": vs_embedded >= 1.0,
        "floor_ratio": round(vs_floor, 2),
        "within_3x_of_floor_met": vs_floor <= FLOOR_RATIO_GOAL,
        # Not goals: how the loopback ratio splits into transport and fedplat.
        "grpc_floor_ratio_vs_loopback": round(grpc_floor / row["loopback_floor_s"], 2),
        "fedplat_ratio_vs_grpc_floor": round(f / grpc_floor, 2),
        "server_memory_ratio_vs_embedded": round(mem, 3),
        "memory_no_more_than_embedded_met": mem <= 1.0,
    }


def make_row(
    numel: int, clients: int, reps: list[dict[str, Measured]]
) -> dict[str, Any]:
    def med(system: str, what: str) -> float:
        m = [getattr(r[system], what) for r in reps]
        return round(median(m), 4 if what == "median_s" else 1)

    row: dict[str, Any] = {
        "params": numel,
        "clients": clients,
        "bytes_per_round": clients * 2 * 4 * numel,
        "fedplat_round_s": med("fedplat", "median_s"),
        "flower_embedded_round_s": med("flower_embedded", "median_s"),
        "flower_deployment_round_s": med("flower_deployment", "median_s"),
        "loopback_floor_s": med("loopback_floor", "median_s"),
        "grpc_floor_s": med("grpc_floor", "median_s"),
        "fedplat_peak_rss_mb": med("fedplat", "peak_rss_mb"),
        "flower_embedded_peak_rss_mb": med("flower_embedded", "peak_rss_mb"),
        "flower_deployment_peak_rss_mb": med("flower_deployment", "peak_rss_mb"),
    }
    row["goals"] = row_goals(row)
    row["repetitions"] = [
        {
            sys_: {
                "median_round_s": round(m.median_s, 4),
                "round_s": [round(x, 4) for x in m.round_s],
                "peak_rss_mb": m.peak_rss_mb,
                "server_processes": m.server_processes,
            }
            for sys_, m in rep.items()
        }
        for rep in reps
    ]
    return row


def run(
    s: Setup, workdir: Path
) -> Iterator[tuple[int, list[dict[str, Any]], list[dict[str, Any]]]]:
    """Every repetition runs every case through every system, the systems'
    order rotating by repetition and case. After each repetition, yields the
    number of repetitions done, the rows over those, and a log of the runs
    (order, load average), so a run cut short keeps what it measured."""
    per_case: dict[tuple[int, int], list[dict[str, Measured]]] = {
        c: [] for c in s.cases
    }
    runs: list[dict[str, Any]] = []
    for rep in range(s.repetitions):
        for ci, (numel, clients) in enumerate(s.cases):
            k = (rep + ci) % len(SYSTEMS)
            order = SYSTEMS[k:] + SYSTEMS[:k]
            got: dict[str, Measured] = {}
            for system in order:
                w = workdir / f"r{rep}-{numel}-{clients}-{system}"
                w.mkdir(parents=True)
                t0 = time.perf_counter()
                got[system] = RUNNERS[system](numel, clients, s, w)
                runs.append(
                    {
                        "repetition": rep,
                        "params": numel,
                        "clients": clients,
                        "system": system,
                        "median_round_s": round(got[system].median_s, 4),
                        "wall_s": round(time.perf_counter() - t0, 1),
                        "loadavg_after": loadavg(),
                    }
                )
                print(json.dumps(runs[-1]), flush=True)
            per_case[(numel, clients)].append(got)
        rows = [make_row(n, c, per_case[(n, c)]) for n, c in s.cases]
        yield rep + 1, rows, runs


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    names = [k for k in rows[0]["goals"] if k.endswith("_met")]
    return {name: all(r["goals"][name] for r in rows) for name in names}


def deviations(s: Setup, tiny: bool, done: int) -> list[str]:
    """How this run differs from the issue's workload."""
    if tiny:
        return ["tiny mode: one small case, for the tests"]
    out = []
    if s.repetitions != FULL.repetitions:
        out.append(
            f"{s.repetitions} repetitions planned instead of {FULL.repetitions}: "
            "the machine's 2 cores are shared, a full run would take too long"
        )
    if done < s.repetitions:
        out.append(
            f"{done} of {s.repetitions} repetitions completed when these results "
            "were written (the JSON is rewritten after each repetition)"
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = tiny_parser(__doc__, DEFAULT_OUT)
    ap.add_argument(
        "--repetitions",
        type=int,
        help=f"fewer repetitions than the issue's {FULL.repetitions} "
        "(a busy shared machine); recorded as a deviation",
    )
    args = ap.parse_args(argv)
    check_out(ap, args.out)
    s = TINY if args.tiny else FULL
    if args.repetitions:
        s = replace(s, repetitions=args.repetitions)
    started = time.perf_counter()
    load_start = loadavg()
    with tempfile.TemporaryDirectory(prefix="vs-flower-") as tmp:
        for done, rows, runs in run(s, Path(tmp)):
            results = _results(s, args.tiny, done, rows, runs, load_start, started)
            write_results(args.out, results, started)
    return 0


def _results(
    s: Setup,
    tiny: bool,
    done: int,
    rows: list[dict[str, Any]],
    runs: list[dict[str, Any]],
    load_start: list[float],
    started: float,
) -> dict[str, Any]:
    import flwr
    import grpc

    return {
        "benchmark": "vs_flower",
        "tiny": tiny,
        "repetitions_completed": done,
        "rows": rows,
        "goals": summary(rows),
        "setup": {
            **asdict(s),
            "workload": "no training; client i returns the model + 1e-3 * (i + 1) "
            "(fedplat's SDK sends that difference); float32; FedAvg; no evaluation "
            "(fedplat evaluates the final round on 32 digits examples)",
            "process_layout": "server: 1 process; clients: "
            f"{s.clients_per_process} per process, each with its own connection "
            "(fedplat SDK, Flower start_client, loopback socket); Flower "
            "deployment: 1 SuperNode process per client + a ClientApp process "
            "per message",
            "round_time": "wall time between consecutive round completions seen "
            "by the server (fedplat: store finished_at; Flower: strategy aggregate "
            "returned; floor: last bytes in); first round discarded; median over "
            "rounds, then median over repetitions",
            "peak_rss": "sum of VmHWM over the server process and its "
            "descendants, sampled every 0.2 s (fedplat: coordinator; embedded: "
            "server; deployment: SuperLink + SuperExec + ServerApp)",
            "interleaving": f"per repetition, per case, the {len(SYSTEMS)} systems "
            "one after another, the order rotated by repetition + case",
            "bytes_per_round": "clients x 2 x 4 x params (payload, both ways)",
            "fedplat": "the coordinator's grpc.aio server, plaintext on "
            "127.0.0.1, enrolment tokens, signed updates, SQLite store, a "
            "safetensors checkpoint per round",
            "fedplat_server": fleet.SERVER,
            "deviations": deviations(s, tiny, done),
            "runs": runs,
            **shared_machine(load_start),
        },
        "environment": environment(
            started, flwr=flwr.__version__, grpcio=grpc.__version__
        ),
    }


if __name__ == "__main__":
    sys.exit(main())

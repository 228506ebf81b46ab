"""Per-round cost of the coordinator over loopback gRPC, its payload path, and
its memory model (issue 15).

**Rounds.** ``fedplat coordinator`` in a process of its own and SDK clients
(:class:`fedplat.client.Client`, as threads of ``min(clients, 5)`` processes:
threads of one process share its gRPC connection) over plaintext gRPC on
127.0.0.1; clients do not train (client ``i`` adds ``1e-3 * (i + 1)``; see
:mod:`bench.fleet`). Cases: {10, 100} clients x {1M, 10M} float32 parameters x
{FedAvg (a running sum), Krum (a ``[n, d]`` row stack)}, every client selected
every round. A round's time is the wall time between two consecutive round
completions (store ``finished_at``), so the first round is discarded; the
median over the measured rounds of every repetition is reported, with
``effective_gbps = clients x 2 x 4 x params / median_round_s / 1e9``.
Repetitions are interleaved (every case once, then again). A case whose SDK
clients would not fit in this machine's free memory runs light wire-protocol
clients (:func:`bench.load.start_clients`: an update built per upload, at most
:data:`LIGHT_UPLOADS` per process) and is marked ``clients_kind: light``; one
that fits neither way is skipped with what it needed. ``--replace-rows`` re-runs
given cases into an existing result file.

**Payload path.** In this process, on one ``d``-parameter update, timed
round-robin with a memory copy of the same bytes (``numpy.copyto`` into a
preallocated buffer): *encode* is what the SDK does per upload (SHA-256 over
the vector, ``update_messages``: the chunk messages), *decode* what the
coordinator does (``parse_update_chunk`` per message, incremental SHA-256,
``PayloadSink`` into a row, the finiteness-and-norm check); also the download's
serialization (``model_messages``) and reception (``receive_model``).

**Memory model.** The coordinator's peak is its resident set before the first
round (``base``: interpreter, torch, store, gRPC) plus model-sized (``4 d``
bytes) buffers: ``F`` fixed ones (global weights, the serialized download,
aggregate, new weights, the checkpoint's bytes, the running sum) and the
accumulator's rows: ``min(n, max_concurrent_uploads)`` scratch rows for the
running sum (``O(d)`` whatever ``n``), ``n`` rows for the row stack; and each
upload stream's HTTP/2 receive window ``w`` (``server.stream_window_bytes``),
what an upload waiting for a decoding slot holds.

**Server settings.** By default the coordinator runs with its own defaults
for ``max_concurrent_uploads``, ``chunk_bytes`` and ``max_message_bytes``
(what an operator gets); ``--server-settings fleet`` uses the larger ones of
``bench/vs_flower.py`` and ``bench/load.py`` (``bench/fleet.py``), which hold
more scratch rows and a larger queued download message per stream. A client
holds its model and one model-sized vector (download, then update in place):
``2 x 4 d`` bytes plus a chunk each way. The JSON states the model, the
measured buffers per case and whether every peak is within it.

Writes ``bench/results/round_overhead.json``. Usage::

    nice -n 10 python -m bench.round_overhead          # full (~30 min here)
    python -m bench.round_overhead --tiny --out X.json # the test's tiny mode
    python -m bench.round_overhead --server-settings fleet \
        --cases fedavg:100:10000000 --out bench/results/round_overhead_fleet.json
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # allow ``python bench/round_overhead.py``
    sys.path.insert(0, str(REPO))

from bench import fleet, load  # noqa: E402
from bench.common import (  # noqa: E402
    PeakRss,
    check_out,
    environment,
    loadavg,
    median,
    peak_rss_mb,
    shared_machine,
    tiny_parser,
    write_results,
)
from bench.payload_speed import payload_speed  # noqa: E402
from fedplat.testing.tokens import issue_tokens  # noqa: E402

DEFAULT_OUT = REPO / "bench" / "results" / "round_overhead.json"
MB = 1e6
RULES: dict[str, dict[str, Any]] = {
    "fedavg": {"name": "fedavg"},
    "krum": {"name": "krum", "params": {"f": 1}},
}
#: Model-sized buffers the coordinator holds besides the accumulator's rows.
FIXED_BUFFERS = {"fedavg": 6, "krum": 6}
#: A peak "fits" the model within this slack (allocator rounding, gRPC buffers).
SLACK = 1.10
SLACK_MB = 64.0
CLIENT_GOAL_MIN_PARAMS = 10_000_000
GOALS_MB = {"fedavg": 1500.0, "krum": 6000.0}  # at 100 clients x 10M


@dataclass(frozen=True)
class Setup:
    clients: tuple[int, ...]
    params: tuple[int, ...]
    rules: tuple[str, ...]
    rounds: int
    repetitions: int
    payload_params: int


FULL = Setup((10, 100), (1_000_000, 10_000_000), ("fedavg", "krum"), 4, 2, 10_000_000)
TINY = Setup((6,), (1_000_000,), ("fedavg", "krum"), 3, 1, 1_000_000)
#: The server settings a run can be made with (``--server-settings``).
SIZES = ("max_concurrent_uploads", "chunk_bytes", "max_message_bytes")


def _coordinator_defaults() -> dict[str, int]:
    from fedplat.server.config import ServerSection

    fields = ServerSection.model_fields
    return {k: int(fields[k].default) for k in (*SIZES, "stream_window_bytes")}


_DEFAULTS = _coordinator_defaults()
SERVER_SETTINGS: dict[str, dict[str, int]] = {
    # What an operator gets without setting them.
    "coordinator": {k: _DEFAULTS[k] for k in SIZES},
    # bench/vs_flower.py's and bench/load.py's (bench/fleet.py SERVER).
    "fleet": {k: int(fleet.SERVER[k]) for k in SIZES},
}
#: The coordinator's default decoding slots (the memory model's default).
MAX_CONCURRENT_UPLOADS = _DEFAULTS["max_concurrent_uploads"]
#: The HTTP/2 receive window of each upload stream (server.stream_window_bytes):
#: what an upload waiting for a decoding slot holds in the coordinator.
STREAM_WINDOW = _DEFAULTS["stream_window_bytes"]


def rows_held(rule: str, clients: int, uploads: int = MAX_CONCURRENT_UPLOADS) -> int:
    return clients if rule == "krum" else min(clients, uploads)


def predicted_mb(
    base_mb: float,
    rule: str,
    clients: int,
    params: int,
    uploads: int = MAX_CONCURRENT_UPLOADS,
) -> float:
    buffers = FIXED_BUFFERS[rule] + rows_held(rule, clients, uploads)
    return base_mb + buffers * 4 * params / MB + clients * STREAM_WINDOW / MB


def _mem_available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024 / MB
    return 0.0


#: Updates a light-client process builds and sends at once.
LIGHT_UPLOADS = 2


def client_kind(rule: str, clients: int, params: int) -> tuple[str, str]:
    """``("sdk" | "light" | "skipped", why)``: SDK clients where their memory
    fits this machine (each holds its model and update), else light
    wire-protocol clients (:mod:`bench.load`: an update built per upload, at
    most :data:`LIGHT_UPLOADS` per process), else not run."""
    server = predicted_mb(600, rule, clients, params)
    procs = min(clients, 5)
    sdk = server + clients * 3 * 4 * params / MB + procs * 300
    light = server + procs * (300 + LIGHT_UPLOADS * 3 * 4 * params / MB)
    avail = _mem_available_mb()
    why = (
        f"SDK clients need ~{sdk:.0f} MB, light clients ~{light:.0f} MB; "
        f"{avail:.0f} MB available"
    )
    if sdk <= 0.85 * avail:
        return "sdk", why
    return ("light" if light <= 0.85 * avail else "skipped"), why


def run_case(
    rule: str,
    clients: int,
    params: int,
    s: Setup,
    w: Path,
    server: dict[str, int] = SERVER_SETTINGS["coordinator"],
) -> dict[str, Any]:
    kind, why = client_kind(rule, clients, params)
    if kind == "skipped":
        return {"skipped": why}
    cfg = fleet.run_config(
        w,
        clients=clients,
        rounds=s.rounds,
        numel=params,
        aggregator=RULES[rule],
        server=server,
    )
    tokens = issue_tokens(cfg, clients)
    coord = fleet.CoordinatorProcess(cfg, w)
    base = peak_rss_mb(coord.proc.pid)  # listening, no client yet
    peak = PeakRss(coord.proc.pid).start()
    if kind == "sdk":
        procs = fleet.start_sdk_clients(
            coord.address, tokens, params, min(clients, 5), w
        )
    else:
        procs = load.start_clients(
            coord.address,
            tokens,
            params,
            min(clients, 5),
            w,
            uploads=LIGHT_UPLOADS,
            name="light",
        )
    mb = fleet.serve_to_end(coord.proc, procs, peak, 3600, coord.log)
    rounds = fleet.round_records(cfg["store"]["url"])
    done = [r for r in rounds if r.status == "completed" and r.finished is not None]
    reports = [json.loads(f.read_text()) for f in sorted(w.glob("clients-*.json"))]
    if len(done) < s.rounds:
        raise RuntimeError(
            f"{rule} x {clients} x {params}: {len(done)} of {s.rounds} rounds "
            f"completed:\n{fleet.tail(coord.log)}"
        )
    light = [json.loads(f.read_text()) for f in sorted(w.glob("light-*.json"))]
    if any(f["failures"] for f in light):
        raise RuntimeError(f"light clients failed: {light[0]['failures'][:3]}")
    return {
        "clients_kind": kind,
        "clients_kind_why": why,
        "rounds_completed": len(done),
        "all_clients_succeeded": all(r.num_succeeded == clients for r in done),
        "round_s": fleet.intervals([r.finished for r in done if r.finished]),
        "wire_bytes_per_round": [r.bytes_up + r.bytes_down for r in done],
        "base_rss_mb": round(base, 1),
        "peak_rss_mb": mb,
        "client_processes": reports,
    }


def _client_bytes(reps: list[dict[str, Any]]) -> float:
    """Measured bytes per client: (peak - baseline) / clients, per process."""
    per = [
        (c["peak_rss_mb"] - c["baseline_rss_mb"]) * MB / c["clients"]
        for r in reps
        for c in r["client_processes"]
    ]
    return median(per) if per else float("nan")


def summarize(
    rule: str,
    clients: int,
    params: int,
    reps: list[dict[str, Any]],
    uploads: int = MAX_CONCURRENT_UPLOADS,
) -> dict[str, Any]:
    ran = [r for r in reps if "skipped" not in r]
    row: dict[str, Any] = {"rule": rule, "clients": clients, "params": params}
    if not ran:
        return {**row, "skipped": reps[0]["skipped"]}
    times = [t for r in ran for t in r["round_s"]]
    med = median(times)
    bytes_per_round = clients * 2 * 4 * params
    base = median(r["base_rss_mb"] for r in ran)
    peak = max(r["peak_rss_mb"] for r in ran)
    pred = predicted_mb(base, rule, clients, params, uploads)
    client_b = _client_bytes(ran)  # nan: light clients report no memory
    measured = client_b == client_b
    return {
        **row,
        "rounds_measured": len(times),
        "all_rounds_complete": all(
            r["rounds_completed"] == len(r["round_s"]) + 1
            and r["all_clients_succeeded"]
            for r in ran
        ),
        "median_round_s": round(med, 4),
        # Nearest rank: the smallest time with at least 90 % of them at or below.
        "p90_round_s": round(sorted(times)[math.ceil(0.9 * len(times)) - 1], 4),
        "bytes_per_round": bytes_per_round,
        "wire_bytes_per_round": ran[0]["wire_bytes_per_round"],
        "effective_gbps": round(bytes_per_round / med / 1e9, 3),
        "server_base_rss_mb": round(base, 1),
        "server_peak_rss_mb": peak,
        "server_model_sized_buffers": round((peak - base) * MB / (4 * params), 2),
        "server_predicted_peak_mb": round(pred, 1),
        "server_within_model": peak <= pred * SLACK + SLACK_MB,
        "clients_kind": ran[0].get("clients_kind", "sdk"),
        "client_bytes_measured": round(client_b) if measured else None,
        "client_model_sized_buffers": (
            round(client_b / (4 * params), 2) if measured else None
        ),
        "client_within_3_buffers": client_b <= 3 * 4 * params if measured else None,
        "repetitions": ran,
    }


def memory_model(uploads: int = MAX_CONCURRENT_UPLOADS) -> dict[str, Any]:
    return {
        "server_running_sum": {
            "formula": "base + 4 d (F + min(n, max_concurrent_uploads)) + n w",
            "F": FIXED_BUFFERS["fedavg"],
            "max_concurrent_uploads": uploads,
            "w": f"{STREAM_WINDOW} bytes (server.stream_window_bytes: what an "
            "upload waiting for a decoding slot holds)",
            "bytes_per_parameter": (
                f"4 x ({FIXED_BUFFERS['fedavg']} + min(n, {uploads}))"
            ),
            "bytes_per_client_per_parameter": (
                f"4 for the first {uploads} clients, then 0"
            ),
        },
        "server_row_stack": {
            "formula": "base + 4 d (F + n) + n w",
            "F": FIXED_BUFFERS["krum"],
            "bytes_per_parameter": f"4 x ({FIXED_BUFFERS['krum']} + n)",
            "bytes_per_client_per_parameter": 4,
        },
        "client": {
            "formula": "4 d x 2 (the model, one vector: download, then the "
            "update in place) + one chunk each way",
            "bytes_per_parameter": 8,
            "goal": "at most 3 model-sized buffers (12 bytes per parameter)",
        },
        "fits": f"peak <= predicted x {SLACK} + {SLACK_MB:.0f} MB",
    }


def goals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for rule, limit in GOALS_MB.items():
        big = [r for r in rows if r["rule"] == rule and r["clients"] == 100]
        big = [r for r in big if r["params"] == 10_000_000 and "skipped" not in r]
        peak = big[0]["server_peak_rss_mb"] if big else None
        out[f"{rule}_100x10M_peak_rss_mb"] = peak
        # None: the case was not run (``--cases``), neither met nor missed.
        out[f"{rule}_100x10M_under_{limit / 1000:g}gb_met"] = (
            None if peak is None else peak < limit
        )
    ran = [r for r in rows if "skipped" not in r]
    out["server_peaks_within_model_met"] = all(r["server_within_model"] for r in ran)
    # Judged where a model is far larger than a message (1-4 MiB chunks): at 1M
    # parameters a client's gRPC message buffers alone are about a model each.
    big_models = [
        r
        for r in ran
        if r["params"] >= CLIENT_GOAL_MIN_PARAMS
        and r["client_within_3_buffers"] is not None
    ]
    out["clients_within_3_buffers_judged_at"] = sorted(
        {r["params"] for r in big_models}
    )
    out["clients_within_3_buffers_met"] = bool(big_models) and all(
        r["client_within_3_buffers"] for r in big_models
    )
    return out


def _case(text: str) -> tuple[str, int, int]:
    rule, clients, params = text.split(":")
    return rule, int(clients), int(params)


def replace_rows(
    path: Path, rows: list[dict[str, Any]], log: list[dict[str, Any]], started: float
) -> None:
    """Put ``rows`` in place of the rows of the same cases in ``path``; the
    re-run's log is appended and the re-run said in the deviations."""
    data = json.loads(path.read_text())
    key = ("rule", "clients", "params")
    new = {tuple(r[k] for k in key): r for r in rows}
    before = [r for r in data["rounds"] if tuple(r[k] for k in key) in new]
    data["rounds"] = [new.get(tuple(r[k] for k in key), r) for r in data["rounds"]]
    data["goals"] = goals(data["rounds"])
    data["setup"]["runs"] += log
    data["setup"]["deviations"].append(
        f"rows {sorted(new)} re-run by a second invocation (load average "
        f"{loadavg()} at its end); the first run's rows: "
        + "; ".join(str(r.get("skipped", "measured"))[:300] for r in before)
    )
    write_results(path, data, started)


def main(argv: Sequence[str] | None = None) -> int:
    ap = tiny_parser(__doc__, DEFAULT_OUT)
    ap.add_argument("--repetitions", type=int, help="fewer (a busy shared machine)")
    ap.add_argument("--rounds", type=int, help="fewer rounds per case (at least 2)")
    subset = ap.add_mutually_exclusive_group()
    subset.add_argument(
        "--replace-rows",
        nargs="+",
        metavar="RULE:CLIENTS:PARAMS",
        help="re-run only these cases and replace their rows in --out",
    )
    subset.add_argument(
        "--cases",
        nargs="+",
        metavar="RULE:CLIENTS:PARAMS",
        help="run only these cases (a JSON of its own)",
    )
    ap.add_argument(
        "--server-settings",
        choices=sorted(SERVER_SETTINGS),
        default="coordinator",
        help="the coordinator's defaults (default), or the fleet benches' "
        "larger messages and decoding slots",
    )
    args = ap.parse_args(argv)
    check_out(ap, args.out)
    if args.replace_rows:
        if not args.out.is_file():
            ap.error(f"--replace-rows: {args.out} does not exist")
        # Rows of one JSON are compared with each other: one server setting.
        kept = json.loads(args.out.read_text())["setup"].get("server_settings")
        if kept != args.server_settings:
            ap.error(
                f"{args.out} ran with server settings {kept!r}; "
                f"--replace-rows needs --server-settings {kept}"
            )
    server = SERVER_SETTINGS[args.server_settings]
    uploads = server["max_concurrent_uploads"]
    s = TINY if args.tiny else FULL
    if args.repetitions:
        s = replace(s, repetitions=args.repetitions)
    if args.rounds:
        s = replace(s, rounds=max(2, args.rounds))
    started = time.perf_counter()
    load_start = loadavg()
    cases = [(r, n, d) for d in s.params for n in s.clients for r in s.rules]
    if args.replace_rows or args.cases:
        cases = [_case(c) for c in args.replace_rows or args.cases]
    reps: dict[tuple[str, int, int], list[dict[str, Any]]] = {c: [] for c in cases}
    log = []
    with tempfile.TemporaryDirectory(prefix="round-overhead-") as tmp:
        for rep in range(s.repetitions):
            for rule, n, d in cases:
                w = Path(tmp) / f"r{rep}-{rule}-{n}-{d}"
                w.mkdir()
                try:
                    got = run_case(rule, n, d, s, w, server)
                except RuntimeError as exc:  # one failed case keeps the others
                    got = {"skipped": f"run failed: {str(exc)[-1500:]}"}
                reps[(rule, n, d)].append(got)
                log.append(
                    {
                        "repetition": rep,
                        "rule": rule,
                        "clients": n,
                        "params": d,
                        **{
                            k: got.get(k) for k in ("round_s", "peak_rss_mb", "skipped")
                        },
                        "loadavg": loadavg(),
                    }
                )
                print(json.dumps(log[-1]), flush=True)
    rows = [summarize(r, n, d, reps[(r, n, d)], uploads) for r, n, d in cases]
    if args.replace_rows:
        replace_rows(args.out, rows, log, started)
        return 0
    payload = payload_speed(s.payload_params, repeats=5 if args.tiny else 15)
    import grpc

    results = {
        "benchmark": "round_overhead",
        "tiny": args.tiny,
        "rounds": rows,
        "payload": payload,
        "memory_model": memory_model(uploads),
        "goals": goals(rows),
        "setup": {
            **asdict(s),
            "deviations": [
                f"{k}: {v} instead of {getattr(FULL, k)} (the machine's 2 cores "
                "are shared; a full run would take too long)"
                for k, v in asdict(s).items()
                if not args.tiny and v != getattr(FULL, k)
            ],
            "transport": "the coordinator's grpc.aio server (a waiting client "
            "holds no thread), plaintext over 127.0.0.1",
            "server": {**fleet.SERVER, **server},
            "server_settings": args.server_settings,
            "processes": "coordinator: 1 process; clients: threads of "
            "min(clients, 5) processes (a process's SDK clients share its "
            "connection; light clients have one each)",
            "round_time": "time between consecutive round completions (store "
            "finished_at); the first round is discarded",
            "peak_rss": "coordinator VmHWM sampled every 0.2 s; base = VmHWM "
            "once listening, before any client",
            "store": "SQLite; safetensors checkpoint per round, 1 kept",
            "runs": log,
            **shared_machine(load_start),
        },
        "environment": environment(started, grpcio=grpc.__version__),
    }
    write_results(args.out, results, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())

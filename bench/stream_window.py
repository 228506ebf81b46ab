"""What uploads waiting for a decoding slot cost the coordinator's memory.

The coordinator decodes at most ``server.max_concurrent_uploads`` updates at
once; the other uploads wait with their streams open, their bytes held by
gRPC up to each stream's HTTP/2 receive window. This benchmark measures that
alone, over loopback: a gRPC server in a process of its own with one stream-
unary handler that reads a stream's first message, then waits for the single
slot (an ``asyncio.Semaphore(1)``) before reading the rest; ``streams`` client
streams (threads of 4 client processes) each send ``stream_mb`` MiB in 1 MiB
messages at once. Two server configurations, repetitions interleaved:

* ``coordinator``: the coordinator's own options
  (:func:`fedplat.server.wire.grpc_options` of a default ``ServerSection``: a
  fixed receive window per stream, ``stream_window_bytes``, BDP probing off);
* ``grpc_auto_tuning``: the same without those two options (gRPC's defaults:
  BDP probing grows the windows).

Reported per configuration: the server process's peak resident set above its
resident set before the streams (MB, the largest over repetitions) and the
seconds until every stream completed (median); the ratios compare the two.

Usage::

    python -m bench.stream_window                # 20 streams of 40 MiB
    python -m bench.stream_window --tiny --out /tmp/sw.json
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # allow ``python bench/stream_window.py``
    sys.path.insert(0, str(REPO))

from bench.common import (  # noqa: E402
    _status_kb,
    check_out,
    environment,
    loadavg,
    median,
    peak_rss_mb,
    tiny_parser,
    write_results,
)

RESULTS = REPO / "bench" / "results" / "stream_window.json"
MiB = 1 << 20
CLIENT_PROCESSES = 4
CONFIGS = ("coordinator", "grpc_auto_tuning")
TUNING = ("grpc.http2.bdp_probe", "grpc.http2.lookahead_bytes")


@dataclass(frozen=True)
class Setup:
    streams: int
    stream_mb: int
    repetitions: int


FULL = Setup(streams=20, stream_mb=40, repetitions=2)
TINY = Setup(streams=4, stream_mb=8, repetitions=1)


def options(config: str) -> list[tuple[str, int]]:
    from fedplat.server.config import ServerSection
    from fedplat.server.wire import grpc_options

    opts = grpc_options(ServerSection(insecure=True))
    return opts if config == "coordinator" else [o for o in opts if o[0] not in TUNING]


def _serve(config: str, port: Any, ready: Any) -> None:
    """The server process: one slot, streams wait for it after their header."""
    import grpc

    async def main() -> None:
        server = grpc.aio.server(options=options(config))
        slot = asyncio.Semaphore(1)

        async def upload(it: Any, _ctx: Any) -> bytes:
            await it.__anext__()  # the header
            async with slot:
                async for _ in it:
                    pass
            return b""

        handler = grpc.stream_unary_rpc_method_handler(upload)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("bench.Up", {"Up": handler}),)
        )
        port.value = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        ready.set()
        await server.wait_for_termination()

    asyncio.run(main())


CLIENT = """
import sys, threading, grpc
port, k, mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ch = grpc.insecure_channel("127.0.0.1:" + port,
                           options=[("grpc.max_send_message_length", 8 << 20)])
up = ch.stream_unary("/bench.Up/Up")
body = bytes(1 << 20)
def gen():
    yield b"h"
    for _ in range(mb):
        yield body
ts = [threading.Thread(target=lambda: up(gen(), timeout=600)) for _ in range(k)]
for t in ts: t.start()
for t in ts: t.join()
"""


def run_once(config: str, setup: Setup) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    port, ready = ctx.Value("i", 0), ctx.Event()
    server = ctx.Process(target=_serve, args=(config, port, ready), daemon=True)
    server.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("the server did not start")
        time.sleep(0.5)
        base = _status_kb(server.pid or 0, "VmRSS") * 1024 / 1e6
        share = [setup.streams // CLIENT_PROCESSES] * CLIENT_PROCESSES
        for i in range(setup.streams % CLIENT_PROCESSES):
            share[i] += 1
        t0 = time.perf_counter()
        argv = [sys.executable, "-c", CLIENT, str(port.value)]
        clients = [
            subprocess.Popen([*argv, str(k), str(setup.stream_mb)]) for k in share if k
        ]
        codes = [c.wait(600) for c in clients]
        seconds = time.perf_counter() - t0
        if any(codes):
            raise RuntimeError(f"client processes exited with {codes}")
        peak = peak_rss_mb(server.pid or 0)
    finally:
        server.kill()
        server.join(10)
    return {"growth_mb": round(peak - base, 1), "seconds": round(seconds, 3)}


def run(setup: Setup) -> dict[str, Any]:
    reps: dict[str, list[dict[str, float]]] = {c: [] for c in CONFIGS}
    for _ in range(setup.repetitions):
        for config in CONFIGS:
            reps[config].append(run_once(config, setup))
    rows = {
        c: {
            "peak_growth_mb": max(r["growth_mb"] for r in reps[c]),
            "median_seconds": median(r["seconds"] for r in reps[c]),
            "repetitions": reps[c],
        }
        for c in CONFIGS
    }
    ours, auto = rows["coordinator"], rows["grpc_auto_tuning"]
    return {
        "rows": rows,
        "memory_ratio_auto_tuning_vs_coordinator": round(
            auto["peak_growth_mb"] / max(ours["peak_growth_mb"], 1.0), 2
        ),
        "time_ratio_coordinator_vs_auto_tuning": round(
            ours["median_seconds"] / auto["median_seconds"], 3
        ),
        "bytes_waiting_mb": round(setup.streams * setup.stream_mb * MiB / 1e6, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = tiny_parser(__doc__, RESULTS)
    args = ap.parse_args(argv)
    check_out(ap, args.out)
    setup = TINY if args.tiny else FULL
    t0 = time.perf_counter()
    load_start = loadavg()
    body = run(setup)
    out = {
        "benchmark": "stream_window",
        "tiny": args.tiny,
        **body,
        "setup": {
            **asdict(setup),
            "message_bytes": MiB,
            "client_processes": CLIENT_PROCESSES,
            "slots": 1,
            "coordinator_options": dict(options("coordinator")),
            "transport": "plaintext gRPC over 127.0.0.1",
            "load_average": {"start": load_start, "end": loadavg()},
        },
        "environment": environment(t0),
    }
    write_results(args.out, out, t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())

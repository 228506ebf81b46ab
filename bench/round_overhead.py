"""Per-round coordination overhead over loopback gRPC, and wire (de)serialization speed.

Two measurements, one JSON file (``bench/results/round_overhead.json``):

1. **Serialization.** The update path a client and the coordinator run for every
   upload -- encode: ``codec.encode_dense`` + ``sha256`` + ``serde.update_to_chunks``
   + protobuf ``SerializeToString`` of every chunk; decode: protobuf parse of every
   chunk + ``serde.update_from_chunks`` (reassembly, size and sha256 checks) +
   ``codec.decode`` (copy + finiteness check) -- timed against a plain memory copy of
   the same bytes (``bytearray(data)`` and ``numpy.copy``) in the same run. Ratios
   (ours / memcpy, in GB/s) are the number to compare across machines.

2. **Rounds.** A real :class:`fedplat.server.app.Coordinator` (gRPC server, round
   engine, SQLite store, safetensors checkpoints) and N real
   :class:`fedplat.client.Client` SDK instances over plaintext gRPC on 127.0.0.1.
   Clients do no training: ``train_fn`` adds a constant to the model in place
   (~1 ms), so the update is a fixed small perturbation. The model is
   :func:`flat_model` (a linear 64->10 head for the tiny server-side evaluation plus
   one padding tensor up to the requested parameter count).

   Process layout: the coordinator runs in one process; the N clients run as N
   threads (each with its own gRPC channel and model copy) in a second process.
   100 client processes would not fit a 2-core machine; keeping the coordinator
   out of the clients' process keeps it from competing with them for one GIL, so
   the coordinator's overhead is what is measured. ``--client-procs K`` spreads the
   client threads over K processes.

   A round is timed inside the coordinator process, from the start of
   ``RoundEngine.open_round`` to the return of ``close_round`` (select, publish
   tasks, N downloads, N uploads, decode, aggregate, checkpoint, store writes,
   re-encode the global model). The first ``--warmup`` rounds are excluded; the
   median and p90 of the next ``--rounds`` are reported. Server-side evaluation is
   kept out: ``data.eval_every`` is larger than the run, so only the final round
   evaluates (on ``evaluation.max_examples=32`` digits), and that extra final round
   is run but not timed.

Bytes per round = N x (model download + update upload) payload bytes, cross-checked
against the byte counts the coordinator stores for each participation. Effective
throughput = bytes per round / median round seconds.

Each case runs in fresh processes watched by this one: a case whose estimated or
measured memory exceeds the budget, or that runs past its time limit, is killed and
recorded under ``skipped`` with the reason (and any rounds it finished).

Run::

    python -m bench.round_overhead              # full: {10, 100} x {1M, 10M}
    python -m bench.round_overhead --quick      # seconds, for the smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # allow ``python bench/round_overhead.py``
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

SCHEMA_VERSION = 1
DEFAULT_OUT = REPO / "bench" / "results" / "round_overhead.json"
MODEL_SPEC = "bench.round_overhead:flat_model"
INPUT_SHAPE = (1, 8, 8)  # scikit-learn digits, the evaluation set
NUM_CLASSES = 10
GB = 1e9


# --------------------------------------------------------------------------- model
class FlatModel(nn.Module):
    """A 64->10 linear head plus one padding tensor: ``numel`` float32 parameters.

    ``forward``: ``float32 [B, 1, 8, 8]`` -> logits ``[B, num_classes]``; the padding
    only travels on the wire, so server-side evaluation stays negligible.
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
    """Model factory for ``model.name = "bench.round_overhead:flat_model"``."""
    return FlatModel(input_shape, num_classes, numel)


# ---------------------------------------------------------------------- helpers
def _interleaved_seconds(
    ops: dict[str, Callable[[], object]], repeats: int
) -> dict[str, list[float]]:
    """Time every op ``repeats`` times, round-robin, after one warm-up call each.

    Interleaving makes an op and its peer see the same (shared, noisy) machine.
    """
    for fn in ops.values():
        fn()
    out: dict[str, list[float]] = {k: [] for k in ops}
    for _ in range(repeats):
        for name, fn in ops.items():
            t0 = time.perf_counter()
            fn()
            out[name].append(time.perf_counter() - t0)
    return out


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _mem_available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine_info() -> dict[str, Any]:
    import grpc

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    total = 0
    try:
        with open("/proc/meminfo") as f:
            total = int(f.readline().split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "mem_total_gb": round(total / GB, 2),
        "mem_available_gb_at_start": round(_mem_available_bytes() / GB, 2),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "grpcio": grpc.__version__,
        "numpy": np.__version__,
        "torch_num_threads": torch.get_num_threads(),
        "loadavg_at_start": _loadavg(),
    }


# ---------------------------------------------------------------- serialization
def bench_serialization(numel: int, repeats: int, chunk_bytes: int) -> dict[str, Any]:
    """Update encode/decode through the wire format vs a plain memory copy."""
    from fedplat.proto import fedplat_pb2 as pb
    from fedplat.proto import serde
    from fedplat.transport import codec
    from fedplat.transport.messages import UpdateHeader
    from fedplat.vectors import layout_of

    layout = layout_of(flat_model(INPUT_SHAPE, NUM_CLASSES, numel))
    gen = torch.Generator().manual_seed(0)
    vec = torch.randn(numel, generator=gen, dtype=torch.float32)
    nbytes = 4 * numel
    data = codec.encode_dense(vec)
    digest = codec.sha256_hex(data)
    header = UpdateHeader(
        task_id="t" * 16,
        round=1,
        num_examples=1,
        layout=layout,
        total_bytes=nbytes,
        sha256=digest,
    )
    arr = np.frombuffer(data, dtype=np.uint8)

    def encode() -> list[bytes]:
        d = codec.encode_dense(vec)
        h = UpdateHeader(
            task_id="t" * 16,
            round=1,
            num_examples=1,
            layout=layout,
            total_bytes=len(d),
            sha256=codec.sha256_hex(d),
        )
        return [
            c.SerializeToString() for c in serde.update_to_chunks(h, d, chunk_bytes)
        ]

    wire = encode()

    def parse_reassemble() -> tuple[UpdateHeader, bytes]:
        return serde.update_from_chunks(
            (pb.UpdateChunk.FromString(b) for b in wire), max_bytes=nbytes + 1
        )

    def decode() -> torch.Tensor:
        h, d = parse_reassemble()
        return codec.decode(h.encoding, d, numel, h.encoding_params)

    f32 = vec.numpy()
    ops: dict[str, Callable[[], object]] = {
        "memcpy": lambda: bytearray(data),
        "numpy_copy": lambda: np.copy(arr),
        "encode": encode,
        "decode": decode,
        # stages of the two pipelines
        "encode_dense": lambda: codec.encode_dense(vec),
        "sha256": lambda: codec.sha256_hex(data),
        "chunk_and_serialize": lambda: [
            c.SerializeToString()
            for c in serde.update_to_chunks(header, data, chunk_bytes)
        ],
        "parse_reassemble_verify": parse_reassemble,
        "codec_decode": lambda: codec.decode(codec.DENSE_F32, data, numel),
        # codec.decode's finiteness check vs a one-pass alternative (same vector)
        "torch_isfinite_all": lambda: bool(torch.isfinite(vec).all()),
        "numpy_isfinite_all": lambda: bool(np.isfinite(f32).all()),
    }
    times = _interleaved_seconds(ops, repeats)
    med = {k: statistics.median(v) for k, v in times.items()}

    def paired_ratio(peer: str, op: str) -> float:
        # Median over repetitions of (peer time / op time) measured back to back,
        # so both sides of each ratio saw the same machine load.
        return round(
            statistics.median(
                p / o for p, o in zip(times[peer], times[op], strict=True)
            ),
            4,
        )

    encode_s, decode_s = med["encode"], med["decode"]
    memcpy_s, npcopy_s = med["memcpy"], med["numpy_copy"]
    stages = (
        "encode_dense",
        "sha256",
        "chunk_and_serialize",
        "parse_reassemble_verify",
        "codec_decode",
    )
    stages_s = {k: med[k] for k in stages}
    finite_s = {k: med[k] for k in ("torch_isfinite_all", "numpy_isfinite_all")}

    def gbps(s: float) -> float:
        return round(nbytes / s / GB, 3)

    memcpy_gbps = gbps(memcpy_s)
    return {
        "params": numel,
        "bytes": nbytes,
        "chunk_bytes": chunk_bytes,
        "chunks": len(wire) - 1,
        "repeats": repeats,
        "statistic": "median of `repeats` interleaved repetitions after one warm-up",
        "encode_pipeline": "codec.encode_dense + sha256 + serde.update_to_chunks "
        "+ SerializeToString per chunk (what a client does per upload)",
        "decode_pipeline": "UpdateChunk.FromString per chunk + "
        "serde.update_from_chunks (reassembly, size + sha256 check) + codec.decode "
        "(copy + isfinite) (what the coordinator does per upload)",
        "encode_s": round(encode_s, 6),
        "decode_s": round(decode_s, 6),
        "memcpy_s": round(memcpy_s, 6),
        "numpy_copy_s": round(npcopy_s, 6),
        "encode_gbps": gbps(encode_s),
        "decode_gbps": gbps(decode_s),
        "memcpy_gbps": memcpy_gbps,
        "numpy_copy_gbps": gbps(npcopy_s),
        "memcpy_peer": "bytearray(data)",
        "ratio_definition": "median over repetitions of peer_seconds / our_seconds, "
        "each pair timed back to back (operations interleaved round-robin); "
        "1.0 = as fast as the copy",
        "encode_ratio_to_memcpy": paired_ratio("memcpy", "encode"),
        "decode_ratio_to_memcpy": paired_ratio("memcpy", "decode"),
        "encode_ratio_to_numpy_copy": paired_ratio("numpy_copy", "encode"),
        "decode_ratio_to_numpy_copy": paired_ratio("numpy_copy", "decode"),
        "stages_gbps": {k: gbps(v) for k, v in stages_s.items()},
        "stages_ratio_to_memcpy": {k: paired_ratio("memcpy", k) for k in stages},
        "finite_check_note": "codec.decode uses torch.isfinite(vec).all(); numpy's "
        "one-pass isfinite is measured beside it on the same vector",
        "finite_check_gbps": {k: gbps(v) for k, v in finite_s.items()},
    }


# ---------------------------------------------------------------- round cases
@dataclass(frozen=True)
class CaseSpec:
    clients: int
    params: int
    warmup: int
    rounds: int  # measured rounds
    workdir: str
    round_deadline_s: float
    max_workers: int | None = None  # None: the coordinator's configured default

    @property
    def total_rounds(self) -> int:
        # + 1: the engine always evaluates the final round; that round is not timed.
        return self.warmup + self.rounds + 1


@dataclass
class RoundTiming:
    number: int
    open_s: float  # open_round: selection, tasks, store writes
    collect_s: float  # tasks polled, N downloads + N uploads decoded
    close_s: float  # aggregate, checkpoint, store writes, re-encode global model
    round_s: float  # open_round start -> close_round return
    succeeded: int
    selected: int
    completed: bool
    load1: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class _ErrorCounter(logging.Handler):
    """Counts ERROR records of the coordinator (e.g. RPCs that failed with INTERNAL)."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def _build_config(spec: CaseSpec) -> Any:
    from fedplat.server.config import parse_config

    server: dict[str, Any] = {"address": "127.0.0.1:0", "insecure": True}
    if spec.max_workers is not None:
        server["max_workers"] = spec.max_workers
    return parse_config(
        {
            "run": {"name": "round-overhead", "rounds": spec.total_rounds, "seed": 0},
            "model": {
                "name": MODEL_SPEC,
                "params": {"numel": spec.params},
                "input_shape": list(INPUT_SHAPE),
                "num_classes": NUM_CLASSES,
            },
            "data": {"dataset": "digits", "eval_every": 1_000_000},
            "evaluation": {"max_examples": 32},
            "selection": {
                "clients_per_round": spec.clients,
                "min_available": spec.clients,
                "quorum": spec.clients,
            },
            "deadlines": {
                "round_seconds": spec.round_deadline_s,
                "liveness_seconds": max(30.0, spec.round_deadline_s),
            },
            "store": {"url": str(Path(spec.workdir) / "fedplat.db")},
            "checkpoints": {"dir": str(Path(spec.workdir) / "ckpt"), "keep_last": 1},
            "server": server,
        }
    )


class _Probe:
    """Thread-safe per-round accumulators: seconds and calls per named phase.

    Phases run in RPC threads overlap, so their sums can exceed the round time.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.uploads: list[float] = []  # perf_counter when each update was accepted

    def reset(self) -> None:
        with self._lock:
            self.seconds, self.calls, self.uploads = {}, {}, []

    def add(self, name: str, dt: float) -> None:
        with self._lock:
            self.seconds[name] = self.seconds.get(name, 0.0) + dt
            self.calls[name] = self.calls.get(name, 0) + 1

    def timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.add(name, time.perf_counter() - t0)

        return wrapper


class _AggregatorProxy:
    """Times the aggregation rule; everything else goes to the wrapped aggregator."""

    def __init__(self, inner: Any, probe: _Probe) -> None:
        self._inner = inner
        self._call = probe.timed("aggregate", inner)

    def __call__(self, *a: Any, **kw: Any) -> Any:
        return self._call(*a, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _instrument(coord: Any, probe: _Probe) -> None:
    """Wrap the coordinator's expensive steps with timers (this process only)."""
    import fedplat.server.engine as engine_module

    from fedplat.transport import codec

    engine, store = coord.engine, coord.store
    for name in dir(type(store)):
        attr = getattr(store, name)
        if not name.startswith("_") and callable(attr):
            setattr(store, name, probe.timed("store", attr))
    engine_module.save_checkpoint = probe.timed(
        "checkpoint", engine_module.save_checkpoint
    )
    engine_module.prune_checkpoints = probe.timed(
        "checkpoint", engine_module.prune_checkpoints
    )
    codec.decode = probe.timed("decode_update", codec.decode)
    engine.aggregator = _AggregatorProxy(engine.aggregator, probe)
    engine.evaluator = probe.timed("evaluate", engine.evaluator)
    engine.optimizer.step = probe.timed("server_optimizer", engine.optimizer.step)
    engine._refresh_model_bytes = probe.timed(
        "encode_global_model", engine._refresh_model_bytes
    )
    orig_upload = engine.upload_update

    def upload_update(*a: Any, **kw: Any) -> Any:
        out = orig_upload(*a, **kw)
        probe.uploads.append(time.perf_counter())
        return out

    engine.upload_update = upload_update


def _coordinator_main(spec: CaseSpec) -> None:
    """Child process: serve the run, time each round, append it to rounds.jsonl."""
    from fedplat.server.app import Coordinator

    torch.set_num_threads(2)
    work = Path(spec.workdir)
    cfg = _build_config(spec)
    coord = Coordinator(cfg)
    engine = coord.engine
    probe = _Probe()
    _instrument(coord, probe)
    rounds_file = (work / "rounds.jsonl").open("a", buffering=1)
    state: dict[str, float] = {}
    errors = _ErrorCounter()
    logging.getLogger("fedplat.server").addHandler(errors)
    orig_open, orig_wait, orig_close = (
        engine.open_round,
        engine.wait_round,
        engine.close_round,
    )
    orig_wait_clients = engine.wait_for_clients

    def wait_for_clients(stop: threading.Event, timeout: float | None = None) -> bool:
        # Work-around, outside the timed rounds: RoundEngine.enroll makes a client
        # live in memory before its store row is committed, so under load the first
        # open_round can select a client the store does not know and the driver
        # crashes (StoreError "clients not enrolled"). Wait for the rows too.
        ok = orig_wait_clients(stop, timeout)
        while ok and not stop.is_set():
            known = {c.id for c in coord.store.list_clients(engine.run_id)}
            if set(engine.live_clients()) <= known:
                break
            time.sleep(0.05)
        return ok

    def open_round() -> int:
        errors.count = 0
        probe.reset()
        state["t0"] = time.perf_counter()
        n = orig_open()
        state["t1"] = time.perf_counter()
        return n

    def wait_round(stop: threading.Event | None = None) -> None:
        orig_wait(stop)
        state["t2"] = time.perf_counter()

    def close_round() -> Any:
        r = engine._round  # read-only peek: when each client started its download
        downloads = (
            sorted(t - r.opened_at for t in r.downloaded_at.values()) if r else []
        )
        out = orig_close()
        t3 = time.perf_counter()
        t0, t1, t2 = state["t0"], state["t1"], state["t2"]
        uploads = sorted(u - t0 for u in probe.uploads)

        def spread(xs: list[float]) -> dict[str, float] | None:
            if not xs:
                return None
            return {
                "first": round(xs[0], 3),
                "median": round(statistics.median(xs), 3),
                "last": round(xs[-1], 3),
            }

        rt = RoundTiming(
            number=out.number,
            open_s=t1 - t0,
            collect_s=t2 - t1,
            close_s=t3 - t2,
            round_s=t3 - t0,
            succeeded=out.num_succeeded,
            selected=out.num_selected,
            completed=out.completed,
            load1=round(os.getloadavg()[0], 2),
            extra={
                "rss_gb": round(_rss_bytes(os.getpid()) / GB, 3),
                "server_errors_logged": errors.count,
                "download_start_s": spread(downloads),
                "update_accepted_s": spread(uploads),
                "phase_seconds": {k: round(v, 4) for k, v in probe.seconds.items()},
                "phase_calls": dict(probe.calls),
            },
        )
        rounds_file.write(json.dumps(asdict(rt)) + "\n")
        return out

    engine.wait_for_clients = wait_for_clients
    engine.open_round = open_round
    engine.wait_round = wait_round
    engine.close_round = close_round
    coord.start()
    (work / "port.tmp").write_text(str(coord.port))
    os.replace(work / "port.tmp", work / "port")
    coord.wait()
    # Participation byte counts, to cross-check the computed bytes per round.
    parts = coord.store.list_participations(engine.run_id)
    per_round: dict[int, dict[str, int]] = {}
    for p in parts:
        d = per_round.setdefault(
            p.round_number, {"bytes_up": 0, "bytes_down": 0, "succeeded": 0}
        )
        d["bytes_up"] += p.bytes_up
        d["bytes_down"] += p.bytes_down
        d["succeeded"] += p.status == "succeeded"
    (work / "store_bytes.json").write_text(json.dumps(per_round))
    # Let polling clients hear FINISHED before the socket closes.
    time.sleep(1.5)
    coord.stop(grace=1.0)
    rounds_file.close()


def _clients_main(spec: CaseSpec, port: int, first: int, count: int) -> None:
    """Child process: ``count`` SDK clients as threads, until the run finishes."""
    from fedplat.client import Client, FitResult

    torch.set_num_threads(2)

    def train_fn(model: nn.Module, config: Any) -> FitResult:
        with torch.no_grad():
            model.pad.add_(1e-3)  # type: ignore[operator]
        return FitResult(1)

    clients = [
        Client(
            f"127.0.0.1:{port}",
            flat_model(INPUT_SHAPE, NUM_CLASSES, spec.params),
            train_fn,
            num_examples=1,
            insecure=True,
            name=f"bench-{first + i}",
            give_up_after=30.0,
        )
        for i in range(count)
    ]
    threads = [c.start() for c in clients]
    for t in threads:
        t.join()
    errors = [c.last_error for c in clients if c.last_error]
    if errors:
        print(
            f"{len(errors)} clients stopped with errors, e.g. {errors[0]}",
            file=sys.stderr,
        )
        sys.exit(1)


def estimate_peak_bytes(clients: int, params: int, max_workers: int = 32) -> int:
    """Rough peak resident memory of a case (both processes), for the skip check.

    Calibrated on this benchmark's own peak RSS (10 x 10M and 100 x 1M): the
    coordinator holds N decoded updates plus their ``torch.stack`` copy and ~5
    model-sized transients per upload being decoded (at most ``max_workers`` at
    once); the client host holds N model copies plus ~7 model-sized buffers per
    client in flight (download bytes, reassembly buffer, decoded global vector,
    flatten, delta, isfinite temporaries, encoded bytes), and all N are in flight
    together because every client downloads as soon as the round opens.
    """
    m = 4 * params
    coordinator = m * (2 * clients + 5 * min(clients, max_workers) + 10)
    client_host = m * 8 * clients
    return coordinator + client_host + 800 * 2**20  # + interpreters, torch, grpc


def _default_max_workers() -> int:
    from fedplat.server.config import ServerSection

    return ServerSection(insecure=True).max_workers


def largest_fitting_clients(
    clients: int, params: int, budget: int, max_workers: int | None
) -> int:
    """The most clients (< ``clients``) whose estimated peak fits ``budget``, or 0."""
    mw = max_workers or _default_max_workers()
    n = clients - 1
    while n >= 2 and estimate_peak_bytes(n, params, mw) > budget:
        n -= 1
    return n if n >= 2 else 0


def _spawn(role_args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    log = log_path.open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "bench.round_overhead", *role_args],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _tail(path: Path, n: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def run_case(
    clients: int,
    params: int,
    *,
    warmup: int,
    rounds: int,
    client_procs: int,
    timeout_s: float,
    mem_budget: int,
    max_workers: int | None,
    keep_dir: str | None = None,
) -> dict[str, Any]:
    """Run one (clients, params) case in fresh processes; a result or a skip record."""
    label = {
        "clients": clients,
        "params": params,
        "server_max_workers": max_workers or _default_max_workers(),
    }
    est = estimate_peak_bytes(clients, params, max_workers or _default_max_workers())
    if est > mem_budget:
        return {
            **label,
            "skipped": True,
            "reason": f"estimated peak memory {est / GB:.1f} GB exceeds the budget "
            f"{mem_budget / GB:.1f} GB (see --mem-budget-gb): the coordinator keeps "
            "every decoded update plus a torch.stack copy, and each client in flight "
            "holds ~8 model-sized buffers (estimate_peak_bytes, calibrated on this "
            "benchmark's measured peaks)",
        }
    with tempfile.TemporaryDirectory(prefix="fedplat-bench-") as tmp:
        if keep_dir is not None:
            tmp = tempfile.mkdtemp(prefix="fedplat-bench-", dir=keep_dir)
        work = Path(tmp)
        spec = CaseSpec(
            clients=clients,
            params=params,
            warmup=warmup,
            rounds=rounds,
            workdir=tmp,
            round_deadline_s=max(60.0, timeout_s),
            max_workers=max_workers,
        )
        spec_json = json.dumps(asdict(spec))
        load_before = _loadavg()
        t_start = time.monotonic()
        coord = _spawn(
            ["--role", "coordinator", "--spec", spec_json], work / "coord.log"
        )
        procs = [coord]
        reason: str | None = None
        peak = {"coordinator": 0, "clients": 0}
        try:
            while not (work / "port").exists():
                if coord.poll() is not None:
                    raise RuntimeError(
                        "coordinator exited before serving:\n"
                        + _tail(work / "coord.log")
                    )
                if time.monotonic() - t_start > 120:
                    raise RuntimeError("coordinator did not start within 120 s")
                time.sleep(0.05)
            port = int((work / "port").read_text())
            per = [
                clients // client_procs + (i < clients % client_procs)
                for i in range(client_procs)
            ]
            first = 0
            for i, n in enumerate(per):
                if n == 0:
                    continue
                procs.append(
                    _spawn(
                        [
                            "--role",
                            "clients",
                            "--spec",
                            spec_json,
                            "--port",
                            str(port),
                            "--first",
                            str(first),
                            "--count",
                            str(n),
                        ],
                        work / f"clients{i}.log",
                    )
                )
                first += n
            while any(p.poll() is None for p in procs):
                rss_c = _rss_bytes(coord.pid)
                rss_k = sum(_rss_bytes(p.pid) for p in procs[1:])
                peak["coordinator"] = max(peak["coordinator"], rss_c)
                peak["clients"] = max(peak["clients"], rss_k)
                if rss_c + rss_k > mem_budget:
                    reason = (
                        f"killed: resident memory {(rss_c + rss_k) / GB:.1f} GB "
                        f"exceeded the budget {mem_budget / GB:.1f} GB"
                    )
                    break
                if time.monotonic() - t_start > timeout_s:
                    reason = f"killed: case ran past its {timeout_s:.0f} s limit"
                    break
                time.sleep(0.1)
        finally:
            for p in procs:
                _kill(p) if reason is not None else p.wait(timeout=60)
        wall = time.monotonic() - t_start
        timings = []
        if (work / "rounds.jsonl").exists():
            timings = [
                json.loads(line)
                for line in (work / "rounds.jsonl").read_text().splitlines()
                if line.strip()
            ]
        failed = [p.returncode for p in procs if p.returncode not in (0, None)]
        if reason is None and (failed or len(timings) < spec.total_rounds):
            reason = (
                f"case failed (exit codes {[p.returncode for p in procs]}, "
                f"{len(timings)}/{spec.total_rounds} rounds): "
                + _tail(work / "coord.log", 600)
                + _tail(work / "clients0.log", 600)
            )
        store_bytes = {}
        if (work / "store_bytes.json").exists():
            store_bytes = json.loads((work / "store_bytes.json").read_text())
    measured = [t for t in timings if warmup < t["number"] <= warmup + rounds]
    common = {
        **label,
        "warmup_rounds": warmup,
        "rounds_measured": len(measured),
        "rounds": timings,
        "loadavg_before": load_before,
        "loadavg_after": _loadavg(),
        "peak_rss_gb": {k: round(v / GB, 2) for k, v in peak.items()},
        "estimated_peak_gb": round(est / GB, 2),
        "wall_s": round(wall, 1),
    }
    if reason is not None or not measured:
        return {
            **common,
            "skipped": True,
            "reason": reason or "no measured rounds (raise --rounds)",
        }
    model_bytes = update_bytes = 4 * params
    bytes_per_round = clients * (model_bytes + update_bytes)
    rs = [t["round_s"] for t in measured]
    med = statistics.median(rs)
    stored = [store_bytes.get(str(t["number"]), {}) for t in measured]
    return {
        **common,
        "skipped": False,
        "median_round_s": round(med, 4),
        "p90_round_s": round(_percentile(rs, 90), 4),
        "min_round_s": round(min(rs), 4),
        "max_round_s": round(max(rs), 4),
        "median_open_s": round(statistics.median(t["open_s"] for t in measured), 4),
        "median_collect_s": round(
            statistics.median(t["collect_s"] for t in measured), 4
        ),
        "median_close_s": round(statistics.median(t["close_s"] for t in measured), 4),
        "all_rounds_complete": all(
            t["completed"] and t["succeeded"] == clients for t in measured
        ),
        "bytes_per_round": bytes_per_round,
        "bytes_per_round_stored": [
            s.get("bytes_up", 0) + s.get("bytes_down", 0) for s in stored
        ],
        "effective_gbps": round(bytes_per_round / med / GB, 4),
        "median_round_s_per_client": round(med / clients, 5),
    }


# ------------------------------------------------------------------------ main
def _parse_sizes(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        p = part.strip().lower()
        mult = 1
        if p.endswith("m"):
            p, mult = p[:-1], 1_000_000
        elif p.endswith("k"):
            p, mult = p[:-1], 1_000
        out.append(int(float(p) * mult))
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="seconds-long run (smoke test): 2 clients, 20k params",
    )
    ap.add_argument("--clients", default="10,100", help="comma list (default 10,100)")
    ap.add_argument(
        "--params",
        default="1M,10M",
        help="comma list of float32 parameter counts (default 1M,10M)",
    )
    ap.add_argument("--rounds", type=int, default=5, help="measured rounds per case")
    ap.add_argument("--warmup", type=int, default=1, help="rounds excluded (default 1)")
    ap.add_argument(
        "--client-procs",
        type=int,
        default=1,
        help="processes hosting the client threads (default 1)",
    )
    ap.add_argument(
        "--max-workers",
        type=int,
        default=None,
        help="override server.max_workers (default: the config default)",
    )
    ap.add_argument(
        "--variant-max-workers",
        type=int,
        default=128,
        help="for cases with more clients than server.max_workers, also "
        "run them with this many RPC threads (0: off; default 128)",
    )
    ap.add_argument(
        "--no-substitute",
        dest="substitute",
        action="store_false",
        help="do not replace a case that does not fit memory by the "
        "largest client count that does",
    )
    ap.add_argument(
        "--case-timeout",
        type=float,
        default=900.0,
        help="seconds before a case is killed and recorded as skipped",
    )
    ap.add_argument(
        "--mem-budget-gb",
        type=float,
        default=None,
        help="memory budget per case (default 60%% of MemAvailable, at "
        "most 12 GB: the machine is shared)",
    )
    ap.add_argument(
        "--ser-params",
        default="10M",
        help="parameters for the serialization benchmark (default 10M)",
    )
    ap.add_argument("--ser-repeats", type=int, default=15)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument(
        "--keep-dir",
        default=None,
        help="keep each case's logs, store and checkpoints under this dir",
    )
    ap.add_argument(
        "--role", choices=["coordinator", "clients"], help=argparse.SUPPRESS
    )
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.role is not None:
        spec = CaseSpec(**json.loads(args.spec))
        if args.role == "coordinator":
            _coordinator_main(spec)
        else:
            _clients_main(spec, args.port, args.first, args.count)
        return 0

    torch.set_num_threads(2)
    if args.quick:
        args.clients, args.params, args.ser_params = "2", "20k", "200k"
        args.rounds, args.warmup, args.ser_repeats = 2, 1, 3
        args.case_timeout = min(args.case_timeout, 120.0)
        args.variant_max_workers = 0
    clients_list = _parse_sizes(args.clients)
    params_list = _parse_sizes(args.params)
    budget = (
        int(args.mem_budget_gb * GB)
        if args.mem_budget_gb
        else int(min(0.6 * _mem_available_bytes(), 12 * GB))
    )
    result: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "benchmark": "round_overhead",
        "quick": bool(args.quick),
        "command": " ".join(
            ["python -m bench.round_overhead", *(argv or sys.argv[1:])]
        ),
        "machine": machine_info(),
    }
    from fedplat.server.config import ServerSection

    server_defaults = ServerSection(insecure=True)
    result["setup"] = {
        "transport": "plaintext gRPC over 127.0.0.1 (loopback)",
        "processes": f"coordinator in 1 process; clients as threads in "
        f"{args.client_procs} other process(es); each client has its own "
        "gRPC channel and model copy",
        "client_work": "train_fn adds 1e-3 to the model in place and returns "
        "(no training); the update is that constant perturbation",
        "model": f"{MODEL_SPEC}: Linear(64, 10) + one padding tensor to `params` "
        "float32 values",
        "evaluation": "data.eval_every > rounds: only the final round evaluates (32 "
        "digits examples); that extra final round is run, listed, not "
        "timed",
        "round_timing": "coordinator process, RoundEngine.open_round start -> "
        "close_round return; first `warmup_rounds` and the final "
        "(evaluating) round excluded; open/collect/close are the "
        "engine's phases; rounds[].extra.phase_seconds sums timers "
        "around store calls, update decoding, aggregation, "
        "checkpointing, re-encoding (summed over RPC threads, so they "
        "can overlap)",
        "bytes_per_round": "clients x (model download + update upload) payload bytes "
        "(4 bytes per parameter each way; protobuf framing and the "
        "headers excluded); bytes_per_round_stored is the store's "
        "per-participation count",
        "effective_gbps": "bytes_per_round / median_round_s / 1e9",
        "store": "SQLite (WAL) in a temp dir; checkpoints: safetensors, keep_last 1",
        "workarounds": [
            "before the first round the harness waits until every live client's "
            "store row is committed: RoundEngine.enroll makes a client live in "
            "memory before store.upsert_client commits, and under load open_round "
            "then selected a client unknown to the store and the driver crashed "
            "(StoreError: clients not enrolled). Outside the timed rounds."
        ],
        "server": {
            "max_workers": args.max_workers or server_defaults.max_workers,
            "chunk_bytes": server_defaults.chunk_bytes,
            "max_message_bytes": server_defaults.max_message_bytes,
            "long_poll_seconds": server_defaults.long_poll_seconds,
        },
        "client_poll_seconds": 10.0,
        "torch_num_threads": 2,
        "mem_budget_gb": round(budget / GB, 2),
        "case_timeout_s": args.case_timeout,
    }
    ser_params = _parse_sizes(args.ser_params)[0]
    print(f"serialization: {ser_params} params ...", file=sys.stderr)
    result["serialization"] = bench_serialization(
        ser_params, args.ser_repeats, server_defaults.chunk_bytes
    )
    s = result["serialization"]
    print(
        f"  encode {s['encode_gbps']} GB/s, decode {s['decode_gbps']} GB/s, "
        f"memcpy {s['memcpy_gbps']} GB/s",
        file=sys.stderr,
    )
    rounds_out: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    variants: list[dict[str, Any]] = []

    def case(clients: int, params: int, max_workers: int | None) -> dict[str, Any]:
        print(
            f"case: {clients} clients x {params} params"
            + (f", server.max_workers={max_workers}" if max_workers else "")
            + " ...",
            file=sys.stderr,
        )
        r = run_case(
            clients,
            params,
            warmup=args.warmup,
            rounds=args.rounds,
            client_procs=args.client_procs,
            timeout_s=args.case_timeout,
            mem_budget=budget,
            max_workers=max_workers,
            keep_dir=args.keep_dir,
        )
        if r["skipped"]:
            print(f"  skipped: {r['reason'][:300]}", file=sys.stderr)
        else:
            print(
                f"  median {r['median_round_s']} s/round, p90 {r['p90_round_s']}, "
                f"{r['effective_gbps']} GB/s effective",
                file=sys.stderr,
            )
        return r

    default_workers = args.max_workers or server_defaults.max_workers
    for params in params_list:
        for clients in clients_list:
            r = case(clients, params, args.max_workers)
            if not r["skipped"]:
                rounds_out.append(r)
            else:
                skipped.append(r)
                n = largest_fitting_clients(clients, params, budget, args.max_workers)
                if args.substitute and n and "estimated peak" in r["reason"]:
                    sub = case(n, params, args.max_workers)
                    sub["substitute_for"] = {"clients": clients, "params": params}
                    r["substituted_by"] = {"clients": n, "params": params}
                    (skipped if sub["skipped"] else rounds_out).append(sub)
            if (
                args.variant_max_workers
                and clients > default_workers
                and not r["skipped"]
            ):
                v = case(clients, params, args.variant_max_workers)
                v["variant_of"] = {
                    "clients": clients,
                    "params": params,
                    "server_max_workers": default_workers,
                }
                v["variant_reason"] = (
                    f"{clients} clients > server.max_workers={default_workers}: the "
                    "same case with enough RPC threads for every client's long poll"
                )
                variants.append(v)
    result["rounds"] = rounds_out
    result["skipped"] = skipped
    result["variants"] = variants
    result["machine"]["loadavg_at_end"] = _loadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, args.out)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

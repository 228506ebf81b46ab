"""Uplink compression and local DP in federated rounds on Fashion-MNIST.

Every method runs through :func:`fedplat.sim.simulate`: the real round engine, the
real client SDK (whose innermost middleware clips, compresses and noises), and a
SQLite store. Bytes are the bytes each client actually uploaded, read back from the
store's participations (``bytes_up``), never computed from a formula.

Setup (``FULL``): Fashion-MNIST, MLP 784-200-200-10 (d = 199,210), 10 clients with an
IID split (6,000 images each; DGC is a data-parallel method and the paper's
experiments are IID), all clients every round. A round is ONE plain-SGD step (batch
32, client lr 1) on each client, which sends ``w_local - w_t = -g``: the paper's
per-step mode, where a round is an iteration of data-parallel SGD with a global batch
of 320. 1,000 rounds = 5.3 epochs. The server applies the learning rate ``lr_t``, a
cosine schedule from 0.1 to 0 over the run (``server_optimizer.lr_schedule``; the
paper's CIFAR recipe uses a cosine schedule), identical for every method, when an
update arrives: that is what ``torch.optim.SGD`` and the DGC reference optimizer do
(the velocity holds raw gradients; the current lr scales what is sent). An earlier
version scaled on the client (``-lr_t g``), which hands DGC's late-arriving
coordinates the larger lr of the round they were computed in.

Warm-up: the paper's densities 25%, 6.25%, 1.5625%, 0.39%, then 0.1%, 12 rounds per
stage, so warm-up is the first 48 rounds = 4.8% of training. The paper runs one stage
per epoch, i.e. 4 epochs of 90 (ImageNet, 4.4%) or 164 (CIFAR, 2.4%); we keep that
fraction of training rather than the literal epoch (one stage per epoch would put 750
of 1,000 rounds in warm-up). In an exploratory run with 5 local steps per round, a
one-epoch-per-stage warm-up (152 of 300 rounds) did not improve DGC's final
accuracy (0.854 vs 0.860) and cut the whole-run ratio from 175x to 30x.

Methods (``methods()``):

* ``dense``: identity compressor, server momentum 0.9 (FedAvgM, server lr ``lr_t``):
  dense momentum SGD on the averaged gradient, which is exactly what DGC reduces to at
  ``ratio=1`` (``u <- m u + g`` on every coordinate, sent and applied).
* ``dense_fedavg``: identity compressor, plain FedAvg (no momentum), for reference.
* ``dgc``: DGC at 0.1% density (99.9% sparsity) with momentum correction, momentum
  factor masking, sampled threshold and the paper's warm-up densities 25%, 6.25%,
  1.5625%, 0.39% (one stage per ``warmup_rounds_per_stage`` rounds), values sent as
  float16 (``fp16`` wrapper); biases travel dense as in the paper's code. The server
  applies the plain mean (momentum lives in the clients' compressors).
* ``dgc_fp32``: the same with float32 values (the paper's wire format).
* ``dgc_no_momentum_correction``: the ablation of the paper's Sec. 3.2 / Fig. 2a:
  raw updates accumulate locally (``v <- v + g``) and momentum is applied to the
  sparse aggregate on the server (FedAvgM 0.9); same wire format as ``dgc``.
* ``topk_ef``: exact top-k at 0.1% of the whole vector with error feedback, server
  momentum 0.9, no warm-up (Gradient Dropping / Stich et al. 2018).
* ``countsketch``: count-sketch of ``d / sketch_reduction`` buckets with a fresh
  per-round hash (shared seed), linear de-sketch ``R_t^T s`` on the coordinator
  (Song et al. 2023), server momentum 0.9 at a reduced server lr.
* ``countsketch_dp_eps{1,4,8}``: the same with local DP: each client clips its
  sketch to ``dp_clip_norm`` and adds Gaussian noise calibrated by Opacus's RDP
  accountant for ``rounds`` releases at ``(epsilon, 1e-5)``.

The full benchmark also runs ``dense`` and ``dgc`` over ``long_rounds`` (2,000)
rounds for each of ``long_seeds`` (3 seeds), reported under ``long_run`` with the
per-seed accuracies and the mean gap (``docs/compression.md`` also has 5,000-round
runs made with ``--methods dense,dgc --rounds 5000``).

Per method the JSON has ``{"method", "final_accuracy", "uplink_bytes",
"dense_uplink_bytes", "compression_ratio", "run_compression_ratio", "epsilon"}``:
``uplink_bytes`` is the sum of ``bytes_up`` over the run, ``dense_uplink_bytes`` is
``4 d`` per participation (what the ``dense`` run measurably sends),
``compression_ratio`` is the ratio over the rounds after DGC's warm-up (all rounds
for the other methods) and ``run_compression_ratio`` over the whole run. Details
(accuracy curve, per-round ratios, timings, encode+decode throughput at this model's
``d``) are under ``details``; throughput at 10M elements is in
``bench/results/compression_speed.json`` (``bench/compression_speed.py``).

Each method runs in its own process with ``torch.set_num_threads(1)``; ``--jobs``
processes run at once (default 2, the machine's 2 shared cores).

Usage::

    python -m bench.compression                  # full run, ~30-40 min on 2 cores
    python -m bench.compression --tiny --out X   # seconds: digits, 4 clients
    python -m bench.compression --methods dense,dgc --rounds 50   # exploring
    python -m bench.compression --markdown       # docs/compression.md's blocks
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import multiprocessing as mp
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from bench.common import check_out, round_progress, source_state
from bench.docs import add_doc_args, handle_doc_args
from bench.docs_compression import DOC, doc_blocks

RESULTS = Path(__file__).resolve().parent / "results" / "compression.json"
SPEED_RESULTS = Path(__file__).resolve().parent / "results" / "compression_speed.json"
SCHEMA_VERSION = 1
#: What ``uplink_bytes`` counts: ``"wire"``, every byte of an upload's messages
#: (header message, data chunks, gRPC's 5-byte framing), as the coordinator
#: records ``bytes_up`` (``fedplat.proto.streams.update_wire_bytes``). Results
#: written before that count have ``"payload"``: the encoded update's bytes only.
BYTE_COUNT = "wire"
METHOD_KEYS = (
    "method",
    "final_accuracy",
    "uplink_bytes",
    "dense_uplink_bytes",
    "compression_ratio",
    "run_compression_ratio",
    "epsilon",
)
DP_EPSILONS = (1.0, 4.0, 8.0)
DP_DELTA = 1e-5


@dataclass(frozen=True)
class Setup:
    """Everything shared by the methods of one benchmark run."""

    dataset: str = "fashion_mnist"
    hidden: tuple[int, ...] = (200, 200)
    clients: int = 10
    partition: str = "iid"
    rounds: int = 1000
    local_steps: int = 1
    batch_size: int = 32
    # Clients take their step(s) with ``client_lr`` (1: a round's update is minus
    # the minibatch gradient); the *server* applies the learning rate ``lr`` of the
    # global SGD, on the schedule ``lr_schedule`` ("cosine": lr (1 + cos(pi t /
    # rounds)) / 2 in round t + 1, as the paper's CIFAR runs; "constant"), at the
    # moment an update arrives, as torch.optim.SGD and DGC's reference optimizer
    # do. Scaling on the client instead would apply the early, larger lr to
    # values that DGC delivers hundreds of rounds late.
    client_lr: float = 1.0
    lr: float = 0.1
    lr_schedule: str = "cosine"
    server_momentum: float = 0.9
    eval_every: int = 100
    eval_max_examples: int | None = None
    dgc_ratio: float = 0.001
    warmup_rounds_per_stage: int = 12
    topk_ratio: float = 0.001
    sketch_reduction: int = 20
    # E||R^T R h||^2 ~ (1 + d/b)||h||^2: the global step must shrink (Song et al.):
    # the sketch methods' server lr is lr times this factor.
    sketch_lr_factor: float = 0.25
    # About the norm of one client's update -g early in training (||g|| ~ 0.5-1).
    dp_clip_norm: float = 1.0
    codec_repeats: int = 20
    seed: int = 0
    # Dense and DGC again over this many rounds (0: skip), reported under
    # "long_run": does DGC's gap to dense close with more training?
    long_rounds: int = 2000
    # Seeds of the long run (model init, data split, client batches); the
    # long-run goal is judged on the mean gap over these.
    long_seeds: tuple[int, ...] = (0, 1, 2)


FULL = Setup()
TINY = Setup(
    dataset="digits",
    hidden=(32,),
    clients=4,
    rounds=10,
    local_steps=1,
    batch_size=16,
    lr=0.1,
    eval_every=5,
    dgc_ratio=0.01,
    warmup_rounds_per_stage=1,
    topk_ratio=0.01,
    sketch_reduction=4,
    codec_repeats=2,
    long_rounds=12,
    long_seeds=(0, 1),
)
LONG_METHODS = ("dense", "dgc")


@dataclass(frozen=True)
class Method:
    """One row of the benchmark: a compressor, a server optimizer, optional DP.

    ``warmup_rounds`` rounds are excluded from the steady-state ratio.
    """

    name: str
    description: str
    compression: dict[str, Any]
    server_optimizer: dict[str, Any]
    privacy: dict[str, Any] = field(default_factory=dict)
    warmup_rounds: int = 0
    target_epsilon: float | None = None


def model_layout(setup: Setup) -> Any:
    """The :class:`fedplat.vectors.Layout` of the benchmark's model."""
    from fedplat.data import load_dataset
    from fedplat.models import create_model
    from fedplat.vectors import layout_of

    ds = load_dataset(setup.dataset, "test", fallback=False)
    model = create_model(
        "mlp", ds.input_shape, ds.num_classes, seed=setup.seed, hidden=setup.hidden
    )
    return layout_of(model)


def methods(setup: Setup, layout: Any) -> list[Method]:
    """The benchmark's methods for ``setup`` (see the module docstring)."""
    d = int(layout.numel)
    sched = {"lr": setup.lr, "lr_schedule": setup.lr_schedule}
    momentum = {"name": "fedavgm", "momentum": setup.server_momentum, **sched}
    plain = {"name": "fedavg", **sched}
    warmup = 4 * setup.warmup_rounds_per_stage  # four warm-up densities, Sec. 3.3
    dgc_params: dict[str, Any] = {
        "ratio": setup.dgc_ratio,
        "momentum": setup.server_momentum,
        "warmup_steps_per_stage": setup.warmup_rounds_per_stage,
    }
    no_mc = {**dgc_params, "momentum_correction": False}
    cols = math.ceil(d / setup.sketch_reduction)
    sketch = {"name": "countsketch", "params": {"rows": 1, "cols": cols}}
    sketch_opt = {**momentum, "lr": setup.lr * setup.sketch_lr_factor}
    out = [
        Method(
            "dense",
            "identity, FedAvgM 0.9 (= DGC at ratio 1)",
            {"name": "identity"},
            momentum,
        ),
        Method(
            "dense_fedavg",
            "identity, plain FedAvg (no momentum)",
            {"name": "identity"},
            plain,
        ),
        Method(
            "dgc",
            "fp16(DGC 0.1% + warm-up), plain mean at the server",
            {"name": "fp16", "params": {"inner": "dgc", "inner_params": dgc_params}},
            plain,
            warmup_rounds=warmup,
        ),
        Method(
            "dgc_fp32",
            "DGC 0.1% + warm-up, float32 values",
            {"name": "dgc", "params": dgc_params},
            plain,
            warmup_rounds=warmup,
        ),
        Method(
            "dgc_no_momentum_correction",
            "fp16(DGC 0.1% + warm-up, momentum_correction=false), FedAvgM 0.9",
            {"name": "fp16", "params": {"inner": "dgc", "inner_params": no_mc}},
            momentum,
            warmup_rounds=warmup,
        ),
        Method(
            "topk_ef",
            f"top-k {setup.topk_ratio:.2%} of all entries, error feedback, FedAvgM 0.9",
            {"name": "topk", "params": {"ratio": setup.topk_ratio}},
            momentum,
        ),
        Method(
            "countsketch",
            f"count-sketch 1x{cols} (d/{setup.sketch_reduction}), "
            f"linear de-sketch, FedAvgM 0.9 lr {setup.sketch_lr_factor} x",
            sketch,
            sketch_opt,
        ),
    ]
    for eps in DP_EPSILONS:
        out.append(
            Method(
                f"countsketch_dp_eps{eps:g}",
                f"count-sketch + local DP (clip {setup.dp_clip_norm}, eps {eps:g}, "
                f"delta {DP_DELTA:g} over {setup.rounds} rounds)",
                sketch,
                sketch_opt,
                privacy={
                    "mode": "local",
                    "epsilon": eps,
                    "delta": DP_DELTA,
                    "clip_norm": setup.dp_clip_norm,
                },
                target_epsilon=eps,
            )
        )
    return out


def run_config(setup: Setup, method: Method, workdir: Path) -> dict[str, Any]:
    """The run configuration (as for ``fedplat.server.config.parse_config``)."""
    return {
        "run": {
            "name": f"bench-{method.name}",
            "rounds": setup.rounds,
            "seed": setup.seed,
        },
        "model": {"name": "mlp", "params": {"hidden": list(setup.hidden)}},
        "data": {"dataset": setup.dataset, "eval_every": setup.eval_every},
        "evaluation": {"max_examples": setup.eval_max_examples},
        "selection": {
            "clients_per_round": setup.clients,
            "min_available": setup.clients,
            "quorum": setup.clients,
        },
        "deadlines": {"round_seconds": 600},
        "client_training": {
            "epochs": 1,
            "batch_size": setup.batch_size,
            "lr": setup.client_lr,
            "max_steps": setup.local_steps,
        },
        "server_optimizer": method.server_optimizer,
        "compression": method.compression,
        "privacy": method.privacy or {"mode": "none"},
        "store": {"url": str(workdir / "fedplat.db")},
        "checkpoints": {"dir": str(workdir / "ckpt"), "keep_last": 1},
        "server": {"insecure": True},
    }


def _client_builder(setup: Setup) -> Callable[[int, Any], Any]:
    from fedplat.client import Client

    from fedplat.reference.clients import ReferenceSpec, reference_parts

    def build(i: int, factory: Any) -> Client:
        parts = reference_parts(
            ReferenceSpec(
                dataset=setup.dataset,
                model="mlp",
                model_params={"hidden": list(setup.hidden)},
                num_partitions=setup.clients,
                partition_id=i,
                partition=setup.partition,
                seed=setup.seed,
            )
        )
        return Client(
            None,
            parts.model,
            parts.train,
            num_examples=parts.num_examples,
            connection_factory=factory,
            name=f"c{i}",
        )

    return build


def codec_timing(method: Method, layout: Any, setup: Setup) -> dict[str, Any]:
    """Median encode (client) and wire + decode (coordinator) time at this ``d``.

    The vector is Gaussian; DGC is first driven past its warm-up so the steady
    density is what is timed. Local DP (clip + noise) counts as encoding.
    """
    from fedplat.compression import Payload, create_compressor
    from fedplat.privacy import (
        GaussianMechanism,
        make_noise_generator,
        privatize_payload,
    )

    d = int(layout.numel)
    c = method.compression
    name, params = str(c["name"]), dict(c.get("params") or {})
    comp = create_compressor(name, layout=layout, **params)
    vec = torch.randn(d, generator=torch.Generator().manual_seed(setup.seed)) * 1e-3
    mech = GaussianMechanism(1.0, setup.dp_clip_norm) if method.privacy else None
    noise = make_noise_generator(setup.seed)
    rnd = 1
    for _ in range(method.warmup_rounds):
        comp.encode(vec, round=rnd, seed=7)
        rnd += 1
    enc, dec = [], []
    nbytes = 0
    for _ in range(setup.codec_repeats + 1):
        t0 = time.perf_counter()
        payload = comp.encode(vec, round=rnd, seed=7)
        if mech is not None:
            payload = privatize_payload(payload, mech, generator=noise)
        data = payload.to_bytes()
        t1 = time.perf_counter()
        out = comp.decode(
            Payload.from_bytes(data, expected_d=d, expected_seed=7, expected_round=rnd)
        )
        t2 = time.perf_counter()
        assert out.shape == (d,)
        if rnd > method.warmup_rounds + 1:  # first timed call is a warm-up
            enc.append(t1 - t0)
            dec.append(t2 - t1)
        nbytes = len(data)
        rnd += 1
    e, dd = statistics.median(enc), statistics.median(dec)
    return {
        "d": d,
        "payload_bytes": nbytes,
        "encode_ms": e * 1e3,
        "decode_ms": dd * 1e3,
        "encode_decode_MBps": 4 * d / (e + dd) / 1e6,
        "repeats": len(enc),
    }


def _round_rows(store: Any, run_id: str, d: int) -> list[dict[str, Any]]:
    rows = []
    for r in store.list_rounds(run_id):
        parts = [
            p
            for p in store.list_participations(run_id, r.number)
            if p.status == "succeeded"
        ]
        sent = sum(p.bytes_up for p in parts)
        rows.append(
            {
                "round": r.number,
                "status": r.status,
                "clients": len(parts),
                "bytes_up": sent,
                "dense_bytes": 4 * d * len(parts),
                "accuracy": r.accuracy,
            }
        )
    return rows


def run_method(
    setup: Setup, method: Method, workroot: str, threads: int = 1
) -> dict[str, Any]:
    """Run one method in this process; return its row and details."""
    torch.set_num_threads(threads)
    torch.manual_seed(setup.seed)  # local minibatch order (train_epochs' RNG)
    logging.basicConfig(level=logging.ERROR)
    from fedplat.server.config import parse_config

    from fedplat.sim import simulate
    from fedplat.store import Store

    workdir = Path(tempfile.mkdtemp(prefix=f"{method.name}-", dir=workroot))
    cfg = parse_config(run_config(setup, method, workdir), f"<{method.name}>")
    layout = model_layout(setup)
    d = int(layout.numel)
    t0 = time.perf_counter()

    progress = round_progress(method.name, setup.rounds)
    res = simulate(cfg, _client_builder(setup), setup.clients, on_round=progress)
    wall = time.perf_counter() - t0
    store = Store(cfg.store.url, migrate=False)
    try:
        rounds = _round_rows(store, res.run_id, d)
        engine_ratio = [
            m.value for m in store.list_metrics(res.run_id, "compression.ratio")
        ]
        eps = [m.value for m in store.list_metrics(res.run_id, "privacy.epsilon")]
        sigma = [
            m.value for m in store.list_metrics(res.run_id, "privacy.noise_multiplier")
        ]
    finally:
        store.close()
    shutil.rmtree(workdir, ignore_errors=True)
    completed = [r for r in rounds if r["status"] == "completed"]
    steady = [r for r in completed if r["round"] > method.warmup_rounds]
    up = sum(r["bytes_up"] for r in completed)
    dense = sum(r["dense_bytes"] for r in completed)
    steady_up = sum(r["bytes_up"] for r in steady)
    steady_dense = sum(r["dense_bytes"] for r in steady)
    per_round = [r["dense_bytes"] / r["bytes_up"] for r in steady if r["bytes_up"]]
    accs = [(r["round"], r["accuracy"]) for r in rounds if r["accuracy"] is not None]
    row = {
        "method": method.name,
        "final_accuracy": accs[-1][1] if accs else None,
        "uplink_bytes": up,
        "dense_uplink_bytes": dense,
        "compression_ratio": steady_dense / steady_up if steady_up else None,
        "run_compression_ratio": dense / up if up else None,
        "epsilon": eps[-1] if eps else None,
    }
    details = {
        "description": method.description,
        "compression": method.compression,
        "server_optimizer": method.server_optimizer,
        "privacy": method.privacy or None,
        "target_epsilon": method.target_epsilon,
        "delta": DP_DELTA if method.privacy else None,
        "noise_multiplier": sigma[-1] if sigma else None,
        "warmup_rounds": method.warmup_rounds,
        "rounds_completed": len(completed),
        "steady_rounds": len(steady),
        "steady_round_ratio_min": min(per_round) if per_round else None,
        "steady_round_ratio_max": max(per_round) if per_round else None,
        # Mean bytes of one upload after warm-up (every byte on the wire).
        "steady_bytes_per_upload": (
            steady_up / sum(r["clients"] for r in steady) if steady_up else None
        ),
        "first_round_ratio": (
            completed[0]["dense_bytes"] / completed[0]["bytes_up"]
            if completed and completed[0]["bytes_up"]
            else None
        ),
        # The engine's own per-round metric, a cross-check of the store's bytes.
        "engine_ratio_last_round": engine_ratio[-1] if engine_ratio else None,
        "accuracy_curve": accs,
        # One evaluation is noisy (+-1 point between evaluations late in a run).
        "mean_accuracy_last_3_evals": (
            statistics.fmean(a for _, a in accs[-3:]) if accs else None
        ),
        "wall_seconds": wall,
        "seconds_per_round": wall / max(1, len(rounds)),
        "codec": codec_timing(method, layout, setup),
    }
    return {"row": row, "details": details}


def _environment(jobs: int) -> dict[str, Any]:
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "processes": jobs,
        "threads_per_process": 1,
        "load_average_at_start": list(os.getloadavg()),
    }


def _speed_reference() -> dict[str, Any] | None:
    """Headline numbers of ``compression_speed.json`` (10M elements), if present."""
    if not SPEED_RESULTS.is_file():
        return None
    data = json.loads(SPEED_RESULTS.read_text())
    return {
        "file": "bench/results/compression_speed.json",
        "sampled_threshold_speedup_vs_topk": {
            s["distribution"]: s["speedup"] for s in data.get("selection", [])
        },
        "encode_decode_GBps_at_d": {
            f"{c['compressor']} (d={c['d']})": c["throughput_GBps"]
            for c in data.get("codecs", [])
        },
    }


def goals(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's goals, evaluated on the measured rows (None: row missing)."""

    def acc(name: str) -> float | None:
        r = rows.get(name)
        return None if r is None else r["final_accuracy"]

    dense, dgc, abl = acc("dense"), acc("dgc"), acc("dgc_no_momentum_correction")
    ratio = rows["dgc"]["compression_ratio"] if "dgc" in rows else None
    out: dict[str, Any] = {
        "dgc_accuracy_gap_points": (
            None if dense is None or dgc is None else 100 * (dense - dgc)
        ),
        "dgc_steady_ratio": ratio,
    }
    out["dgc_within_1_point"] = (
        None
        if out["dgc_accuracy_gap_points"] is None
        else out["dgc_accuracy_gap_points"] <= 1.0
    )
    out["dgc_ratio_at_least_270x"] = None if ratio is None else ratio >= 270.0
    out["ablation_gap_points"] = (
        None if dgc is None or abl is None else 100 * (dgc - abl)
    )
    out["ablation_worse"] = (
        None if out["ablation_gap_points"] is None else out["ablation_gap_points"] > 1.0
    )
    return out


def long_run_summary(
    setup: Setup, results: dict[tuple[str, int], dict[str, Any]]
) -> dict[str, Any]:
    """``long_run`` of the JSON: per-seed rows, accuracies, the mean gap."""
    seeds = [
        s for s in setup.long_seeds if all((n, s) in results for n in LONG_METHODS)
    ]
    first = setup.long_seeds[0]
    lnames = [n for n in LONG_METHODS if (n, first) in results]
    lrows = {n: results[(n, first)]["row"] for n in lnames}
    gl = goals(lrows)
    acc = {
        n: [results[(n, s)]["row"]["final_accuracy"] for s in seeds]
        for n in LONG_METHODS
    }
    gaps = [100 * (d - g) for d, g in zip(acc["dense"], acc["dgc"], strict=True)]
    ratios = [results[("dgc", s)]["row"]["compression_ratio"] for s in seeds]
    mean_gap = statistics.fmean(gaps) if gaps else None
    return {
        "byte_count": BYTE_COUNT,
        "rounds": setup.long_rounds,
        "eval_every": long_setup(setup).eval_every,
        # Rows of the first seed (same schema as the main table).
        "methods": [lrows[n] for n in lnames],
        "seeds": seeds,
        "final_accuracy_per_seed": acc,
        "final_accuracy_mean": {
            n: statistics.fmean(a) if a else None for n, a in acc.items()
        },
        "final_accuracy_std": {
            n: statistics.stdev(a) if len(a) > 1 else None for n, a in acc.items()
        },
        "dgc_gap_points_per_seed": gaps,
        "dgc_steady_ratio_per_seed": ratios,
        "goals": {
            **{
                k: gl[k]
                for k in (
                    "dgc_accuracy_gap_points",
                    "dgc_steady_ratio",
                    "dgc_within_1_point",
                    "dgc_ratio_at_least_270x",
                )
            },
            "dgc_mean_gap_points": mean_gap,
            "dgc_within_1_point_mean_over_seeds": (
                None if mean_gap is None else mean_gap <= 1.0
            ),
            "dgc_min_steady_ratio_over_seeds": min(ratios) if ratios else None,
        },
        "details": {
            f"{n}/seed{s}": results[(n, s)]["details"] for (n, s) in sorted(results)
        },
    }


def long_setup(setup: Setup) -> Setup:
    """The setup of the long run: ``long_rounds`` rounds, same evaluation count."""
    scale = max(1, setup.long_rounds // setup.rounds)
    return replace(setup, rounds=setup.long_rounds, eval_every=setup.eval_every * scale)


def write_results(
    path: Path,
    setup: Setup,
    tiny: bool,
    env: dict[str, Any],
    results: dict[str, dict[str, Any]],
    order: Sequence[str],
    started: float,
    finished: bool,
    long_results: dict[tuple[str, int], dict[str, Any]] | None = None,
    kept_long_run: dict[str, Any] | None = None,
) -> None:
    names = [n for n in order if n in results]
    rows = {n: results[n]["row"] for n in names}
    d = results[names[0]]["details"]["codec"]["d"] if names else None
    out = {
        "benchmark": "compression",
        "schema_version": SCHEMA_VERSION,
        "byte_count": BYTE_COUNT,
        "tiny": tiny,
        "complete": finished,
        "setup": {**asdict(setup), "d": d},
        "methods": [rows[n] for n in names],
        "goals": goals(rows),
        "details": {n: results[n]["details"] for n in names},
        "throughput_reference": _speed_reference(),
        "environment": {
            **env,
            **source_state(),
            "load_average_at_end": list(os.getloadavg()),
            "wall_seconds": time.perf_counter() - started,
        },
    }
    if long_results is not None:
        out["long_run"] = long_run_summary(setup, long_results)
    elif kept_long_run is not None:
        out["long_run"] = kept_long_run
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=2) + "\n")
    tmp.replace(path)


def kept_long_run_of(path: Path) -> dict[str, Any]:
    """The ``long_run`` section of an earlier result file, with what its bytes
    count (``"payload"`` when the file predates ``byte_count``)."""
    old = json.loads(path.read_text())
    if "long_run" not in old:
        raise SystemExit(f"{path} has no long_run section")
    return {"byte_count": old.get("byte_count", "payload"), **old["long_run"]}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--tiny",
        action="store_true",
        help="digits, 4 clients, 10 rounds: a smoke test (seconds)",
    )
    ap.add_argument("--out", type=Path, default=str(RESULTS))
    ap.add_argument(
        "--methods", default="", help="comma-separated subset of methods (default: all)"
    )
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="methods run at once, one process each (default 2; 1 with --tiny)",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a Setup field (exploration), e.g. lr=0.1",
    )
    ap.add_argument(
        "--keep-long-run",
        type=Path,
        default=None,
        metavar="JSON",
        help="run every method but not the long run, and copy JSON's long_run "
        "section (with its byte_count) into --out",
    )
    add_doc_args(ap, DOC)
    args = ap.parse_args(argv)
    if handle_doc_args(args, DOC, doc_blocks):
        return 0
    check_out(ap, args.out)
    kept_long_run = None
    if args.keep_long_run is not None:
        if args.methods:
            ap.error("--keep-long-run runs every method: drop --methods")
        kept_long_run = kept_long_run_of(args.keep_long_run)
    setup = TINY if args.tiny else FULL
    if args.rounds is not None:
        setup = replace(setup, rounds=args.rounds)
    for kv in args.set:
        key, _, raw = kv.partition("=")
        if key not in Setup.__dataclass_fields__:
            ap.error(f"unknown setup field {key!r}")
        val = json.loads(raw)
        overrides: dict[str, Any] = {key: tuple(val) if isinstance(val, list) else val}
        setup = replace(setup, **overrides)
    jobs = args.jobs or (1 if args.tiny else 2)
    layout = model_layout(setup)
    todo = methods(setup, layout)
    if args.methods:
        wanted = args.methods.split(",")
        unknown = sorted(set(wanted) - {m.name for m in todo})
        if unknown:
            ap.error(f"unknown methods {unknown}; valid: {[m.name for m in todo]}")
        todo = [m for m in todo if m.name in wanted]
    order = [m.name for m in todo]
    # The long run is part of the full benchmark, not of an explored subset.
    lsetup = long_setup(setup)
    long_todo = (
        []
        if args.methods or kept_long_run is not None or setup.long_rounds <= 0
        else [
            (replace(lsetup, seed=seed), m)
            for seed in setup.long_seeds
            for m in methods(lsetup, layout)
            if m.name in LONG_METHODS
        ]
    )
    jobs_list: list[tuple[str, Setup, Method]] = [
        # Longest first: the long runs, then the rest.
        *(("long", st, m) for st, m in long_todo),
        *(("main", setup, m) for m in todo),
    ]
    env = _environment(jobs)
    started = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    long_results: dict[tuple[str, int], dict[str, Any]] | None = (
        {} if long_todo else None
    )

    def write(done: bool) -> None:
        write_results(
            args.out,
            setup,
            args.tiny,
            env,
            results,
            order,
            started,
            done,
            long_results,
            kept_long_run,
        )

    def record(
        kind: str, st: Setup, name: str, res: dict[str, Any], done: bool
    ) -> None:
        if kind == "long":
            assert long_results is not None
            long_results[(name, st.seed)] = res
        else:
            results[name] = res
        write(done)

    # tmpfs when there is one: the store and checkpoints are written every round.
    root = "/dev/shm" if os.path.isdir("/dev/shm") else None
    workroot = tempfile.mkdtemp(prefix="fedplat-bench-compression-", dir=root)
    try:
        if jobs == 1:
            for kind, st, m in jobs_list:
                record(kind, st, m.name, run_method(st, m, workroot), False)
        else:
            ctx = mp.get_context("spawn")
            with ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
                futures: dict[Future[dict[str, Any]], tuple[str, Setup, str]] = {
                    pool.submit(run_method, st, m, workroot): (kind, st, m.name)
                    for kind, st, m in jobs_list
                }
                for fut in as_completed(futures):
                    kind, st, name = futures[fut]
                    record(kind, st, name, fut.result(), False)
    finally:
        shutil.rmtree(workroot, ignore_errors=True)
    write(True)
    for name in order:
        r = results[name]["row"]
        print(
            f"{name:28s} acc {r['final_accuracy']:.4f}  steady "
            f"{r['compression_ratio']:8.1f}x  run {r['run_compression_ratio']:8.1f}x"
            f"  eps {r['epsilon']}"
        )
    print(json.dumps(goals({n: results[n]["row"] for n in order}), indent=2))
    for (name, seed), res in sorted((long_results or {}).items()):
        r = res["row"]
        print(
            f"long run {name:10s} seed {seed} ({setup.long_rounds} rounds) acc "
            f"{r['final_accuracy']:.4f}  steady {r['compression_ratio']:8.1f}x"
        )
    if long_results:
        print(json.dumps(long_run_summary(setup, long_results)["goals"], indent=2))
    print(f"wrote {args.out} in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

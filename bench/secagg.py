"""Secure aggregation overhead: SecAgg+ vs plain summation, 10% of clients dropping.

One round, two ways, in the same process on the same client updates:

* **baseline** (no secure aggregation): each surviving client encodes its float32
  update as fedplat's dense payload (``fedplat.compression.wire``, the codec of an
  uncompressed upload) and the server parses each payload (size and finiteness
  checks) and adds it to a float32 running sum;
* **secure aggregation** (:mod:`fedplat.secagg`): the four-round protocol through
  :func:`fedplat.secagg.simulate.run_round`, every message encoded by its sender
  and decoded by its receiver, with ``dropout * clients`` clients dropping after
  sharing keys (they never send a masked input, so the server must rebuild their
  mask keys from their neighbours' shares and remove their pairwise masks).

Rows: ``secagg_plus`` (the headline: a random Harary graph of degree ``k`` and
threshold ``t`` from :func:`fedplat.secagg.harary_parameters` for the stated
dropout and corrupt rates, Hadamard rotation on), ``secagg_plus_no_rotation``
(same graph, fixed point on ``B = S``) and ``secagg_complete`` (every pair
masked, Bonawitz et al.'s original graph).

Client updates are real: every client trains a 784-1258-10 MLP (1,000,120
parameters) for one local epoch of SGD on its own 600 Fashion-MNIST training
images from one common initialisation, and clips its update to L2 norm ``S``
(``--tiny``: scikit-learn digits, a 64-40-10 MLP). Errors compare the unmasked
sum with the exact (float64) sum of the surviving clients' clipped updates:
``max_rel_error = ||got - exact||_inf / ||exact||_inf`` and the L2 analogue.

Overheads are ratios secure / baseline, medians over ``repeats`` interleaved
repetitions: per client (mean over the surviving clients of the seconds spent in
encoding, key agreement, sharing, masking, parsing) and at the coordinator (all
its seconds in the round); bytes per client (sent + received, all phases) and at
the coordinator (all bytes in and out). One thread (``torch.set_num_threads(1)``).

Usage::

    nice -n 10 python -m bench.secagg          # 100 clients, 1M params (~10 min)
    python -m bench.secagg --tiny              # 20 clients, digits (seconds)
    python -m bench.secagg --markdown          # the tables in docs/privacy.md
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # allow ``python bench/secagg.py``
    sys.path.insert(0, str(REPO))

import cryptography  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.common import check_out, environment, write_results  # noqa: E402
from bench.docs import with_source  # noqa: E402
from fedplat.compression.wire import Payload, dense_payload  # noqa: E402
from fedplat.data.datasets import load_dataset  # noqa: E402
from fedplat.data.partition import iid  # noqa: E402
from fedplat.models.training import train_epochs  # noqa: E402
from fedplat.models.zoo import MLP  # noqa: E402
from fedplat.privacy import clip_l2  # noqa: E402
from fedplat.secagg import SecAggConfig  # noqa: E402
from fedplat.secagg.simulate import PHASE_ORDER, SERVER, Meter, run_round  # noqa: E402

SCHEMA_VERSION = 1
RESULTS = REPO / "bench" / "results" / "secagg.json"
GOALS = {"max_rel_error": 1e-6, "time_overhead": 2.0, "bytes_overhead": 1.5}


@dataclass(frozen=True)
class Setup:
    dataset: str
    hidden: int
    clients: int
    dropout: float
    corrupt_rate: float
    clip_norm: float
    images_per_client: int
    local_epochs: int
    batch_size: int
    lr: float
    repeats: int
    seed: int


FULL = Setup("fashion_mnist", 1258, 100, 0.1, 0.05, 1.0, 600, 1, 32, 0.05, 3, 0)
TINY = Setup("digits", 40, 20, 0.1, 0.05, 1.0, 80, 1, 16, 0.05, 2, 0)
ROWS = (
    ("secagg_plus", True, True),
    ("secagg_plus_no_rotation", True, False),
    ("secagg_complete", False, True),
)


# ------------------------------------------------------------------ updates
def client_updates(setup: Setup) -> tuple[dict[int, torch.Tensor], dict[str, Any]]:
    """Each client's clipped update after local training from a common start."""
    torch.manual_seed(setup.seed)
    data = load_dataset(setup.dataset, "train")
    model = MLP(data.input_shape, data.num_classes, hidden=(setup.hidden,))
    start = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()
    parts = iid(len(data), setup.clients, seed=setup.seed)
    updates, norms = {}, []
    for c in range(setup.clients):
        local = copy.deepcopy(model)
        idx = parts[c][: setup.images_per_client]
        train_epochs(
            local,
            data.subset(idx),
            epochs=setup.local_epochs,
            batch_size=setup.batch_size,
            lr=setup.lr,
            seed=setup.seed * 1000 + c,
        )
        w = torch.cat([p.detach().reshape(-1) for p in local.parameters()])
        clipped = clip_l2(w - start, setup.clip_norm)
        norms.append(clipped.norm)
        updates[c] = clipped.vector
    info = {
        "model": f"MLP {math.prod(data.input_shape)}-{setup.hidden}-{data.num_classes}",
        "params": int(start.numel()),
        "update_norm_median": statistics.median(norms),
        "updates_clipped": sum(n > setup.clip_norm for n in norms),
    }
    return updates, info


# ------------------------------------------------------------------ rounds
def baseline_round(
    updates: dict[int, torch.Tensor], survivors: Sequence[int]
) -> dict[str, Any]:
    """Each survivor sends its float32 update; the server parses and sums."""
    client_s, wires = [], []
    for c in survivors:
        t = time.perf_counter()
        wires.append(dense_payload(updates[c]).to_bytes())
        client_s.append(time.perf_counter() - t)
    d = updates[survivors[0]].numel()
    t = time.perf_counter()
    total = np.zeros(d, dtype=np.float32)
    for wire in wires:
        values = Payload.from_bytes(wire, expected_d=d, expected_kinds=("dense",))
        np.add(total, values.values.numpy(), out=total)
    server_s = time.perf_counter() - t
    nbytes = [len(w) for w in wires]
    return {
        "client_seconds": statistics.mean(client_s),
        "coordinator_seconds": server_s,
        "client_bytes": statistics.mean(nbytes),
        "coordinator_bytes": sum(nbytes),
        "total": torch.from_numpy(total),
    }


def secagg_round(
    config: SecAggConfig,
    updates: dict[int, torch.Tensor],
    dropped: Sequence[int],
) -> dict[str, Any]:
    meter = Meter()
    result = run_round(config, updates, drop_after_shares=dropped, meter=meter)
    survivors = result.survivors
    phases = {}
    for phase in PHASE_ORDER:
        phases[phase] = {
            "client_seconds": statistics.mean(
                meter.seconds[phase, c] for c in survivors
            ),
            "coordinator_seconds": meter.seconds[phase, SERVER],
            "client_bytes_sent": statistics.mean(
                meter.sent[phase, c] for c in survivors
            ),
            "client_bytes_received": statistics.mean(
                meter.received[phase, c] for c in survivors
            ),
            "coordinator_bytes_sent": meter.sent[phase, SERVER],
            "coordinator_bytes_received": meter.received[phase, SERVER],
        }
    per_client = [sum(meter.seconds[p, c] for p in PHASE_ORDER) for c in survivors]
    return {
        "result": result,
        "phases": phases,
        "client_seconds": statistics.mean(per_client),
        "coordinator_seconds": sum(meter.seconds[p, SERVER] for p in PHASE_ORDER),
        "client_bytes": statistics.mean(
            sum(meter.sent[p, c] + meter.received[p, c] for p in PHASE_ORDER)
            for c in survivors
        ),
        "client_upload_bytes": statistics.mean(
            sum(meter.sent[p, c] for p in PHASE_ORDER) for c in survivors
        ),
        "coordinator_bytes": sum(
            meter.sent[p, SERVER] + meter.received[p, SERVER] for p in PHASE_ORDER
        ),
    }


# ------------------------------------------------------------------ metrics
def rel_errors(got: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    diff = got.double() - exact
    return (
        float(diff.abs().max() / exact.abs().max()),
        float(torch.linalg.vector_norm(diff) / torch.linalg.vector_norm(exact)),
    )


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def run_row(
    name: str,
    config: SecAggConfig,
    updates: dict[int, torch.Tensor],
    dropped: Sequence[int],
    repeats: int,
    log: Any,
) -> dict[str, Any]:
    survivors = [c for c in sorted(updates) if c not in set(dropped)]
    exact = torch.stack([updates[c].double() for c in survivors]).sum(0)
    base_runs, sec_runs = [], []
    for r in range(repeats):  # interleaved: both see the same machine load
        base_runs.append(baseline_round(updates, survivors))
        sec_runs.append(secagg_round(config, updates, dropped))
        log(
            f"{name} rep {r}: client {sec_runs[-1]['client_seconds']:.4f} s vs "
            f"{base_runs[-1]['client_seconds']:.5f} s, coordinator "
            f"{sec_runs[-1]['coordinator_seconds']:.3f} s vs "
            f"{base_runs[-1]['coordinator_seconds']:.3f} s"
        )
    result = sec_runs[-1]["result"]
    assert list(result.survivors) == survivors
    max_rel, l2_rel = rel_errors(result.total, exact)
    base_max, base_l2 = rel_errors(base_runs[-1]["total"], exact)
    fp = config.fixed_point
    t = {k: _median(sec_runs, k) for k in ("client_seconds", "coordinator_seconds")}
    tb = {k: _median(base_runs, k) for k in ("client_seconds", "coordinator_seconds")}
    last = sec_runs[-1]
    phases = {
        p: {k: float(statistics.median(s["phases"][p][k] for s in sec_runs)) for k in v}
        for p, v in last["phases"].items()
    }
    return {
        "name": name,
        "variant": "secagg+" if config.degree is not None else "secagg",
        "degree": config.max_neighbours,
        "threshold": config.threshold,
        "min_clients": config.min_clients,
        "rotation": config.rotate,
        "survivors": len(result.survivors),
        "dropped": list(result.dropped),
        "max_rel_error": max_rel,
        "l2_rel_error": l2_rel,
        "error_bound_l2": result.error_bound,
        "error_l2": float(torch.linalg.vector_norm(result.total - exact)),
        "quantization": {
            "ring": "Z_2^32",
            "ring_dim": fp.ring_dim,
            "bound_B": fp.bound,
            "levels_M": fp.levels,
            "scale_s": fp.scale,
        },
        "time_overhead": {
            "client": t["client_seconds"] / tb["client_seconds"],
            "coordinator": t["coordinator_seconds"] / tb["coordinator_seconds"],
        },
        "bytes_overhead": {
            "client": last["client_bytes"] / base_runs[-1]["client_bytes"],
            "client_upload": last["client_upload_bytes"]
            / base_runs[-1]["client_bytes"],
            "coordinator": last["coordinator_bytes"]
            / base_runs[-1]["coordinator_bytes"],
        },
        "seconds": {**t, "baseline": tb},
        "bytes": {
            "client": last["client_bytes"],
            "client_upload": last["client_upload_bytes"],
            "coordinator": last["coordinator_bytes"],
            "baseline_client": base_runs[-1]["client_bytes"],
            "baseline_coordinator": base_runs[-1]["coordinator_bytes"],
        },
        "phases": phases,
        "baseline_float32_sum": {"max_rel_error": base_max, "l2_rel_error": base_l2},
    }


def run(setup: Setup, log: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    updates, info = client_updates(setup)
    log(f"trained {setup.clients} clients in {time.perf_counter() - t0:.0f} s")
    n_drop = round(setup.dropout * setup.clients)
    rng = np.random.default_rng(setup.seed)
    dropped = sorted(int(c) for c in rng.choice(setup.clients, n_drop, replace=False))
    session = bytes(16)  # fixed: a seeded, repeatable graph
    rows = []
    for name, sparse, rotate in ROWS:
        cfg = SecAggConfig.create(
            dim=info["params"],
            clip_norm=setup.clip_norm,
            clients=setup.clients,
            dropout_rate=setup.dropout,
            corrupt_rate=setup.corrupt_rate,
            sparse=sparse,
            rotate=rotate,
            session=session,
        )
        rows.append(run_row(name, cfg, updates, dropped, setup.repeats, log))
    head = rows[0]
    met = {
        "max_rel_error": head["max_rel_error"] < GOALS["max_rel_error"]
        and head["l2_rel_error"] < GOALS["max_rel_error"],
        "time_overhead": max(head["time_overhead"].values()) < GOALS["time_overhead"],
        "bytes_overhead": max(head["bytes_overhead"].values())
        < GOALS["bytes_overhead"],
    }
    return {
        "clients": setup.clients,
        "params": info["params"],
        "dropout": n_drop / setup.clients,
        "max_rel_error": head["max_rel_error"],
        "l2_rel_error": head["l2_rel_error"],
        "time_overhead": head["time_overhead"],
        "bytes_overhead": head["bytes_overhead"],
        "degree": head["degree"],
        "threshold": head["threshold"],
        "goals": {**GOALS, "met": met},
        "updates": info,
        "dropped_clients": dropped,
        "rows": rows,
    }


# ------------------------------------------------------------------ docs
@with_source(RESULTS)
def render_markdown(results: dict[str, Any]) -> str:
    """The tables of docs/privacy.md, rendered from ``secagg.json`` (a test
    checks that the committed docs contain exactly this text)."""
    lines = [
        "| row | k | t | rotation | max rel. error | L2 rel. error "
        "| client s (plain) | client time | coordinator s (plain) "
        "| coordinator time | client bytes (plain) | client bytes "
        "| coordinator bytes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["rows"]:
        sec, by = r["seconds"], r["bytes"]
        t, b = r["time_overhead"], r["bytes_overhead"]
        lines.append(
            f"| `{r['name']}` | {r['degree']} | {r['threshold']} "
            f"| {'yes' if r['rotation'] else 'no'} "
            f"| {r['max_rel_error']:.2e} | {r['l2_rel_error']:.2e} "
            f"| {sec['client_seconds']:.4f} ({sec['baseline']['client_seconds']:.4f}) "
            f"| **{t['client']:.1f}x** "
            f"| {sec['coordinator_seconds']:.3f} "
            f"({sec['baseline']['coordinator_seconds']:.3f}) "
            f"| **{t['coordinator']:.1f}x** "
            f"| {by['client']:,.0f} ({by['baseline_client']:,}) "
            f"| **{b['client']:.3f}x** | {b['coordinator']:.3f}x |"
        )
    head = results["rows"][0]
    q = head["quantization"]
    lines += [
        "",
        f"Fixed point of `{head['name']}`: ring {q['ring']}, "
        f"d' = {q['ring_dim']:,} (d = {results['params']:,} padded), "
        f"B = {q['bound_B']:.6f} (S = {results['setup']['clip_norm']}), "
        f"M = {q['levels_M']:,}, L2 error bound {head['error_bound_l2']:.2e}, "
        f"measured L2 error {head['error_l2']:.2e}; "
        f"{results['updates']['updates_clipped']} of {results['clients']} updates "
        f"clipped (median norm {results['updates']['update_norm_median']:.3f}).",
        "",
        f"Per phase, `{head['name']}` (mean per surviving client; coordinator "
        "totals; seconds are medians over the repetitions):",
        "",
        "| phase | client s | coordinator s | client sent B | client received B "
        "| coordinator sent B | coordinator received B |",
        "|---|---|---|---|---|---|---|",
    ]
    for phase, v in head["phases"].items():
        lines.append(
            f"| {phase} | {v['client_seconds']:.4f} | {v['coordinator_seconds']:.3f} "
            f"| {v['client_bytes_sent']:,.0f} | {v['client_bytes_received']:,.0f} "
            f"| {v['coordinator_bytes_sent']:,.0f} "
            f"| {v['coordinator_bytes_received']:,.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="20 clients on digits")
    ap.add_argument("--out", type=Path, default=str(RESULTS))
    ap.add_argument(
        "--markdown",
        action="store_true",
        help="print the docs tables rendered from --out and exit",
    )
    args = ap.parse_args(argv)
    check_out(ap, args.out)
    if args.markdown:
        print(render_markdown(json.loads(args.out.read_text())), end="")
        return 0
    torch.set_num_threads(1)
    setup = TINY if args.tiny else FULL
    t0 = time.perf_counter()
    body = run(setup, lambda s: print(s, file=sys.stderr, flush=True))
    out = {
        "benchmark": "secagg",
        "schema_version": SCHEMA_VERSION,
        "tiny": args.tiny,
        **body,
        "setup": asdict(setup),
        "environment": environment(
            t0, numpy=np.__version__, cryptography=cryptography.__version__
        ),
    }
    write_results(args.out, out, t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Speed of the robust aggregation rules on CPU (2 threads) against Flower's.

Times every registered rule (``__call__``, i.e. including validation and the
per-client decisions) on one ``[n, d]`` float32 stack of Gaussian updates, against

(a) a plain ``x.mean(dim=0)`` of the same tensor: one read of the stack, the
    memory-bandwidth floor of any rule;
(b) Flower's reference numpy implementations in the same process
    (``flwr.server.strategy.aggregate``: ``aggregate_median``,
    ``aggregate_trimmed_avg``, ``aggregate_krum`` for Krum and Multi-Krum,
    ``aggregate_bulyan`` over Krum), when ``flwr`` is importable.

Timings are medians of several runs; fedplat rules and the mean are interleaved
round-robin so a burst of load from other jobs on the shared cores hits them
alike. Goals (issue 3): sort-based rules (median, trimmed mean, MeaMed) within 10x
of the mean, Krum family within 4x, every rule Flower also has >= 5x faster than
Flower's (Bulyan >= 30x).

Writes ``bench/results/aggregators_speed.json``::

    {"n", "d", "mean_s", "rules": {name: {"fedplat_s", "flower_s", "ratio_to_mean",
      ...}}, ...}

Usage::

    python -m bench.aggregators_speed [--n 50] [--d 1000000] [--repeats 5]
        [--no-flower] [--large]
    python -m bench.aggregators_speed --markdown   # docs/robustness.md's table

``--large`` adds ``n = 100, d = 10,000,000`` (4 GB; fedplat rules, Flower's median
and trimmed mean only) under the key ``"large"``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from fedplat.aggregators import create_aggregator
from fedplat.aggregators.kernels import fused_sort

from bench.common import check_out, write_results
from bench.docs import ROOT, add_doc_args, handle_doc_args

RESULTS = Path(__file__).resolve().parent / "results" / "aggregators_speed.json"
DOC = ROOT / "docs" / "robustness.md"

SORT_BASED = ("median", "trimmed_mean", "meamed")
KRUM_FAMILY = ("krum", "multi_krum")


def rule_params(n: int, f: int) -> dict[str, dict[str, Any]]:
    """Every registered rule with the settings timed (``f`` Byzantine)."""
    return {
        "fedavg": {},
        "median": {},
        "trimmed_mean": {"f": f},
        "meamed": {"f": f},
        "krum": {"f": f},
        "multi_krum": {"f": f},
        "bulyan": {"f": f},
        "geometric_median": {},
        "centered_clipping": {"tau": 10.0, "iterations": 3},
        "flag": {"m": 8},
    }


def flower_functions(x: torch.Tensor, f: int) -> dict[str, Callable[[], Any]] | None:
    """Flower's numpy aggregations over the same rows (one layer per client)."""
    try:
        from flwr.server.strategy import aggregate as fl
    except ImportError:
        return None
    rows = x.numpy()
    n = rows.shape[0]

    def results() -> list[tuple[list[Any], int]]:
        return [([rows[i]], 1) for i in range(n)]

    return {
        "median": lambda: fl.aggregate_median(results()),
        "trimmed_mean": lambda: fl.aggregate_trimmed_avg(results(), f / n),
        "krum": lambda: fl.aggregate_krum(results(), f, 0),
        "multi_krum": lambda: fl.aggregate_krum(results(), f, n - f),
        "bulyan": lambda: fl.aggregate_bulyan(
            results(), f, fl.aggregate_krum, to_keep=0
        ),
    }


def once(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench(
    n: int,
    d: int,
    f: int,
    repeats: int,
    flower: bool,
    flower_rules: tuple[str, ...] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=gen)
    params = rule_params(n, f)
    rules = {name: create_aggregator(name, **p) for name, p in params.items()}
    times: dict[str, list[float]] = {name: [] for name in rules}
    mean_times: list[float] = []
    for agg in rules.values():  # warm-up: allocator, lazy init, first calls
        agg(x)
        agg.load_state_dict({})  # centered clipping: start every run from zero
    # The first calls of the sort-based rules start compiling their fused kernels
    # in the background (fedplat.aggregators.kernels.fused_sort); time the steady state.
    tic = time.perf_counter()
    fused_sort.wait()
    compile_s = time.perf_counter() - tic
    for agg in rules.values():
        agg(x)
        agg.load_state_dict({})
    x.mean(dim=0)
    for r in range(repeats):
        for name, agg in rules.items():
            mean_times.append(once(lambda: x.mean(dim=0)))
            agg.load_state_dict({})
            times[name].append(once(functools.partial(agg, x)))
        mean_ms = 1000 * statistics.median(mean_times)
        log(f"repeat {r + 1}/{repeats}: mean {mean_ms:.1f} ms")
    mean_s = statistics.median(mean_times)
    flower_times: dict[str, list[float]] = {}
    fns = flower_functions(x, f) if flower else None
    if fns is not None:
        for name, fn in fns.items():
            if flower_rules is not None and name not in flower_rules:
                continue
            runs = 1 if name == "bulyan" else max(1, min(3, repeats))
            flower_times[name] = []
            for _ in range(runs):
                flower_times[name].append(once(fn))
                mean_times.append(once(lambda: x.mean(dim=0)))
            log(f"flower {name}: {statistics.median(flower_times[name]):.3f} s")
    out_rules: dict[str, Any] = {}
    for name in rules:
        s = statistics.median(times[name])
        fl_s = statistics.median(flower_times[name]) if name in flower_times else None
        out_rules[name] = {
            "fedplat_s": s,
            "flower_s": fl_s,
            "ratio_to_mean": s / mean_s,
            "speedup_vs_flower": None if fl_s is None else fl_s / s,
            "params": params[name],
            "fedplat_all_s": times[name],
            "flower_all_s": flower_times.get(name),
        }
        log(
            f"{name:18s} {1000 * s:9.1f} ms  x{s / mean_s:6.1f} mean"
            + ("" if fl_s is None else f"  flower {fl_s:7.3f} s  ({fl_s / s:5.1f}x)")
        )
    return {
        "n": n,
        "d": d,
        "f": f,
        "mean_s": mean_s,
        "mean_all_s": mean_times,
        "rules": out_rules,
        "goals": goals(out_rules),
        # Seconds spent waiting, after the warm-up calls, for the compiled
        # order-statistic kernels; which ones are in use.
        "fused_compile_wait_s": compile_s,
        "fused_kernels": sorted(str(k) for k in fused_sort.compiled_keys()),
    }


def goals(rules: dict[str, Any]) -> dict[str, bool]:
    out: dict[str, bool] = {}
    for name in SORT_BASED:
        out[f"{name}_within_10x_mean"] = rules[name]["ratio_to_mean"] <= 10
    for name in KRUM_FAMILY:
        out[f"{name}_within_4x_mean"] = rules[name]["ratio_to_mean"] <= 4
    for name, r in rules.items():
        if r["speedup_vs_flower"] is not None:
            need = 30 if name == "bulyan" else 5
            out[f"{name}_{need}x_faster_than_flower"] = r["speedup_vs_flower"] >= need
    return out


def main() -> None:
    started = time.perf_counter()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--d", type=int, default=1_000_000)
    ap.add_argument("--f", type=int, default=None, help="default n // 5")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-flower", action="store_true")
    ap.add_argument("--large", action="store_true", help="also n=100, d=1e7")
    ap.add_argument("--out", type=Path, default=str(RESULTS))
    add_doc_args(ap, DOC)
    args = ap.parse_args()
    from bench.docs_robustness import speed_blocks

    if handle_doc_args(args, DOC, speed_blocks):
        return
    check_out(ap, args.out)
    torch.set_num_threads(args.threads)
    f = args.n // 5 if args.f is None else args.f
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    result = bench(args.n, args.d, f, args.repeats, not args.no_flower)
    if args.large:
        result["large"] = bench(
            100,
            10_000_000,
            20,
            max(1, args.repeats // 2),
            not args.no_flower,
            flower_rules=("median", "trimmed_mean"),
        )
    result["seconds"] = time.perf_counter() - t0
    result["machine"] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
    }
    try:
        import flwr

        result["machine"]["flwr"] = flwr.__version__
    except ImportError:
        result["machine"]["flwr"] = None
    write_results(args.out, result, started)
    print(json.dumps(result["goals"], indent=2))


if __name__ == "__main__":
    main()

"""Robustness benchmark: the Karimireddy, He & Jaggi (ICLR 2022) table on Fashion-MNIST.

Reproduces the protocol of Karimireddy, He & Jaggi, "Byzantine-Robust Learning on
Heterogeneous Datasets via Bucketing" (ICLR 2022, arXiv 2006.09365), as run by their
code (epfml/byzantine-robust-noniid-optimizer, ``exp3.py``), with an in-process
federated loop:

- n = 25 clients, the last f = 5 Byzantine. The Fashion-MNIST training set is split
  label-sorted (extreme non-IID: 2 clients per class) among the 20 honest clients;
  Byzantine clients that need data (label flipping) train on IID shards, as the
  authors' ``DistributedSampler`` gives them.
- Every round each client computes a gradient of the *global* model on a batch of
  32 of its examples and sends its worker momentum ``m <- 0.9 m + g`` (the authors'
  ``MomentumWorker``); the server aggregates the 25 rows and steps
  ``w <- w - 0.01 * aggregate``. 600 rounds. Per-client gradients of all clients
  are computed in one batched pass (``torch.func.vmap``), so a round costs about
  one small forward/backward plus the aggregation.
- Attacks (``fedplat.aggregators.attacks``): sign flip (``-mean`` of the honest
  rows, ByzFL's; the paper's "bit flip" negates the attacker's own gradient),
  label flip (``y -> 9 - y``), mimic (warm-up 1), IPM (epsilon 0.1), ALIE (z as
  in the authors' code, Baruch et al.'s formula over the 20 honest clients: 0.25).
- Rules: mean, coordinate median, trimmed mean (f = 5), Krum (f = 5), RFA (8
  smoothed Weiszfeld steps, nu = 0.1, as the authors' code), centered clipping
  (3 iterations as the authors', tau = 100 for this model's update scale, see
  ``RULES``), Flag Aggregator (m = 8,
  lambda = 0, ``rescale="median_norm"`` so its output has the scale of a
  momentum row), each without and with bucketing (s = 2); 3 seeds; plus the
  no-attack FedAvg baseline (the 20 honest clients only).
- Model: the MLP of ``fedplat.models`` with one hidden layer of 64 units
  (d = 50,890), chosen so the 213-run grid fits in about an hour on 2 cores.

Writes ``bench/results/robustness.json``::

    {"no_attack_fedavg": acc, "rows": [{"rule", "bucketing", "attack",
      "accuracy_mean", "accuracy_std"}], ...}

and the results block of ``docs/robustness.md`` (``bench/docs_robustness.py``
renders it; ``--markdown`` prints every block of that page that comes from the
JSON, ``--write-docs`` rewrites them). ``--tiny`` runs a seconds-long smoke
version (used by ``tests/aggregators/test_robustness_smoke.py``); ``--estimate``
times a few rounds of every configuration and prints the projected duration of the
grid; ``--rules R --replace-rows`` re-runs only rule R's rows of an existing grid.

Usage::

    python -m bench.robustness [--tiny] [--estimate] [--rounds R] [--seeds S]
    python -m bench.robustness --rules centered_clipping --replace-rows
    python -m bench.robustness --markdown | --write-docs
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from bench.common import check_out, write_results
from bench.docs import add_doc_args, handle_doc_args
from bench.robustness_setup import (
    ATTACK_SPECS,
    ATTACKS,
    CUT_FLAGS,
    NO_BUCKETING,
    RULE_PRE,
    RULES,
    TINY,
    Setup,
    rule_params,
)
from bench.robustness_summary import Cell, Key, cells_of, summarize_cells
from bench.robustness_train import Data, Job, RunResult, load_data, run_jobs, run_one

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "robustness.json"
DOCS = ROOT / "docs" / "robustness.md"


def grid(setup: Setup) -> list[tuple[str, str, bool]]:
    return [
        (rule, attack, b)
        for attack in setup.attacks
        for rule in setup.rules
        for b in setup.bucketing
        if not (b and rule in NO_BUCKETING)
    ]


def summarize(
    setup: Setup, cells: dict[Key, Cell], baseline: list[float]
) -> dict[str, Any]:
    return {
        **summarize_cells(cells, baseline),
        "setup": {
            "dataset": setup.dataset,
            "n": setup.n,
            "f": setup.f,
            "rounds": setup.rounds,
            "batch_size": setup.batch_size,
            "lr": setup.lr,
            "worker_momentum": setup.momentum,
            "model": f"mlp hidden={list(setup.hidden)}",
            "bucket_size": setup.bucket_size,
            "accuracy": f"mean of the last {setup.eval_last} test evaluations, "
            f"one every {setup.eval_every} rounds",
            "seeds": list(setup.seeds),
            "rules": {
                k: dict(zip(("name", "params"), rule_params(setup, k), strict=True))
                for k in setup.rules
            },
            "rule_pre": {k: RULE_PRE[k] for k in setup.rules if k in RULE_PRE},
            "attacks": {
                a: None
                if ATTACK_SPECS[a] is None
                else dict(zip(("name", "params"), ATTACK_SPECS[a], strict=True))
                for a in setup.attacks
            },
            "flagged": "fraction of (row, round) pairs the rule flagged "
            + ", ".join(sorted(CUT_FLAGS))
            + ", mean over seeds",
            # Rows are aggregated unweighted (every client counts once, whatever
            # its example count), as the coordinator does for robust rules by
            # default (aggregator.weighted: null); the honest clients hold equal
            # shares, so for the plain mean weighting would change nothing.
            "weighted": False,
        },
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
    }


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def estimate(
    setup: Setup, data: Data, rounds: int, log: Callable[[str], None]
) -> float:
    """Time ``rounds`` rounds of every configuration; return the projected seconds
    of the full grid (all seeds, ``setup.rounds`` rounds each)."""
    total = 0.0
    configs: list[tuple[str | None, str | None, bool]] = [(None, None, False)]
    configs += [(r, a, b) for r, a, b in grid(setup)]
    cpu_total = 0.0
    for rule, attack, b in configs:
        run_one(setup, data, rule, attack, b, seed=0, rounds=1)  # warm-up
        cpu = time.process_time()
        r = run_one(setup, data, rule, attack, b, seed=0, rounds=rounds)
        cpu_per_round = (time.process_time() - cpu) / rounds
        per_round = r.seconds / rounds
        total += per_round * setup.rounds * len(setup.seeds)
        cpu_total += cpu_per_round * setup.rounds * len(setup.seeds)
        log(
            f"{rule or 'baseline'}/{attack}/{'bucketing' if b else 'plain'}: "
            f"{1000 * per_round:.1f} ms/round wall, {1000 * cpu_per_round:.1f} ms CPU"
        )
    log(f"projected CPU time of the grid: {cpu_total / 60:.1f} min")
    return total


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="seconds-long smoke grid")
    ap.add_argument(
        "--estimate",
        type=int,
        metavar="ROUNDS",
        default=0,
        help="time ROUNDS rounds per configuration and project the grid",
    )
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--seeds", type=int, help="number of seeds (0, 1, ...)")
    ap.add_argument("--rules", nargs="+", choices=list(RULES))
    ap.add_argument("--attacks", nargs="+", choices=ATTACKS)
    ap.add_argument("--dataset")
    ap.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes, one torch thread each (default 2, one per core; "
        "1 with --tiny)",
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--out", type=Path, default=str(RESULTS))
    ap.add_argument(
        "--replace-rows",
        action="store_true",
        help="run only --rules (no baseline) and replace their rows in the existing "
        "--out JSON, keeping every other row and the baseline",
    )
    ap.add_argument(
        "--docs",
        type=Path,
        default=None,
        help=f"markdown file to update (default {DOCS} for a full run)",
    )
    add_doc_args(ap, DOCS)
    args = ap.parse_args(argv)
    from bench.docs_robustness import (
        results_block,
        robustness_blocks,
        write_results_block,
    )

    if handle_doc_args(args, DOCS, robustness_blocks):
        return None
    check_out(ap, args.out)
    if args.replace_rows and not args.rules:
        ap.error("--replace-rows needs --rules")
    torch.set_num_threads(args.threads)
    setup = TINY if args.tiny else Setup()
    overrides: dict[str, Any] = {}
    if args.rounds is not None:
        overrides["rounds"] = args.rounds
    if args.seeds is not None:
        overrides["seeds"] = tuple(range(args.seeds))
    if args.rules:
        overrides["rules"] = tuple(args.rules)
    if args.attacks:
        overrides["attacks"] = tuple(args.attacks)
    if args.dataset:
        overrides["dataset"] = args.dataset
    if overrides:
        setup = Setup(**{**setup.__dict__, **overrides})
    workers = args.workers if args.workers is not None else (1 if args.tiny else 2)
    # Worker processes load their own copy; the parent needs one only in-process.
    data = load_data(setup) if workers <= 1 or args.estimate else None

    def log(msg: str) -> None:
        print(msg, flush=True)

    if args.estimate:
        assert data is not None
        secs = estimate(setup, data, args.estimate, log)
        log(
            f"projected grid time: {secs / 60:.1f} min "
            f"({len(grid(setup)) * len(setup.seeds) + len(setup.seeds)} runs)"
        )
        return None
    t0 = time.perf_counter()
    old = json.loads(args.out.read_text()) if args.replace_rows else None
    jobs: list[Job] = [] if old else [(None, None, False, seed) for seed in setup.seeds]
    jobs += [(r, a, b, seed) for r, a, b in grid(setup) for seed in setup.seeds]
    done: dict[Job, RunResult] = {}
    for job, r in run_jobs(setup, data, jobs, workers):
        done[job] = r
        rule, attack, b, seed = job
        log(
            f"[{len(done)}/{len(jobs)}] {rule or 'baseline'}/{attack}/"
            f"{'bucketing' if b else 'plain'} seed {seed}: {pct(r.accuracy)} "
            f"({r.seconds:.1f}s, aggregation {r.aggregate_seconds:.1f}s)"
        )
    results = {
        (r, a, b): Cell(
            [done[(r, a, b, seed)].accuracy for seed in setup.seeds],
            [done[(r, a, b, seed)].honest_flagged for seed in setup.seeds],
            [done[(r, a, b, seed)].byzantine_flagged for seed in setup.seeds],
            sum(
                done[(r, a, b, seed)].diverged_round is not None for seed in setup.seeds
            ),
        )
        for r, a, b in grid(setup)
    }
    if old is None:
        baseline = [done[(None, None, False, seed)].accuracy for seed in setup.seeds]
        summary = summarize(setup, results, baseline)
        summary["seconds"] = time.perf_counter() - t0
    else:
        summary = merge_rows(old, setup, results, time.perf_counter() - t0)
    write_results(args.out, summary, t0)
    docs = args.docs if args.docs is not None else (None if args.tiny else DOCS)
    if docs is not None:
        write_results_block(summary, docs, args.out)
    log(results_block(summary))
    return summary


def merge_rows(
    old: dict[str, Any],
    setup: Setup,
    results: dict[Key, Cell],
    seconds: float,
) -> dict[str, Any]:
    """``old`` (a full grid's summary) with the rows of ``results`` replaced;
    best rules and the goal recomputed; ``seconds`` adds this run's time."""
    if list(old["setup"]["seeds"]) != list(setup.seeds):
        raise SystemExit("--replace-rows must use the grid's seeds")
    kept = {k: c for k, c in cells_of(old["rows"]).items() if k[0] not in setup.rules}
    full = Setup(
        **{
            **setup.__dict__,
            "rules": tuple(old["setup"]["rules"]),
            "attacks": tuple(dict.fromkeys(r["attack"] for r in old["rows"])),
        }
    )
    merged = summarize(full, {**kept, **results}, old["no_attack_fedavg_accuracies"])
    merged["seconds"] = old["seconds"] + seconds
    merged["replaced_rows"] = {
        "rules": list(setup.rules),
        "seconds": seconds,
        "reason": "re-run with the rule parameters in setup.rules",
    }
    return merged


if __name__ == "__main__":
    main()

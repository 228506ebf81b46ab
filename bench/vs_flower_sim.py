"""fedplat's strategy versus Flower's own on Flower's simulation engine (issue 16).

The app is examples/flower (2NN MLP, Fashion-MNIST, Dirichlet(alpha) split over
the SuperNodes, local SGD), run by ``flwr run`` on a SuperLink in simulation
mode (Ray, one CPU per ClientApp) on 127.0.0.1, with its ``serverapp``
component pointed at ``fedplat_flower_app.compare``: for every rule that both
sides ship (FedAvg, Krum, Multi-Krum, coordinate median, trimmed mean, Bulyan)
the ServerApp trains once with :class:`fedplat.flower.FedplatStrategy` and once
with Flower's strategy, from the same seeded model, for the same rounds, with
dense updates (Flower's strategies cannot read compressed ones). Client
training is a pure function of (seed, round, partition), so the two runs of a
rule differ only by what their aggregation does.

Measured per rule:

* accuracy on the Fashion-MNIST test set after the last round, each side;
* aggregation time: the strategy's whole ``aggregate_train`` call (reply
  checks, decoding, the rule, the new model's arrays, metrics), timed in the
  ServerApp process. Every round, the replies of the driving run are also
  aggregated by the other side on its own copy, so both sides are timed on
  identical inputs in the same process (which one runs first alternates by
  round); ``aggregation_speedup`` = median Flower seconds / median fedplat
  seconds over all rounds of both runs.

Where the rules differ (stated in the JSON): Flower's MultiKrum averages the
selected models weighted by example counts (fedplat's uniformly); Flower's
Bulyan picks its ``n - 2f`` candidates with one Multi-Krum pass instead of
repeated Krum. Writes ``bench/results/vs_flower_sim.json``::

    {"rows": [{"rule", "robust", "fedplat_accuracy", "flower_accuracy",
               "accuracy_gap", "aggregation_speedup", ...}], "setup": {...},
     "goals": {...}}

Usage::

    nice -n 10 python -m bench.vs_flower_sim          # full (~15-20 min here)
    python -m bench.vs_flower_sim --tiny --out X.json  # the test's tiny mode
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # allow ``python bench/vs_flower_sim.py``
    sys.path.insert(0, str(REPO))

from bench.common import check_out, write_results  # noqa: E402
from bench.docs import add_doc_args, handle_doc_args, sourced  # noqa: E402
from examples.flower.launch import APP_DIR, FlowerRuntime  # noqa: E402

DEFAULT_OUT = REPO / "bench" / "results" / "vs_flower_sim.json"
#: Accuracies this close (absolute) count as equal.
EQUAL_ACCURACY = 0.005
#: The goal for robust rules.
SPEEDUP_GOAL = 5.0
DIFFERENCES = {
    "multi_krum": "Flower averages the selected models weighted by example "
    "counts; fedplat uniformly (Blanchard et al. 2017)",
    "bulyan": "Flower selects the n - 2f candidates with one Multi-Krum pass; "
    "fedplat by repeated Krum (El Mhamdi et al. 2018)",
}


@dataclass(frozen=True)
class Setup:
    supernodes: int
    rounds: int
    max_steps: int
    rules: tuple[dict[str, Any], ...]
    batch_size: int = 32
    lr: float = 0.05
    alpha: float = 0.5
    seed: int = 0


_F1 = {"f": 1}
FULL = Setup(
    supernodes=10,
    rounds=20,
    max_steps=25,
    rules=(
        {"name": "fedavg"},
        {"name": "krum", "params": _F1},
        {"name": "multi_krum", "params": _F1},
        {"name": "median"},
        {"name": "trimmed_mean", "params": _F1},
        {"name": "bulyan", "params": _F1},
    ),
)
TINY = Setup(
    supernodes=5,
    rounds=2,
    max_steps=5,
    rules=({"name": "fedavg"}, {"name": "median"}),
)


def compare_app(workdir: Path) -> Path:
    """A copy of examples/flower whose ServerApp is ``compare``."""
    app = workdir / "app"
    shutil.copytree(APP_DIR, app, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    toml = app / "pyproject.toml"
    text = toml.read_text()
    old = 'serverapp = "fedplat_flower_app.server_app:app"'
    if old not in text:
        raise RuntimeError(f"{toml}: no serverapp component to replace")
    toml.write_text(text.replace(old, old.replace("server_app", "compare")))
    return app


def run_config(setup: Setup, results: Path) -> str:
    rules = json.dumps(list(setup.rules), separators=(",", ":"))
    return " ".join(
        [
            f"num-server-rounds={setup.rounds}",
            f"num-nodes={setup.supernodes}",
            f"max-steps={setup.max_steps}",
            f"batch-size={setup.batch_size}",
            f"lr={setup.lr}",
            f"alpha={setup.alpha}",
            f"seed={setup.seed}",
            # A TOML literal string: the JSON's double quotes stay as they are.
            f"compare-rules='{rules}'",
            f'results-path="{results}"',
        ]
    )


def _times(run: dict[str, Any], side: str) -> list[float]:
    """Seconds of ``side``'s aggregate step in every round of ``run``."""
    key = "aggregation_s" if run["strategy"] == side else "peer_aggregation_s"
    return [float(r[key]) for r in run["rounds"]]


def rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per rule from the ServerApp's runs (one per rule and side)."""
    out = []
    for name in dict.fromkeys(r["rule"] for r in runs):
        by_side = {r["strategy"]: r for r in runs if r["rule"] == name}
        ours, theirs = by_side["fedplat"], by_side["flower"]
        acc = {k: float(v["rounds"][-1]["accuracy"]) for k, v in by_side.items()}
        t_ours = _times(ours, "fedplat") + _times(theirs, "fedplat")
        t_theirs = _times(ours, "flower") + _times(theirs, "flower")
        med_ours, med_theirs = statistics.median(t_ours), statistics.median(t_theirs)
        gap = acc["fedplat"] - acc["flower"]
        out.append(
            {
                "rule": name,
                "robust": name != "fedavg",
                "fedplat_accuracy": acc["fedplat"],
                "flower_accuracy": acc["flower"],
                "accuracy_gap": gap,
                "accuracy_equal": abs(gap) <= EQUAL_ACCURACY,
                "aggregation_speedup": med_theirs / med_ours,
                "fedplat_aggregation_s": med_ours,
                "flower_aggregation_s": med_theirs,
                "timed_rounds": len(t_ours),
                # The rule and pre-aggregators alone, inside fedplat's step.
                "fedplat_rule_s": statistics.median(
                    float(r["metrics"]["fedplat.rule-s"]) for r in ours["rounds"]
                ),
                "accuracy_by_round": {
                    side: [r["accuracy"] for r in run["rounds"]]
                    for side, run in by_side.items()
                },
                "difference": DIFFERENCES.get(name),
            }
        )
    return out


def goals(table: list[dict[str, Any]]) -> dict[str, Any]:
    robust = [r for r in table if r["robust"]]
    exact = [r for r in table if r["difference"] is None]
    worst = min(robust, key=lambda r: r["aggregation_speedup"]) if robust else None
    return {
        "equal_accuracy_rules": [r["rule"] for r in table if r["accuracy_equal"]],
        "equal_accuracy_where_rules_match": all(r["accuracy_equal"] for r in exact),
        "robust_speedup_goal": SPEEDUP_GOAL,
        "robust_speedup_min": None if worst is None else worst["aggregation_speedup"],
        "robust_speedup_min_rule": None if worst is None else worst["rule"],
        "robust_speedup_met": bool(robust)
        and all(r["aggregation_speedup"] >= SPEEDUP_GOAL for r in robust),
    }


def machine() -> dict[str, Any]:
    import flwr
    import ray
    import torch

    return {
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "torch": torch.__version__,
        "flwr": flwr.__version__,
        "ray": ray.__version__,
    }


def run(setup: Setup, out: Path, tiny: bool) -> dict[str, Any]:
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vs-flower-sim-") as tmp:
        work = Path(tmp)
        results = work / "runs.json"
        with FlowerRuntime("simulation", setup.supernodes, work) as rt:
            done = rt.run(
                run_config(setup, results), app=compare_app(work), timeout=3600
            )
            link_log = rt.log("superlink")
        if done.returncode != 0 or not results.is_file():
            raise RuntimeError(
                f"flwr run failed ({done.returncode}):\n{done.stdout[-4000:]}\n"
                f"{done.stderr[-4000:]}\n{link_log}"
            )
        raw = json.loads(results.read_text())
    table = rows(raw["runs"])
    data = {
        "benchmark": "vs_flower_sim",
        "tiny": tiny,
        "rows": table,
        "goals": goals(table),
        "setup": {
            **asdict(setup),
            "engine": "Flower simulation engine (flwr run, Ray backend), "
            "one CPU per ClientApp, SuperLink on 127.0.0.1",
            "app": "examples/flower with serverapp = fedplat_flower_app.compare",
            "model": "2NN MLP 784-200-200-10 (199,210 float32 parameters)",
            "data": "Fashion-MNIST train split, Dirichlet(alpha) over the SuperNodes; "
            "accuracy on the 10,000-image test split",
            "updates": "dense Flower arrays (no compression) for both sides",
            "timing": "whole aggregate_train call, ServerApp process, both sides "
            "on identical copies of each round's replies; medians over every round "
            "of both runs of a rule",
            "fused_warmup_s": raw["warmup_s"],
            "warmup": "fedplat's compiled order-statistics kernels are built once "
            "before the first round (compare.warm_up), as in aggregators_speed; "
            "fused_warmup_s is that one-off cost",
            "wall_s": time.perf_counter() - t0,
        },
        "machine": machine(),
    }
    write_results(out, data, t0)
    return data


def results_block(data: dict[str, Any]) -> str:
    """README.md's table and the numbers of its discussion."""
    lines = [
        "| rule | fedplat accuracy | Flower accuracy | aggregation speedup |",
        "|---|---|---|---|",
    ]
    for r in data["rows"]:
        lines.append(
            f"| {r['rule']} | {r['fedplat_accuracy']:.4f} "
            f"| {r['flower_accuracy']:.4f} | {r['aggregation_speedup']:.2f}x |"
        )
    g = data["goals"]
    slow = [
        r
        for r in data["rows"]
        if r["robust"] and r["aggregation_speedup"] < g["robust_speedup_goal"]
    ]
    fast = [
        r["rule"]
        for r in data["rows"]
        if r["robust"] and r["aggregation_speedup"] >= g["robust_speedup_goal"]
    ]
    lines += [
        "",
        f"Goal ({g['robust_speedup_goal']:g}x faster aggregation for every robust "
        f"rule): met for {', '.join(fast) or 'none'}, missed for "
        f"{', '.join(r['rule'] for r in slow) or 'none'}. For the missed rules "
        "fedplat's rule itself takes "
        f"{1000 * min(r['fedplat_rule_s'] for r in slow):.1f} to "
        f"{1000 * max(r['fedplat_rule_s'] for r in slow):.1f} ms of a "
        f"{1000 * min(r['fedplat_aggregation_s'] for r in slow):.1f} to "
        f"{1000 * max(r['fedplat_aggregation_s'] for r in slow):.1f} ms step "
        f"({data['setup']['model']}, {data['setup']['supernodes']} SuperNodes).",
    ]
    return "\n".join(lines)


DOC = REPO / "README.md"


def doc_blocks() -> dict[str, str]:
    """The generated block of README.md, from the committed results."""
    block = results_block(json.loads(DEFAULT_OUT.read_text()))
    return {"vs-flower-sim": sourced(block, DEFAULT_OUT)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="2 rules, 5 nodes, 2 rounds")
    ap.add_argument("--out", type=Path, default=str(DEFAULT_OUT))
    add_doc_args(ap, DOC)
    args = ap.parse_args(argv)
    if handle_doc_args(args, DOC, doc_blocks):
        return 0
    check_out(ap, args.out)
    data = run(TINY if args.tiny else FULL, args.out, args.tiny)
    print(json.dumps({"goals": data["goals"]}, indent=2))
    for r in data["rows"]:
        print(
            f"{r['rule']:>13}  fedplat {r['fedplat_accuracy']:.4f}  "
            f"flower {r['flower_accuracy']:.4f}  speedup "
            f"{r['aggregation_speedup']:.1f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

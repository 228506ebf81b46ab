"""``fedplat demo`` twice with one seed: its result, and whether it repeats.

Setup: the demo as ``make demo`` runs it (10 client processes, Fashion-MNIST,
Dirichlet(0.5), 20 rounds of FedAvg over TLS on 127.0.0.1, seed 0), run twice
one after the other in fresh work directories. The clients' uploads race, so
they reach the coordinator in a different order each time; the coordinator's
running sum is float64 (server/accumulator.py), so the two runs must agree on
every round's accuracy to 4 digits. ``--tiny``: 3 clients, 2 rounds.

Writes ``bench/results/demo.json``: ``{"runs": [<demo.json of run 1>, <of run
2>], "final_accuracy", "same_to_4_digits", "max_round_difference", ...}``.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import check_out, environment, tiny_parser, write_results
from bench.docs import ROOT, add_doc_args, handle_doc_args
from fedplat.demo import DemoArgs, run_demo

OUT = Path(__file__).resolve().parent / "results" / "demo.json"
DOC = ROOT / "README.md"


def doc_blocks() -> dict[str, str]:
    """The README's sentence on the demo's result, from the committed JSON."""
    res = json.loads(OUT.read_text())
    first, second = res["final_accuracy"]
    env = res["environment"]
    same = "the same" if res["same_to_4_digits"] else "NOT the same"
    return {
        "demo-result": (
            f"`bench/results/demo.json` (commit {env['commit'][:7]}: final test "
            f"accuracy {first:.4f} and {second:.4f} after {res['setup']['rounds']} "
            f"rounds, {same} in every round to 4 digits; largest difference "
            f"{res['max_round_difference']:.1e})."
        )
    }


def _once(args: DemoArgs) -> dict[str, Any]:
    rc = run_demo(args)
    if rc != 0:
        raise SystemExit(f"demo run failed (exit {rc}); see {args.workdir}/logs")
    assert args.output is not None
    result: dict[str, Any] = json.loads(Path(args.output).read_text())
    return result


def main() -> int:
    ap = tiny_parser(__doc__, OUT)
    ap.add_argument("--seed", type=int, default=0)
    add_doc_args(ap, DOC)
    a = ap.parse_args()
    if handle_doc_args(a, DOC, doc_blocks):
        return 0
    check_out(ap, a.out)
    started = time.perf_counter()
    clients, rounds = (3, 2) if a.tiny else (10, 20)
    runs = []
    with tempfile.TemporaryDirectory(prefix="fedplat-bench-demo-") as tmp:
        for i in range(2):
            work = Path(tmp) / f"run{i}"
            runs.append(
                _once(
                    DemoArgs(
                        clients=clients,
                        rounds=rounds,
                        seed=a.seed,
                        workdir=str(work),
                        output=str(work / "demo.json"),
                    )
                )
            )
    first, second = (r["accuracy_per_round"] for r in runs)
    diffs = [abs(x - y) for x, y in zip(first, second, strict=True)]
    same = all(f"{x:.4f}" == f"{y:.4f}" for x, y in zip(first, second, strict=True))
    results = {
        "benchmark": "demo",
        "tiny": a.tiny,
        "setup": {
            "clients": clients,
            "rounds": rounds,
            "seed": a.seed,
            "partition": "dirichlet(0.5)",
            "runs": "2, one after the other, fresh work directories",
        },
        "runs": runs,
        "final_accuracy": [r["final_accuracy"] for r in runs],
        "max_round_difference": max(diffs),
        "same_to_4_digits": same,
        "goal": "the same seed gives the same accuracy to 4 digits in every round",
        "goal_met": same,
        "environment": environment(started),
    }
    write_results(a.out, results, started)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

"""Disrupted peer-to-peer learning (Palmieri et al. 2023).

Fashion-MNIST, Barabasi-Albert graph N = 100, m = 2, IID shares (600 examples per
node), 1 local epoch of SGD per round, DecAvg mixing, 60 rounds. After round 20
the top 10 / 20 / 30% of nodes by degree are removed, once losing their data and
once as relay-only nodes that never held data; random removal of the same number
of nodes is the control. Writes ``bench/results/gossip_disruption.json``::

    {"rows": [{"removed_fraction", "removal", "with_data", "final_mean_accuracy",
               "final_min_accuracy", "components"}, ...],
     "baseline_accuracy": ..., "setup": {...what was run, timings...}}

Accuracies are over the nodes alive at the end, on the whole test split;
``components`` counts connected components of the final live graph.

Usage::

    python -m bench.gossip_disruption            # the full grid (13 runs)
    python -m bench.gossip_disruption --time-only --rounds 5   # time one run
    python -m bench.gossip_disruption --fractions 0.1 0.3 --removals degree
    python -m bench.gossip_disruption --markdown   # docs/gossip.md's block
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import check_out, write_results
from bench.docs import ROOT, add_doc_args, handle_doc_args, sourced
from fedplat.gossip.network import NetworkState
from fedplat.gossip.scenario import Scenario, parse_scenario
from fedplat.gossip.setup import NodeData, load_node_data
from fedplat.gossip.sim import GossipSimulation, SimResult

RESULTS = Path(__file__).resolve().parent / "results" / "gossip_disruption.json"
DOC = ROOT / "docs" / "gossip.md"


def scenario(
    *,
    rounds: int,
    nodes: int,
    seed: int,
    hidden: int,
    lr: float,
    at: int,
    dataset: str = "fashion_mnist",
    fraction: float | None = None,
    removal: str = "degree",
    with_data: bool = True,
) -> Scenario:
    events: list[dict[str, Any]] = []
    if fraction is not None:
        events.append(
            {
                "round": at,
                "action": "remove_nodes",
                "with_data": with_data,
                "target": {"by": removal, "fraction": fraction},
            }
        )
    tag = (
        "baseline"
        if fraction is None
        else (f"{removal}-{int(fraction * 100)}-{'data' if with_data else 'relay'}")
    )
    return parse_scenario(
        {
            "name": f"gossip-disruption-{tag}",
            "rounds": rounds,
            "seed": seed,
            "topology": {"kind": "barabasi_albert", "n": nodes, "m": 2},
            "data": {
                "dataset": dataset,
                "partition": "iid",
                "test_examples": 1000,
                "final_test_examples": None,
            },
            "model": {"name": "mlp", "params": {"hidden": [hidden]}},
            "training": {"epochs": 1, "batch_size": 32, "lr": lr},
            "mixing": {"rule": "decavg"},
            "eval": {"every": 5},
            "events": events,
        }
    )


def run_one(s: Scenario, full: NodeData) -> SimResult:
    # Relays hold no data: reuse the loaded shares, emptied for them.
    relay = NetworkState(s).relay
    empty = full.train[0].subset([])
    data = NodeData(
        [empty if i in relay else d for i, d in enumerate(full.train)], full.test
    )
    return GossipSimulation(s, data=data).run()


def _pt(x: float) -> str:
    return f"{100 * x:.1f}"


def results_block(res: dict[str, Any]) -> str:
    """The table and the numbers docs/gossip.md's findings rest on."""
    base = res["baseline_accuracy"]
    st = res["setup"]
    rows = {
        (r["removal"], r["removed_fraction"], r["with_data"]): r for r in res["rows"]
    }
    fracs = sorted({r["removed_fraction"] for r in res["rows"]})
    kinds = [
        k for k in ("degree", "betweenness", "random") if (k, fracs[0], True) in rows
    ]
    lines = [
        f"{len(res['rows']) + 1} runs, seed{'s' if len(st['seeds']) > 1 else ''} "
        f"{', '.join(map(str, st['seeds']))}, "
        f"{st['seconds_total']:,.0f} s for the whole grid on the shared machine "
        f"(per run {min(st['seconds_per_run'].values()):.0f}-"
        f"{max(st['seconds_per_run'].values()):.0f} s, {st['threads']} torch "
        "thread).",
        "",
        "| removed | how | with data: mean / min acc. | relay-only: mean / min acc. "
        "| components |",
        "|---|---|---|---|---|",
        f"| 0% (baseline) | - | {_pt(base)} / {_pt(st['baseline_min_accuracy'])} "
        f"| - | {st['baseline_components']} |",
    ]
    for kind in kinds:
        for f in fracs:
            a, b = rows[(kind, f, True)], rows[(kind, f, False)]
            comps = sorted({a["components"], b["components"]})
            lines.append(
                f"| {f:.0%} | {'top ' if kind != 'random' else ''}{kind} "
                f"| {_pt(a['final_mean_accuracy'])} / {_pt(a['final_min_accuracy'])} "
                f"| {_pt(b['final_mean_accuracy'])} / {_pt(b['final_min_accuracy'])} "
                f"| {'-'.join(map(str, comps))} |"
            )

    def cost(kind: str) -> tuple[float, float]:
        c = [
            100 * (base - r["final_mean_accuracy"])
            for (k, _, _), r in rows.items()
            if k == kind
        ]
        return min(c), max(c)

    def comps(kind: str) -> str:
        c = [r["components"] for (k, _, _), r in rows.items() if k == kind]
        return f"{min(c)}-{max(c)}"

    data_diff = max(
        100
        * abs(
            rows[(k, f, True)]["final_mean_accuracy"]
            - rows[(k, f, False)]["final_mean_accuracy"]
        )
        for k in kinds
        for f in fracs
    )
    hub_lo, hub_hi = cost("degree")
    rnd_lo, rnd_hi = cost("random")
    worst = min(
        r["final_min_accuracy"] for (k, _, _), r in rows.items() if k == "degree"
    )
    top = rows[("degree", fracs[-1], True)]
    lines += [
        "",
        f"- Same nodes removed with their data or as relays: the final mean accuracy "
        f"differs by at most {data_diff:.2f} points.",
        f"- Removing the top-degree nodes leaves {comps('degree')} components and "
        f"costs {hub_lo:.2f}-{hub_hi:.2f} points of mean accuracy; removing as many "
        f"random nodes leaves {comps('random')} components and costs "
        f"{rnd_lo:.2f}-{rnd_hi:.2f} points.",
        f"- With {fracs[-1]:.0%} of the hubs gone (with their data) the mean accuracy "
        f"is {_pt(top['final_mean_accuracy'])}% against {_pt(base)}%; the largest "
        f"drop in the grid is {hub_hi:.2f} points.",
        f"- The worst live node after hub removal ends at {_pt(worst)}%.",
    ]
    return "\n".join(lines)


def doc_blocks() -> dict[str, str]:
    """The generated blocks of docs/gossip.md, from the committed results."""
    block = results_block(json.loads(RESULTS.read_text()))
    return {"gossip-disruption": sourced(block, RESULTS)}


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--at", type=int, default=20, help="remove after this round")
    p.add_argument("--fractions", type=float, nargs="+", default=[0.1, 0.2, 0.3])
    p.add_argument(
        "--removals",
        nargs="+",
        default=["degree", "random"],
        choices=["degree", "betweenness", "random"],
    )
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--dataset", default="fashion_mnist", help="digits for a quick smoke run"
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--time-only",
        action="store_true",
        help="run the baseline only and print its time",
    )
    p.add_argument("--output", type=Path, default=str(RESULTS))
    add_doc_args(p, DOC)
    args = p.parse_args(argv)
    if handle_doc_args(args, DOC, doc_blocks):
        return 0
    check_out(p, args.output)
    torch.set_num_threads(args.threads)

    def make(
        fraction: float | None = None, removal: str = "degree", with_data: bool = True
    ) -> Scenario:
        return scenario(
            rounds=args.rounds,
            nodes=args.nodes,
            seed=args.seed,
            hidden=args.hidden,
            lr=args.lr,
            at=args.at,
            dataset=args.dataset,
            fraction=fraction,
            removal=removal,
            with_data=with_data,
        )

    t_load = time.perf_counter()
    base_s = make()
    full = load_node_data(base_s.data, args.nodes, args.seed)
    print(f"data loaded in {time.perf_counter() - t_load:.1f}s", flush=True)

    t0 = time.perf_counter()
    base = run_one(base_s, full)
    print(
        f"baseline: final mean accuracy {base.final_mean_accuracy:.4f} "
        f"({base.seconds:.1f}s for {args.rounds} rounds)",
        flush=True,
    )
    if args.time_only:
        return 0
    rows: list[dict[str, Any]] = []
    timings = {"baseline": round(base.seconds, 1)}
    for removal in args.removals:
        for frac in args.fractions:
            for with_data in (True, False):
                s = make(frac, removal, with_data)
                res = run_one(s, full)
                row = {
                    "removed_fraction": frac,
                    "removal": removal,
                    "with_data": with_data,
                    "final_mean_accuracy": res.final_mean_accuracy,
                    "final_min_accuracy": res.final_min_accuracy,
                    "components": res.final.components,
                }
                rows.append(row)
                timings[s.name] = round(res.seconds, 1)
                print(json.dumps(row), f"{res.seconds:.1f}s", flush=True)
    total = time.perf_counter() - t0
    out = {
        "rows": rows,
        "baseline_accuracy": base.final_mean_accuracy,
        "setup": {
            "paper": "Palmieri et al. 2023, arXiv 2310.02986",
            "dataset": f"{args.dataset} (IID shares of the training split)",
            "topology": f"barabasi_albert n={args.nodes} m=2 seed={args.seed}",
            "model": f"mlp, one hidden layer of {args.hidden}",
            "training": f"1 epoch SGD lr={args.lr} batch 32 per round",
            "mixing": "decavg (data-size weighted neighbourhood average)",
            "rounds": args.rounds,
            "removal_after_round": args.at,
            "relay_only": "with_data=false: the removed nodes never held data",
            "accuracy": "mean/min over live nodes at the end, full test split",
            "seeds": [args.seed],
            "seconds_per_run": timings,
            "seconds_total": round(total, 1),
            "threads": args.threads,
            "machine": f"{platform.machine()}, {os.cpu_count()} cpus (shared)",
            "baseline_components": base.final.components,
            "baseline_min_accuracy": base.final_min_accuracy,
        },
    }
    write_results(args.output, out, started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Scale: 10,000 simulated clients, the Ray backend, hierarchical aggregation.

Three parts, each in a fresh process of its own (so each peak RSS is its own):

- ``simulation_10k``: :func:`fedplat.sim.simulate` with 10,000 reference clients
  (:class:`fedplat.sim.clients.ReferencePopulation`: one shared model, data loaded
  on first use), 1% sampled per round, 20 rounds, FedAvg. Digits has 1,437
  training images, fewer than 10,000 clients, so this part trains the digits
  runs' model shape (an MLP with one hidden layer of 64) on Fashion-MNIST
  (6 images per client). Peer in the same run: one poll by every client, timed
  once after the last round, which is what the loop before this change paid
  twice per round (``old_loop_poll_s_per_round``).
- ``ray``: :func:`fedplat.sim.ray_backend.simulate_ray` on a local Ray
  (127.0.0.1, 2 CPUs, 2 client hosts) with 1,000 clients, all selected every
  round (60 Fashion-MNIST images each); peer: the in-process simulator on the
  same run, in the same process after Ray is shut down.
- ``hierarchical``: a root, 2 edge coordinators and 100 digits clients over gRPC
  on 127.0.0.1 (:func:`fedplat.testing.hierarchy.run_hierarchy`, every client an
  SDK thread) against the flat run (the 100 clients at the root): round time as
  the root records it, the root's bytes in (its participations' upload bytes),
  and the largest difference of the final models (FedAvg composes exactly).

Writes ``bench/results/scale.json``::

    {"setup": {...},
     "simulation_10k": {"clients", "rounds", "wall_s", "peak_rss_mb", ...},
     "ray": {"clients_per_round", "round_s", "driver_peak_rss_mb",
             "worker_peak_rss_mb", ...},
     "hierarchical": {"fan_in", "root_ingress_reduction", "round_s",
                      "flat_round_s", ...},
     "goals": {...}}

Run::

    nice -n 10 python -m bench.scale          # ~8 minutes on 2 shared cores
    python -m bench.scale --tiny --out /tmp/scale.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import check_out, environment, write_results

PARTS = ("simulation_10k", "ray", "hierarchical")
SIZES = {
    False: {"sim_clients": 10_000, "sim_rounds": 20, "ray_clients": 1_000,
            "ray_rounds": 3, "hier_clients": 100, "hier_rounds": 3},
    True: {"sim_clients": 400, "sim_rounds": 3, "ray_clients": 40,
           "ray_rounds": 2, "hier_clients": 12, "hier_rounds": 2},
}  # fmt: skip
EDGES = 2
GOALS = {"simulation_wall_s": 600.0, "simulation_peak_rss_mb": 4096.0}


def _run_file(tmp: Path, name: str, dataset: str, rounds: int, per_round: int) -> dict:
    return {
        "run": {"name": name, "rounds": rounds, "seed": 0},
        "model": {"name": "mlp", "params": {"hidden": [64]}},
        "data": {"dataset": dataset},
        "selection": {
            "clients_per_round": per_round,
            "min_available": per_round,
            "quorum": per_round,
        },
        "deadlines": {"round_seconds": 600},
        "client_training": {"epochs": 1, "batch_size": 16, "lr": 0.1},
        "admission": {"max_clients": 20_000},
        "store": {"url": str(tmp / f"{name}.db")},
        "checkpoints": {"dir": str(tmp / f"{name}-ckpt")},
        "server": {"address": "127.0.0.1:0", "insecure": True},
    }


def _peak_rss_mb() -> float:
    from fedplat.sim.ray_backend import peak_rss_mb

    return peak_rss_mb()


# ---------------------------------------------------------------- simulation
def _simulate_timed(
    cfg: Any, build: Any, n: int, after_last: Any = None
) -> tuple[Any, float, float, float]:
    """``simulate`` with timings: (result, wall, enrolment, mean round) seconds;
    ``after_last()`` runs after the last round and is not timed.

    Enrolment is measured, not derived: from the start to the moment the last
    client's ``enroll()`` returns (the simulator enrols every client before
    round 1). The mean round is over rounds 2.. (round 1 may include one-off
    costs: a client's first data copy, kernels' warm-up).
    """
    from fedplat.sim import simulate

    ends: list[float] = []
    untimed = [0.0]
    enrolled = [0.0]

    def timed_build(i: int, factory: Any) -> Any:
        client = build(i, factory)
        enroll = client.enroll

        def stamped(*a: Any, **kw: Any) -> Any:
            out = enroll(*a, **kw)
            enrolled[0] = time.perf_counter()
            return out

        client.enroll = stamped
        return client

    def on_round(o: Any) -> None:
        ends.append(time.perf_counter())
        if o.number == cfg.run.rounds and after_last is not None:
            after_last()
            untimed[0] = time.perf_counter() - ends[-1]

    t0 = time.perf_counter()
    res = simulate(cfg, timed_build, n, on_round=on_round)
    wall = time.perf_counter() - t0 - untimed[0]
    rounds = [b - a for a, b in itertools.pairwise(ends)] or [ends[0] - enrolled[0]]
    round_s = sum(rounds) / len(rounds)
    return res, wall, enrolled[0] - t0, round_s


def part_simulation(tmp: Path, tiny: bool) -> dict[str, Any]:
    from fedplat.server.config import parse_config

    from fedplat.sim.clients import ReferencePopulation

    s = SIZES[tiny]
    n, per_round = s["sim_clients"], max(1, s["sim_clients"] // 100)
    cfg = parse_config(
        _run_file(tmp, "sim", "fashion_mnist", s["sim_rounds"], per_round)
    )
    population = ReferencePopulation.of(cfg, n)
    clients: list[Any] = []
    sweep: dict[str, float] = {}

    def build(i: int, factory: Any) -> Any:
        clients.append(population.build(i, factory))
        return clients[-1]

    def poll_all() -> None:  # the peer: one poll by every client
        t = time.perf_counter()
        for c in clients:
            c.conn.get_task(0.0)
        sweep["s"] = time.perf_counter() - t

    res, wall, enrol_s, round_s = _simulate_timed(cfg, build, n, poll_all)
    return {
        "clients": n,
        "rounds": sum(r.completed for r in res.rounds),
        "wall_s": round(wall, 2),
        "peak_rss_mb": round(_peak_rss_mb(), 1),
        "clients_per_round": per_round,
        "enrol_s": round(enrol_s, 2),
        "round_s": round(round_s, 3),
        "old_loop_poll_s_per_round": round(2 * sweep["s"], 3),
        "final_accuracy": res.final_accuracy,
        "dataset": population.train_split().name,
    }


# ---------------------------------------------------------------- ray
def part_ray(tmp: Path, tiny: bool) -> dict[str, Any]:
    import ray
    from fedplat.server.config import parse_config

    from fedplat.sim.clients import ReferencePopulation
    from fedplat.sim.ray_backend import local_ray, ray_temp_dir, simulate_ray

    s = SIZES[tiny]
    n, rounds = s["ray_clients"], s["ray_rounds"]
    cfg = parse_config(_run_file(tmp, "ray", "fashion_mnist", rounds, n))
    ray_tmp = ray_temp_dir()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # our own Ray on 127.0.0.1
    local_ray(ray_tmp, num_cpus=2)
    try:
        run = simulate_ray(cfg, ReferencePopulation.of(cfg, n), n, hosts=2)
    finally:
        ray.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    driver = _peak_rss_mb()  # before the peer runs in this process
    peer = parse_config(_run_file(tmp, "inprocess", "fashion_mnist", rounds, n))
    _, _, inproc_enrol, inproc_round = _simulate_timed(
        peer, ReferencePopulation.of(peer, n), n
    )
    ray_round = run.rounds_seconds / len(run.result.rounds)
    return {
        "clients_per_round": n,
        "round_s": round(ray_round, 3),
        "driver_peak_rss_mb": round(driver, 1),
        "worker_peak_rss_mb": round(max(run.host_peak_rss_mb), 1),
        "coordinator_peak_rss_mb": round(run.coordinator_peak_rss_mb, 1),
        "host_peak_rss_mb": [round(x, 1) for x in run.host_peak_rss_mb],
        "hosts": run.hosts,
        "rounds": sum(r.completed for r in run.result.rounds),
        "enrol_s": round(run.enrol_seconds, 2),
        "inprocess_round_s": round(inproc_round, 3),
        "inprocess_enrol_s": round(inproc_enrol, 2),
        "speedup_vs_inprocess": round(inproc_round / ray_round, 2),
        "ray": ray.__version__,
    }


# ---------------------------------------------------------------- hierarchy
def part_hierarchical(tmp: Path, tiny: bool) -> dict[str, Any]:
    from fedplat.testing.hierarchy import reference_clients, run_hierarchy

    s = SIZES[tiny]
    n, rounds = s["hier_clients"], s["hier_rounds"]
    make = reference_clients(n)
    out = {}
    for edges in (EDGES, 0):
        d = tmp / f"hier-{edges}"
        d.mkdir()
        run = _run_file(d, "root", "digits", rounds, n)
        out[edges] = run_hierarchy(d, run, n, edges, make)
    hier, flat = out[EDGES], out[0]
    ratios = [
        f / h for f, h in zip(flat.root_bytes_in, hier.root_bytes_in, strict=True)
    ]
    return {
        "fan_in": n // EDGES,
        "root_ingress_reduction": round(sum(ratios) / len(ratios), 3),
        "round_s": round(sum(hier.round_seconds) / rounds, 3),
        "flat_round_s": round(sum(flat.round_seconds) / rounds, 3),
        "clients": n,
        "edges": EDGES,
        "rounds": rounds,
        "root_bytes_in_per_round": hier.root_bytes_in[-1],
        "flat_root_bytes_in_per_round": flat.root_bytes_in[-1],
        "max_abs_model_diff": float((hier.weights - flat.weights).abs().max()),
        "edge_summary_at_root": hier.edge_metrics,
    }


RUNNERS = {
    "simulation_10k": part_simulation,
    "ray": part_ray,
    "hierarchical": part_hierarchical,
}


def _one_part(name: str, tiny: bool, out: Path) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    with tempfile.TemporaryDirectory(prefix="fedplat-scale-") as tmp:
        result = RUNNERS[name](Path(tmp), tiny)
    out.write_text(json.dumps(result))


def _in_child(name: str, tiny: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "part.json"
        argv = [sys.executable, "-m", "bench.scale", "--part", name, "--out", str(out)]
        proc = subprocess.run([*argv, *(["--tiny"] if tiny else [])], check=False)
        if proc.returncode != 0:
            raise SystemExit(f"part {name} failed with status {proc.returncode}")
        return json.loads(out.read_text())  # type: ignore[no-any-return]


def _goals(results: dict[str, Any]) -> dict[str, Any]:
    goals: dict[str, Any] = {}
    sim = results.get("simulation_10k")
    if sim:
        goals["simulation_under_10_minutes"] = (
            sim["wall_s"] < GOALS["simulation_wall_s"]
        )
        goals["simulation_under_4_gb"] = (
            sim["peak_rss_mb"] < GOALS["simulation_peak_rss_mb"]
        )
    h = results.get("hierarchical")
    if h:
        goals["root_ingress_reduced_by_fan_in"] = (
            h["root_ingress_reduction"] >= h["fan_in"]
        )
    return goals


def markdown(res: dict[str, Any]) -> str:
    """docs/scale.md's table of the results (quoted there exactly)."""
    s, r, h = res["simulation_10k"], res["ray"], res["hierarchical"]
    return "\n".join(
        [
            "| part | setting | result |",
            "|---|---|---|",
            f"| simulation_10k | {s['clients']:,} clients, {s['clients_per_round']} "
            f"per round, {s['rounds']} rounds, {s['dataset']} | {s['wall_s']} s "
            f"wall ({s['enrol_s']} s enrolling, {s['round_s']} s per round), peak "
            f"RSS {s['peak_rss_mb']} MB; polling every client twice, as the loop "
            f"did before, would add {s['old_loop_poll_s_per_round']} s per round |",
            f"| ray | {r['clients_per_round']:,} clients per round, {r['hosts']} "
            f"client hosts, ray {r['ray']} | {r['round_s']} s per round (in-process "
            f"simulator: {r['inprocess_round_s']} s, {r['speedup_vs_inprocess']}x); "
            f"peak RSS driver {r['driver_peak_rss_mb']} MB, client host "
            f"{r['worker_peak_rss_mb']} MB, coordinator host "
            f"{r['coordinator_peak_rss_mb']} MB |",
            f"| hierarchical | {h['clients']} clients, {h['edges']} edges (fan-in "
            f"{h['fan_in']}), {h['rounds']} rounds | root's bytes in "
            f"{h['root_ingress_reduction']}x fewer than flat; {h['round_s']} s per "
            f"root round (flat: {h['flat_round_s']} s); largest model difference "
            f"{h['max_abs_model_diff']:.2g} |",
        ]
    )


def readme_line(res: dict[str, Any]) -> str:
    """The README's one line of results (quoted there exactly)."""
    s, r, h = res["simulation_10k"], res["ray"], res["hierarchical"]
    return (
        f"Measured here (`bench/results/scale.json`): {s['clients']:,} clients, "
        f"{s['rounds']} rounds in {s['wall_s']} s, peak RSS {s['peak_rss_mb']} MB; "
        f"Ray with {r['clients_per_round']:,} clients per round: {r['round_s']} s "
        f"per round; a root with {h['edges']} edges and {h['clients']} clients "
        f"receives {h['root_ingress_reduction']}x fewer bytes (fan-in {h['fan_in']})."
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="seconds-long smoke run")
    p.add_argument(
        "--parts", default=",".join(PARTS), help=f"comma-separated subset of {PARTS}"
    )
    p.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # a child
    p.add_argument("--out", "--output", dest="out", type=Path, default=None)
    p.add_argument(
        "--markdown",
        action="store_true",
        help="print the docs' table and the README's line from the JSON",
    )
    args = p.parse_args(argv)
    if args.markdown:
        res = json.loads(Path("bench/results/scale.json").read_text())
        print(markdown(res) + "\n\n" + readme_line(res))
        return 0
    if args.out is not None:
        check_out(p, args.out)
    if args.part:
        _one_part(args.part, args.tiny, args.out)
        return 0
    parts = [x for x in args.parts.split(",") if x]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        p.error(f"unknown parts {unknown}; choose from {PARTS}")
    started = time.perf_counter()
    results: dict[str, Any] = {}
    for name in parts:
        results[name] = _in_child(name, args.tiny)
        print(name, json.dumps(results[name]), flush=True)
    import ray

    out = {
        "setup": {
            **environment(started, ray=ray.__version__),
            "tiny": args.tiny,
            "sizes": SIZES[args.tiny],
            "model": "mlp, one hidden layer of 64 (the digits runs' model)",
            "aggregator": "fedavg (weighted), server optimizer fedavg lr 1",
            "deviation": "simulation_10k and ray train on Fashion-MNIST: digits "
            "has 1,437 training images, fewer than the clients",
        },
        **results,
        "goals": _goals(results),
    }
    for goal, met in out["goals"].items():
        if not met:
            print(f"GOAL MISSED: {goal}")
    target = args.out or (None if args.tiny else Path("bench/results/scale.json"))
    if target is not None:
        write_results(target, out, started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""User-level DP-FedAvg at fleet scale on Fashion-MNIST, dense and count-sketched.

Every row runs through :func:`fedplat.sim.simulate`: the real round driver with
Poisson sampling (``selection.sampling: poisson``), the real client SDK (signed
uploads, the uplink layer's count-sketch), the intake clipping each update (or
sketch) and the DP-FedAvg release of :mod:`fedplat.server.central_dp` (noise once on
the clipped sum, fixed denominator ``q N``, sketch sums noised in sketch space and
de-sketched once), epsilon from Opacus's RDP accountant as the coordinator stored
it (``privacy.epsilon`` of the last round), and a SQLite store. Uplink bytes are
read back from the store's participations (``bytes_up``: every byte of the upload
messages).

Setup (``FULL``): Fashion-MNIST; 10,000 training images held out as a
validation split (a seeded permutation); the other 50,000 split over 1,000
clients by a Dirichlet(0.5) label split (``fedplat.data.partition``, at least 10
images each); each client is sampled independently with probability
``q = 0.05`` per round (about 50 clients a round) for 300 rounds; delta = 1e-5.
Rows: no DP and epsilon 8, 4, 2 (noise multiplier calibrated by the accountant
for 300 sampled Gaussian releases at rate ``q``), each dense and with a
count-sketch of ``d / 20`` buckets (one hash row, fresh hashes every round).
The model, clip norm, client learning rate, local epochs and server optimizer
were chosen on the validation split (``--tune``; the grid and its scores are in
the JSON under ``tuning``); the rows report accuracy on the 10,000 test images.

Deviations from McMahan et al. (ICLR 2018): unweighted updates (every user's
weight 1, the paper's ``f_f`` estimator with ``w_k = 1``); the noise is Gaussian
from torch's generator seeded by the OS's CSPRNG; sketched rows clip the sketch
(not the update) at the coordinator, which bounds one client's effect on the
sketch sum by the clip norm for every hash (docs/privacy.md, section 3).

Usage::

    python -m bench.dp_fedavg                     # full run (see the JSON for time)
    python -m bench.dp_fedavg --tune              # the validation grid, then exit
    python -m bench.dp_fedavg --tiny --out X      # seconds: digits, 100 clients
    python -m bench.dp_fedavg --markdown          # the table in docs/privacy.md
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common import check_out, environment, round_progress, write_results
from bench.docs import with_source

RESULTS = Path(__file__).resolve().parent / "results" / "dp_fedavg.json"
EPSILONS: tuple[float | None, ...] = (None, 8.0, 4.0, 2.0)


@dataclass(frozen=True)
class Setup:
    """Everything shared by the rows of one benchmark run."""

    dataset: str = "fashion_mnist"
    clients: int = 1000
    alpha: float = 0.5
    min_size: int = 10
    validation: int = 10_000
    sample_rate: float = 0.05
    rounds: int = 300
    delta: float = 1e-5
    hidden: tuple[int, ...] = (32,)
    clip_norm: float = 0.5
    client_lr: float = 0.05
    local_epochs: int = 1
    batch_size: int = 10
    server_lr: float = 1.0
    server_momentum: float = 0.9
    sketch_reduction: int = 20
    eval_every: int = 25
    epsilons: tuple[float | None, ...] = EPSILONS
    seed: int = 0
    jobs: int = 2

    @property
    def hyper(self) -> dict[str, Any]:
        """The tuned hyperparameters."""
        return {
            "hidden": list(self.hidden),
            "clip_norm": self.clip_norm,
            "client_lr": self.client_lr,
            "local_epochs": self.local_epochs,
            "server_lr": self.server_lr,
            "server_momentum": self.server_momentum,
        }


FULL = Setup()
TINY = Setup(
    dataset="digits",
    clients=100,
    min_size=5,
    validation=300,
    sample_rate=0.2,
    rounds=40,
    hidden=(16,),
    clip_norm=0.3,
    client_lr=0.1,
    server_lr=0.3,
    eval_every=10,
    epsilons=(None, 8.0, 2.0),
    jobs=1,
)


# ----------------------------------------------------------------- data
@lru_cache(maxsize=2)
def _split(
    dataset: str, validation: int, clients: int, alpha: float, min_size: int, seed: int
) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """(validation indices, one index array per client) into the train split."""
    from fedplat.data import load_dataset, partition

    ds = load_dataset(dataset, "train", fallback=False)
    perm = np.random.default_rng(seed).permutation(len(ds))
    val, rest = perm[:validation], perm[validation:]
    labels = ds.y.numpy()[rest]
    parts = partition(
        "dirichlet", labels, clients, seed, alpha=alpha, min_size=min_size
    )
    return np.sort(val), tuple(rest[np.asarray(p, dtype=np.int64)] for p in parts)


def validation_split(
    dataset: str, validation: int, clients: int, alpha: float, min_size: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The held-out validation images ``(x [V, ...], y [V])`` (a ``data.eval``
    plug-in: tuning never looks at the test split)."""
    from fedplat.data import load_dataset

    ds = load_dataset(dataset, "train", fallback=False)
    val, _ = _split(dataset, validation, clients, alpha, min_size, seed)
    sub = ds.subset(val)
    return sub.x, sub.y


def _split_args(setup: Setup) -> dict[str, Any]:
    return {
        "dataset": setup.dataset,
        "validation": setup.validation,
        "clients": setup.clients,
        "alpha": setup.alpha,
        "min_size": setup.min_size,
        "seed": setup.seed,
    }


# ----------------------------------------------------------------- one row
@dataclass(frozen=True)
class Row:
    epsilon: float | None
    sketch: bool

    @property
    def name(self) -> str:
        eps = "no_dp" if self.epsilon is None else f"eps{self.epsilon:g}"
        return f"{eps}{'_sketch' if self.sketch else ''}"


def model_dim(setup: Setup) -> int:
    from fedplat.data import load_dataset
    from fedplat.models import create_model

    ds = load_dataset(setup.dataset, "test", fallback=False)
    m = create_model("mlp", ds.input_shape, ds.num_classes, hidden=list(setup.hidden))
    return sum(p.numel() for p in m.parameters())


def run_config(
    setup: Setup, row: Row, workdir: Path, evaluate: str = "test"
) -> dict[str, Any]:
    """The run configuration (as for ``fedplat.server.config.parse_config``)."""
    d = model_dim(setup)
    data: dict[str, Any] = {"dataset": setup.dataset, "eval_every": setup.eval_every}
    if evaluate == "validation":
        data.update(
            {
                "eval": "bench.dp_fedavg:validation_split",
                "eval_params": _split_args(setup),
            }
        )
    privacy: dict[str, Any] = {"mode": "none"}
    if row.epsilon is not None:
        privacy = {
            "mode": "central",
            "epsilon": row.epsilon,
            "delta": setup.delta,
            "clip_norm": setup.clip_norm,
            "population": setup.clients,
        }
    compression: dict[str, Any] = {"name": "identity"}
    if row.sketch:
        cols = max(1, d // setup.sketch_reduction)
        compression = {"name": "countsketch", "params": {"rows": 1, "cols": cols}}
    return {
        "run": {"name": f"dp-{row.name}", "rounds": setup.rounds, "seed": setup.seed},
        "model": {"name": "mlp", "params": {"hidden": list(setup.hidden)}},
        "data": data,
        "selection": {
            "sampling": "poisson",
            "rate": setup.sample_rate,
            "min_available": 1,
            "quorum": 1,
        },
        "deadlines": {"round_seconds": 600, "liveness_seconds": 3600},
        "client_training": {
            "epochs": setup.local_epochs,
            "batch_size": setup.batch_size,
            "lr": setup.client_lr,
        },
        "aggregator": {"name": "fedavg", "weighted": False},
        "server_optimizer": {
            "name": "fedavgm" if setup.server_momentum > 0 else "fedavg",
            "lr": setup.server_lr,
            "momentum": setup.server_momentum,
        },
        "compression": compression,
        "privacy": privacy,
        "store": {"url": str(workdir / "fedplat.db")},
        "checkpoints": {"dir": str(workdir / "ckpt"), "keep_last": 1},
        "server": {"insecure": True},
        "admission": {"enrol_burst": setup.clients + 10},
    }


def _client_builder(setup: Setup) -> Any:
    from fedplat.client import Client, FitResult

    from fedplat.data import load_dataset
    from fedplat.models import create_model
    from fedplat.models.training import train_epochs

    ds = load_dataset(setup.dataset, "train", fallback=False)
    _, parts = _split(**_split_args(setup))

    def build(i: int, factory: Any) -> Client:
        local = ds.subset(parts[i])
        model = create_model(
            "mlp", ds.input_shape, ds.num_classes, seed=setup.seed,
            hidden=list(setup.hidden),
        )  # fmt: skip

        def train(m: torch.nn.Module, config: Any) -> FitResult:
            res = train_epochs(
                m,
                local,
                epochs=int(config["epochs"]),
                batch_size=int(config["batch_size"]),
                lr=float(config["lr"]),
                seed=int(config["seed"]),
            )
            return FitResult(res.num_examples, {"train_loss": float(res.mean_loss)})

        return Client(
            None,
            model,
            train,
            num_examples=len(local),
            connection_factory=factory,
            name=f"c{i}",
        )

    return build


def run_row(
    setup: Setup, row: Row, workroot: str, evaluate: str = "test"
) -> dict[str, Any]:
    """Run one row in this process; its JSON row plus details."""
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.ERROR)
    from fedplat.server.config import parse_config

    from fedplat.sim import simulate
    from fedplat.store import Store

    workdir = Path(tempfile.mkdtemp(prefix=f"{row.name}-", dir=workroot))
    cfg = parse_config(run_config(setup, row, workdir, evaluate), f"<{row.name}>")
    t0 = time.perf_counter()

    progress = round_progress(row.name, setup.rounds)
    res = simulate(cfg, _client_builder(setup), setup.clients, on_round=progress)
    wall = time.perf_counter() - t0
    store = Store(cfg.store.url, migrate=False)
    try:
        record = store.get_run(res.run_id)
        rounds = store.list_rounds(res.run_id)
        bytes_up, sampled = 0, []
        for r in rounds:
            parts = store.list_participations(res.run_id, r.number)
            bytes_up += sum(p.bytes_up for p in parts)
            sampled.append(len(parts))
        eps = [m.value for m in store.list_metrics(res.run_id, "privacy.epsilon")]
        sigma = [
            m.value for m in store.list_metrics(res.run_id, "privacy.noise_multiplier")
        ]
        curve = [[r.number, r.accuracy] for r in rounds if r.accuracy is not None]
    finally:
        store.close()
        shutil.rmtree(workdir, ignore_errors=True)
    assert record is not None
    return {
        "epsilon_target": row.epsilon,
        "sketch": row.sketch,
        "final_accuracy": res.final_accuracy,
        "epsilon_spent": eps[-1] if eps else None,
        "uplink_bytes": bytes_up,
        "wall_s": wall,
        "details": {
            "name": row.name,
            "hyperparameters": setup.hyper,
            "evaluated_on": evaluate,
            "completed_rounds": sum(r.status == "completed" for r in rounds),
            "run_status": record.status,
            "noise_multiplier": sigma[-1] if sigma else None,
            "clients_per_round": {
                "mean": float(np.mean(sampled)) if sampled else 0.0,
                "min": min(sampled, default=0),
                "max": max(sampled, default=0),
            },
            "accuracy_curve": curve,
        },
    }


def _run_jobs(
    jobs: Sequence[tuple[Setup, Row]],
    processes: int,
    evaluate: str,
    on_done: Callable[[dict[int, dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run ``(setup, row)`` pairs, ``processes`` at a time; results in order.
    ``on_done`` sees the rows finished so far (by job index) after each one, so a
    run stopped early keeps what it completed."""
    workroot = tempfile.mkdtemp(prefix="dp-fedavg-")
    done: dict[int, dict[str, Any]] = {}

    def finished(i: int, row: dict[str, Any]) -> None:
        done[i] = row
        if on_done is not None:
            on_done(dict(done))

    try:
        if processes <= 1:
            for i, (s, r) in enumerate(jobs):
                finished(i, run_row(s, r, workroot, evaluate))
        else:
            ctx = mp.get_context("spawn")
            with ProcessPoolExecutor(processes, mp_context=ctx) as pool:
                futs = {
                    pool.submit(run_row, s, r, workroot, evaluate): i
                    for i, (s, r) in enumerate(jobs)
                }
                for f in as_completed(futs):
                    finished(futs[f], f.result())
        return [done[i] for i in range(len(jobs))]
    finally:
        shutil.rmtree(workroot, ignore_errors=True)


# ----------------------------------------------------------------- results
def goals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's goals, each with its numbers and whether it was met."""

    def acc(eps: float | None, sketch: bool) -> float | None:
        for r in rows:
            if r["epsilon_target"] == eps and r["sketch"] == sketch:
                return float(r["final_accuracy"])
        return None

    out: dict[str, Any] = {}
    base = acc(None, False)
    for eps, points in ((8.0, 5.0), (4.0, 8.0)):
        a = acc(eps, False)
        if base is not None and a is not None:
            gap = 100 * (base - a)
            out[f"eps{eps:g}_within_{points:g}_points"] = {
                "gap_points": gap,
                "met": gap <= points,
            }
    sketch_gaps = {}
    for eps in EPSILONS:
        a, s = acc(eps, False), acc(eps, True)
        if a is not None and s is not None:
            name = "no_dp" if eps is None else f"eps{eps:g}"
            sketch_gaps[name] = 100 * (a - s)
    if sketch_gaps:
        out["sketch_within_2_points"] = {
            "gap_points": sketch_gaps,
            "met": all(g <= 2.0 for g in sketch_gaps.values()),
        }
    return out


@with_source(RESULTS)
def render_markdown(results: dict[str, Any]) -> str:
    """The tables of docs/privacy.md, rendered from ``dp_fedavg.json`` (a test
    checks that the committed docs contain exactly this text)."""
    lines = [
        f"{results['clients']:,} clients, q = {results['sample_rate']:g}, "
        f"{results['rounds']} rounds, delta = {results['delta']:g}; accuracy on "
        "the 10,000 test images. Hyperparameters chosen on the validation split "
        "for each kind of row:",
        "",
        "| rows | MLP | d | clip norm | client lr | local epochs | server lr "
        "(momentum) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, h in results["setups"].items():
        hidden = "-".join(str(x) for x in h["hidden"])
        lines.append(
            f"| {name} | 784-{hidden}-10 | {h['d']:,} | {h['clip_norm']:g} | "
            f"{h['client_lr']:g} | {h['local_epochs']} | {h['server_lr']:g} "
            f"({h['server_momentum']:g}) |"
        )
    lines += [
        "",
        "| epsilon target | sketch | final accuracy | epsilon spent | noise "
        "multiplier | uplink bytes | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results["rows"]:
        eps = "no DP" if r["epsilon_target"] is None else f"{r['epsilon_target']:g}"
        spent = "-" if r["epsilon_spent"] is None else f"{r['epsilon_spent']:.3f}"
        z = r["details"]["noise_multiplier"]
        lines.append(
            f"| {eps} | {'d/20' if r['sketch'] else 'no'} | "
            f"{r['final_accuracy']:.4f} | {spent} | "
            f"{'-' if z is None else f'{z:.3f}'} | {r['uplink_bytes']:,} | "
            f"{r['wall_s']:.0f} |"
        )
    missing = results["setup"].get("rows_not_run")
    if missing:
        lines += ["", f"Not run (stopped before they finished): {', '.join(missing)}."]
    kept = results["setup"].get("rows_kept_from_an_earlier_run")
    if kept:
        others = [
            name for name in results["setup"]["rows_run"] if name not in set(kept)
        ]
        lines += [
            "",
            f"Rows {', '.join(others)} were run by a second invocation (`--only`, "
            f"same setup); {', '.join(kept)} come from the first (wall times "
            "differ with the host's load, not only with the row).",
        ]
    lines += ["", "| goal | gap (points) | met? |", "|---|---|---|"]
    for name, g in results["goals"].items():
        gap = g["gap_points"]
        shown = (
            ", ".join(f"{k} {v:.2f}" for k, v in gap.items())
            if isinstance(gap, dict)
            else f"{gap:.2f}"
        )
        lines.append(f"| {name} | {shown} | {'**yes**' if g['met'] else '**no**'} |")
    return "\n".join(lines) + "\n"


#: Where each row's hyperparameters are: ``setup`` holds the base values only
#: (what tuning starts from), under a name that says so.
ROW_HYPERPARAMETERS = (
    "per row family in `setups` and per row in rows[].details.hyperparameters "
    "(chosen on the validation split: `tuning`)"
)


def setup_block(setup: Setup) -> dict[str, Any]:
    """``setup`` for the JSON: the tuned keys moved under ``untuned_defaults``,
    so no reader takes them for the values a row ran with."""
    d = asdict(setup)
    untuned = {k: d.pop(k) for k in setup.hyper}
    return {**d, "untuned_defaults": untuned, "hyperparameters": ROW_HYPERPARAMETERS}


def _flat_setup(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored ``setup`` as :func:`dataclasses.asdict` gives it (either form)."""
    flat = {k: v for k, v in stored.items() if k != "hyperparameters"}
    return {**flat.pop("untuned_defaults", {}), **flat}


TUNING_RESULTS = RESULTS.with_name("dp_fedavg_tuning.json")
#: The validation grid (overrides of ``FULL``). Criterion: validation accuracy
#: after ``rounds`` rounds; DP rows take the best config at epsilon 4 (the middle
#: target), the no-DP rows the best config without DP, so the baseline is not
#: handicapped by settings chosen for noise.
GRID: tuple[dict[str, Any], ...] = (
    {"hidden": (32,), "clip_norm": 0.5, "client_lr": 0.05, "server_lr": 0.03},
    {"hidden": (32,), "clip_norm": 0.5, "client_lr": 0.05, "server_lr": 0.1},
    {"hidden": (32,), "clip_norm": 0.2, "client_lr": 0.1, "local_epochs": 2,
     "server_lr": 0.1},
    {"hidden": (16,), "clip_norm": 0.5, "client_lr": 0.05, "server_lr": 0.05},
)  # fmt: skip
TUNE_EPSILON = 4.0


def _listed(config: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}


def _key(dp: bool, sketch: bool) -> str:
    """The tuning result's name of one kind of row."""
    return (
        f"validation_accuracy_{'eps4' if dp else 'no_dp'}{'_sketch' if sketch else ''}"
    )


def tune(
    setup: Setup,
    out: Path,
    *,
    sketch: bool = False,
    configs: Sequence[int] | None = None,
    no_dp: bool = True,
) -> dict[str, Any]:
    """Run grid configs on the validation split (never the test split) at
    epsilon 4 (and, with ``no_dp``, without DP), dense or count-sketched; the
    accuracies are merged into ``out``'s grid entries (others are kept)."""
    started = time.perf_counter()
    picked = list(range(len(GRID)) if configs is None else configs)
    kinds = [True, False] if no_dp else [True]
    jobs = [
        (replace(setup, **GRID[i]), Row(TUNE_EPSILON if dp else None, sketch))
        for i in picked
        for dp in kinds
    ]
    rows = iter(_run_jobs(jobs, setup.jobs, "validation"))
    old = json.loads(out.read_text()) if out.is_file() else {}
    grid = old.get("grid") or [{"config": _listed(g)} for g in GRID]
    for i in picked:
        entry = grid[i]
        assert entry["config"] == _listed(GRID[i]), "the grid changed: re-run"
        for dp in kinds:
            r = next(rows)
            key = _key(dp, sketch)
            entry[key] = r["final_accuracy"]
            entry.setdefault("curves", {})[key] = r["details"]["accuracy_curve"]
            entry.setdefault("wall_s", {})[key] = r["wall_s"]
    runs = old.get("runs", [])
    runs.append(
        {
            "configs": picked,
            "kinds": [_key(dp, sketch) for dp in kinds],
            "environment": environment(started),
        }
    )
    tuning = {
        **old,
        "criterion": "validation accuracy (held-out training images) at the last "
        f"of {setup.rounds} rounds; each kind of row (DP or not, sketched or "
        f"not) takes the best config of the grid, DP rows as measured at epsilon "
        f"{TUNE_EPSILON:g}",
        "validation_images": setup.validation,
        "base": setup.hyper,
        "grid": grid,
        "runs": runs,
    }
    write_results(out, tuning, started)
    return tuning


def chosen(
    setup: Setup, tuning: dict[str, Any] | None
) -> dict[tuple[bool, bool], Setup]:
    """``(dp, sketch) -> setup`` of each kind of row: the best grid config among
    those measured for that kind; a kind not tuned takes the dense row's config
    (sketched rows) or ``setup``."""
    out = {}
    for dp in (True, False):
        for sketch in (False, True):
            key = _key(dp, sketch)
            out[dp, sketch] = out[dp, False] if sketch else setup
            measured = [r for r in (tuning or {}).get("grid", []) if key in r]
            if measured:
                g = max(measured, key=lambda r: r[key])["config"]
                out[dp, sketch] = replace(
                    setup,
                    **{k: tuple(v) if isinstance(v, list) else v for k, v in g.items()},
                )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="digits, 100 clients")
    ap.add_argument("--out", type=Path, default=str(RESULTS))
    ap.add_argument("--rounds", type=int, help="override the number of rounds")
    ap.add_argument("--jobs", type=int, help="rows run at once (processes)")
    ap.add_argument(
        "--tune", action="store_true", help="run the validation grid and exit"
    )
    ap.add_argument(
        "--sketch", action="store_true", help="with --tune: the count-sketched rows"
    )
    ap.add_argument("--configs", help="with --tune: grid indices, e.g. 2,3")
    ap.add_argument(
        "--dp-only", action="store_true", help="with --tune: only epsilon 4"
    )
    ap.add_argument(
        "--only",
        help="run these rows (e.g. eps4_sketch,eps2_sketch) and keep the others "
        "from --out, which must have been made with the same setup",
    )
    ap.add_argument(
        "--markdown",
        action="store_true",
        help="print the docs table rendered from --out and exit",
    )
    args = ap.parse_args(argv)
    if args.markdown:
        print(render_markdown(json.loads(args.out.read_text())), end="")
        return 0
    check_out(ap, args.out)
    setup = TINY if args.tiny else FULL
    if args.rounds:
        setup = replace(setup, rounds=args.rounds)
    if args.jobs:
        setup = replace(setup, jobs=args.jobs)
    if args.tune:
        configs = [int(x) for x in args.configs.split(",")] if args.configs else None
        tune(
            setup,
            args.out.with_name(TUNING_RESULTS.name),
            sketch=args.sketch,
            configs=configs,
            no_dp=not args.dp_only,
        )
        return 0
    tuning = None
    if not args.tiny and TUNING_RESULTS.is_file():
        tuning = json.loads(TUNING_RESULTS.read_text())
    setups = chosen(setup, tuning)
    started = time.perf_counter()
    # Dense rows first: a run stopped early has the headline (accuracy at each
    # epsilon against no DP) before the sketched comparisons.
    rows = [Row(eps, sk) for sk in (False, True) for eps in setup.epsilons]
    jobs = [(setups[r.epsilon is not None, r.sketch], r) for r in rows]
    kept, earlier = _kept_rows(ap, args, setup, rows)
    todo = [i for i in range(len(rows)) if i not in kept]

    def write(ran: dict[int, dict[str, Any]]) -> None:
        done = {**kept, **{todo[j]: row for j, row in ran.items()}}
        out = [done[i] for i in sorted(done)]
        results = {
            "benchmark": "dp_fedavg",
            "tiny": bool(args.tiny),
            "clients": setup.clients,
            "sample_rate": setup.sample_rate,
            "rounds": setup.rounds,
            "delta": setup.delta,
            "rows": out,
            "goals": goals(out),
            "setup": {
                **setup_block(setup),
                "d": model_dim(setup),
                "rows_run": [r.name for i, r in enumerate(rows) if i in done],
                "rows_not_run": [r.name for i, r in enumerate(rows) if i not in done],
            },
            "setups": {
                f"{'dp' if dp else 'no_dp'}{'_sketch' if sk else ''}": {
                    **s.hyper,
                    "d": model_dim(s),
                }
                for (dp, sk), s in setups.items()
            },
            "tuning": tuning,
            "environment": environment(started),
        }
        if kept:
            results["setup"]["rows_kept_from_an_earlier_run"] = [
                rows[i].name for i in sorted(kept)
            ]
            results["earlier_environment"] = earlier
        write_results(args.out, results, started)

    _run_jobs([jobs[i] for i in todo], setup.jobs, "test", on_done=write)
    return 0


def _kept_rows(
    ap: argparse.ArgumentParser, args: argparse.Namespace, setup: Setup, rows: list[Row]
) -> tuple[dict[int, dict[str, Any]], Any]:
    """With ``--only``: the other rows of ``--out`` (by index), and the
    environment they were measured in; the stored setup must be this one."""
    if not args.only:
        return {}, None
    wanted = set(args.only.split(","))
    unknown = wanted - {r.name for r in rows}
    if unknown:
        ap.error(f"--only: no row named {', '.join(sorted(unknown))}")
    if not args.out.is_file():
        ap.error(
            f"--only: {args.out} does not exist (the rows to keep are read from it)"
        )
    prev = json.loads(args.out.read_text())
    skip = ("jobs", "d", "rows_run", "rows_not_run", "rows_kept_from_an_earlier_run")
    stored = {k: v for k, v in _flat_setup(prev["setup"]).items() if k not in skip}
    ours = json.loads(
        json.dumps({k: v for k, v in asdict(setup).items() if k != "jobs"})
    )
    if stored != ours:
        ap.error(f"--only: {args.out} was made with another setup")
    kept = {}
    for i, r in enumerate(rows):
        found = [
            x
            for x in prev["rows"]
            if x["epsilon_target"] == r.epsilon and x["sketch"] == r.sketch
        ]
        if r.name not in wanted and found:
            kept[i] = found[0]
    return kept, prev.get("earlier_environment") or prev["environment"]


if __name__ == "__main__":
    raise SystemExit(main())

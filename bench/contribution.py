"""Contribution accounting on Fashion-MNIST through the real coordinator.

The setting of issue 6 (the "CPU test" of the GTG-Shapley incentive design of
Buyukates, He et al., arXiv 2302.14031): 10 clients whose data sizes vary by 4x
(1,500 .. 6,000 training images, IID labels), 2 of them label-flippers
(``y -> 9 - y``), 1 free-rider, FedAvg for 20 rounds, an MLP.

The run is :func:`fedplat.sim.simulate` with ``contribution.enabled`` in the run
config: the real :class:`fedplat.server.coordinator.Coordinator` with in-process
:class:`fedplat.client.Client` objects over the in-memory transport. The
coordinator values each round itself (its evaluator on the first
``--eval-examples`` test images is the utility) and stores, in the round's closing
transaction, one ``contributions`` row and one signed ledger entry per aggregated
client. Everything reported is read back from the store **by client id** (the id
the store gave each client at enrolment, mapped to its name and so to its role):
no row order is assumed anywhere. The bench checks that the ledger verifies, that
the store's invariants hold (``fedplat store check``), and that each client's
cumulative score in the ledger equals the sum of its stored per-round credits.

Writes ``bench/results/contribution.json``::

    {"setup": {...},
     "clients": [{"id", "role", "data_size", "cumulative_score",
                  "reward_share", "flagged_rounds"}],
     "spearman_honest_size_vs_score", "final_accuracy", "valued_rounds",
     "truncated_rounds", "utility_evaluations", "seconds", "wall_seconds"}

``cumulative_score`` is the accounted GTG-Shapley total (rounds flagged as
free-riding count at most 0), ``reward_share`` the client's share of the budget
in its last ledger entry, ``flagged_rounds`` the rounds in which the client was
*suspect*; ``utility_evaluations`` and ``seconds`` are the coordinator's
``contribution.*`` metrics summed over the run (the cost of the accounting),
``wall_seconds`` the whole run's wall time (training, evaluation, accounting).

``--partition dirichlet:0.3 --attackers none`` instead measures how often honest
non-IID clients get flagged (printed, and written only with ``--out``);
``--tiny`` is a seconds-long smoke run (sizes / 5, 3 rounds, 500 held-out images)
for the test of the headline's direction.

Run::

    python -m bench.contribution     # ~2 minutes on 2 shared, busy cores
    python -m bench.contribution --tiny --out /tmp/c.json
    python -m bench.contribution --markdown     # the docs' tables from the JSON

The other committed runs (:data:`RUNS`) are written with ``--out
bench/results/contribution_<variant>.json`` and the options their row names.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from fedplat.client import Client, FitResult
from fedplat.server.config import RunConfig, parse_config
from scipy.stats import spearmanr

from bench.common import check_out, write_results
from fedplat.contribution import verify_run_ledger
from fedplat.data import Dataset, fashion_mnist_available, load_dataset, partition
from fedplat.models import create_model, train_epochs
from fedplat.sim import simulate
from fedplat.store import Store
from fedplat.store.check import check_store
from fedplat.transport.inmemory import InMemoryConnection
from fedplat.vectors import flatten, layout_of, load_vector

log = logging.getLogger("bench.contribution")

SIZES = (1500, 2000, 2500, 3000, 3500, 4000, 4500, 5000, 5500, 6000)
# Attackers sit inside the size range so honest sizes still span 4x.
ROLES = {2: "label_flipper", 6: "label_flipper", 8: "free_rider"}


@dataclass(frozen=True)
class Setup:
    """The bench's setting (written to the JSON's ``setup``)."""

    sizes: tuple[int, ...] = SIZES
    rounds: int = 20
    eval_examples: int = 2000
    hidden: int = 100
    epochs: int = 1
    batch_size: int = 32
    lr: float = 0.05
    free_rider: str = "zeros"
    attackers: str = "default"
    partition: str = "sized"
    seed: int = 0


TINY = Setup(sizes=tuple(s // 5 for s in SIZES), rounds=3, eval_examples=500)


def _train_fn(
    data: Dataset, role: str, free_rider: str, seed: int
) -> Callable[[torch.nn.Module, Mapping[str, Any]], FitResult]:
    """The client's local step for its role."""
    gen = torch.Generator().manual_seed(seed)
    stale: dict[str, torch.Tensor] = {}
    calls = [0]

    def train(model: torch.nn.Module, config: Mapping[str, Any]) -> FitResult:
        calls[0] += 1
        kw = {
            "epochs": int(config.get("epochs", 1)),
            "batch_size": int(config.get("batch_size", 32)),
            "lr": float(config.get("lr", 0.05)),
            "seed": seed * 1000 + calls[0],
        }
        if role != "free_rider":
            res = train_epochs(model, data, **kw)
            return FitResult(len(data), {"train_loss": float(res.mean_loss)})
        layout = layout_of(model)
        before = flatten(model, layout)
        if free_rider == "zeros":  # send the global model back unchanged
            return FitResult(len(data), {})
        if free_rider == "random":  # noise of an honest update's magnitude
            noise = torch.randn(before.shape, generator=gen) * 0.002
            load_vector(model, before + noise, layout)
            return FitResult(len(data), {})
        # "stale": train once, then replay that first update every round.
        if "delta" not in stale:
            train_epochs(model, data, **kw)
            stale["delta"] = flatten(model, layout) - before
        load_vector(model, before + stale["delta"], layout)
        return FitResult(len(data), {})

    return train


def run_config(setup: Setup, workdir: Path) -> RunConfig:
    """The coordinator's run: FedAvg, every client every round, contribution on."""
    n = len(setup.sizes)
    return parse_config(
        {
            "run": {"name": "bench-contribution", "rounds": setup.rounds, "seed": 0},
            "model": {"name": "mlp", "params": {"hidden": [setup.hidden]}},
            "data": {"dataset": "fashion_mnist"},
            "evaluation": {"max_examples": setup.eval_examples},
            "selection": {"clients_per_round": n, "min_available": n, "quorum": n},
            "client_training": {
                "epochs": setup.epochs,
                "batch_size": setup.batch_size,
                "lr": setup.lr,
            },
            "aggregator": {"name": "fedavg"},
            "server_optimizer": {"name": "fedavg", "lr": 1.0},
            "store": {"url": str(workdir / "fedplat.db")},
            "checkpoints": {"dir": str(workdir / "ckpt"), "keep_last": 1},
            "contribution": {
                "enabled": True,
                "scorers": ["gtg_shapley", "cosine"],
                "primary": "gtg_shapley",
                "budget": 1000.0,
                "key_path": str(workdir / "ledger_ed25519.pem"),
            },
        }
    )


@dataclass(frozen=True)
class Population:
    """Each client's name, role and local data (index ``i`` = ``client-{i:02d}``)."""

    names: list[str]
    roles: dict[str, str]
    data: dict[str, Dataset]


def population(setup: Setup) -> Population:
    if not fashion_mnist_available():
        raise SystemExit(
            "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)"
        )
    train = load_dataset("fashion_mnist", "train")
    n = len(setup.sizes)
    if setup.partition == "sized":
        parts = partition(
            "sized", train.y.numpy(), n, setup.seed, sizes=list(setup.sizes)
        )
    else:
        alpha = float(setup.partition.split(":", 1)[1])
        parts = partition("dirichlet", train.y.numpy(), n, setup.seed, alpha=alpha)
    names = [f"client-{i:02d}" for i in range(n)]
    roles, data = {}, {}
    for i, name in enumerate(names):
        role = ROLES.get(i, "honest") if setup.attackers == "default" else "honest"
        local = train.subset(parts[i])
        if role == "label_flipper":
            local = Dataset(local.x, 9 - local.y, local.name, local.num_classes)
        roles[name], data[name] = role, local
    return Population(names, roles, data)


def _builder(
    setup: Setup, pop: Population
) -> Callable[[int, Callable[[], InMemoryConnection]], Client]:
    def build(i: int, factory: Callable[[], InMemoryConnection]) -> Client:
        name = pop.names[i]
        local = pop.data[name]
        model = create_model(
            "mlp", local.input_shape, 10, seed=0, hidden=(setup.hidden,)
        )
        train = _train_fn(local, pop.roles[name], setup.free_rider, seed=i + 1)
        return Client(
            None,
            model,
            train,
            num_examples=len(local),
            name=name,
            connection_factory=factory,
        )

    return build


def read_results(store: Store, run_id: str, pop: Population) -> dict[str, Any]:
    """Per-client results read back from the store by client id, after checking
    the ledger, the store's invariants and that the two records agree."""
    report = verify_run_ledger(store, run_id)
    if not report.ok:
        raise RuntimeError(f"ledger does not verify: {report.problems}")
    problems = check_store(store)
    if problems:
        raise RuntimeError(f"store check failed: {[str(p) for p in problems]}")
    name_of = {c.id: c.name for c in store.list_clients(run_id)}
    rows = []
    for cid, name in sorted(name_of.items(), key=lambda x: x[1]):
        contributions = store.list_contributions(run_id, client_id=cid)
        entries = store.list_ledger_entries(run_id, client_id=cid)
        last = json.loads(entries[-1].payload_json)
        credit = sum(c.score or 0.0 for c in contributions)
        if abs(credit - last["cumulative"]) > 1e-9 or len(entries) != len(
            contributions
        ):
            raise RuntimeError(f"{name}: ledger and contributions rows disagree")
        rows.append(
            {
                "id": name,
                "role": pop.roles[name],
                "data_size": len(pop.data[name]),
                "cumulative_score": round(last["cumulative"], 6),
                "reward_share": round(last["reward_share"], 6),
                "flagged_rounds": sum(c.suspect for c in contributions),
            }
        )
    metrics: dict[str, float] = {}
    valued = 0
    for m in store.list_metrics(run_id):
        if m.client_id is None and m.name.startswith("contribution."):
            metrics[m.name] = metrics.get(m.name, 0.0) + m.value
            valued += m.name == "contribution.utility_after"
    return {
        "clients": rows,
        "valued_rounds": valued,
        "truncated_rounds": int(metrics.get("contribution.truncated", 0)),
        "utility_evaluations": int(metrics.get("contribution.utility_evaluations", 0)),
        "seconds": round(metrics.get("contribution.seconds", 0.0), 1),
    }


def run(setup: Setup, workdir: Path | None = None) -> dict[str, Any]:
    """Run the bench in ``workdir`` (a temporary folder, removed afterwards, by
    default); returns the JSON document."""
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="bench-contribution-") as tmp:
            return run(setup, Path(tmp))
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    pop = population(setup)
    cfg = run_config(setup, workdir)
    with Store(cfg.store.url) as store:
        res = simulate(cfg, _builder(setup, pop), len(pop.names), store=store)
        failed = [r.number for r in res.rounds if not r.completed]
        if failed:
            raise RuntimeError(f"rounds {failed} failed")
        out = read_results(store, res.run_id, pop)
    honest = [r for r in out["clients"] if r["role"] == "honest"]
    rho = spearmanr(
        [r["data_size"] for r in honest], [r["cumulative_score"] for r in honest]
    ).statistic
    return {
        "setup": asdict(setup),
        **out,
        "spearman_honest_size_vs_score": round(float(rho), 4),
        "final_accuracy": res.final_accuracy,
        "wall_seconds": round(time.perf_counter() - t_start, 1),
    }


def check_goals(out: dict[str, Any]) -> list[str]:
    """The issue's goals; returns the ones missed."""
    rows = out["clients"]
    honest = [r for r in rows if r["role"] == "honest"]
    bad = [r for r in rows if r["role"] != "honest"]
    rounds = out["setup"]["rounds"]
    missed = []
    if bad and honest:
        worst_honest = min(r["cumulative_score"] for r in honest)
        above = [r["id"] for r in bad if r["cumulative_score"] >= worst_honest]
        if above:
            missed.append(f"not below every honest client: {above}")
        if out["spearman_honest_size_vs_score"] < 0.8:
            missed.append("Spearman(honest size, score) < 0.8")
    over = [r["id"] for r in honest if r["flagged_rounds"] > 0.1 * rounds]
    if over:
        missed.append(f"honest clients flagged in > 10% of rounds: {over}")
    return missed


#: The committed runs docs/contribution.md quotes: file -> how the run differs.
RUNS = {
    "contribution.json": "free-rider sends zeros (default)",
    "contribution_free_rider_random.json": "`--free-rider random` (Gaussian noise)",
    "contribution_free_rider_stale.json": "`--free-rider stale` (replays round 1)",
    "contribution_dirichlet.json": (
        "`--partition dirichlet:0.3 --attackers none` (10 honest)"
    ),
}


def clients_table(out: dict[str, Any]) -> str:
    """The per-client Markdown table of one run, numbers as in its JSON."""
    lines = [
        "| client | role | size | cumulative GTG-Shapley | share | suspect rounds |",
        "|---|---|---|---|---|---|",
    ]
    for c in out["clients"]:
        lines.append(
            f"| {c['id']} | {c['role']} | {c['data_size']} | "
            f"{c['cumulative_score']} | {c['reward_share']} | {c['flagged_rounds']} |"
        )
    return "\n".join(lines)


def runs_table(outs: dict[str, dict[str, Any]]) -> str:
    """One Markdown row per run (keys of :data:`RUNS`), numbers as in the JSON."""
    lines = [
        "| run | final accuracy | Spearman (honest size, score) | lowest honest "
        "score | highest attacker score | max honest suspect rounds | attackers' "
        "suspect rounds | utility evaluations | truncated rounds | accounting s "
        "| wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, what in RUNS.items():
        out = outs[name]
        honest = [c for c in out["clients"] if c["role"] == "honest"]
        bad = [c for c in out["clients"] if c["role"] != "honest"]
        worst = min(c["cumulative_score"] for c in honest)
        best_bad = max((c["cumulative_score"] for c in bad), default="-")
        bad_flags = ", ".join(str(c["flagged_rounds"]) for c in bad) or "-"
        lines.append(
            f"| {what} | {out['final_accuracy']} | "
            f"{out['spearman_honest_size_vs_score']} | {worst} | {best_bad} | "
            f"{max(c['flagged_rounds'] for c in honest)} | {bad_flags} | "
            f"{out['utility_evaluations']} | {out['truncated_rounds']} | "
            f"{out['seconds']} | {out['wall_seconds']} |"
        )
    return "\n".join(lines)


def markdown(results: Path) -> str:
    """The tables docs/contribution.md quotes, from the JSON files in ``results``."""
    outs = {name: json.loads((results / name).read_text()) for name in RUNS}
    return clients_table(outs["contribution.json"]) + "\n\n" + runs_table(outs)


def _print(out: dict[str, Any]) -> None:
    rounds = out["setup"]["rounds"]
    for r in out["clients"]:
        rate = r["flagged_rounds"] / rounds
        print(
            f"{r['id']} {r['role']:<13} size {r['data_size']:>5} "
            f"score {r['cumulative_score']:+.4f} share {r['reward_share']:.3f} "
            f"flagged {r['flagged_rounds']}/{rounds} ({rate:.0%})"
        )
    print(
        f"spearman(honest size, score) = {out['spearman_honest_size_vs_score']}; "
        f"final accuracy {out['final_accuracy']}; {out['utility_evaluations']} "
        f"utility evaluations over {out['valued_rounds']} valued rounds "
        f"({out['truncated_rounds']} truncated); accounting {out['seconds']} s; "
        f"wall {out['wall_seconds']} s"
    )
    for miss in check_goals(out):
        print(f"GOAL MISSED: {miss}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="seconds-long smoke run")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--eval-examples", type=int, default=None)
    p.add_argument("--hidden", type=int, default=None, help="MLP hidden width")
    p.add_argument("--free-rider", choices=("zeros", "random", "stale"))
    p.add_argument("--attackers", choices=("default", "none"))
    p.add_argument("--partition", help="sized (4x sizes, IID) | dirichlet:ALPHA")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--out", "--output", dest="out", type=Path, default=None)
    p.add_argument(
        "--markdown",
        action="store_true",
        help="print the docs' tables from bench/results/ (runs nothing)",
    )
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown(Path("bench/results")))
        return 0
    if args.out is not None:
        check_out(p, args.out)
    base = TINY if args.tiny else Setup()
    given = {
        k: v
        for k, v in vars(args).items()
        if v is not None and k in Setup.__dataclass_fields__
    }
    setup = Setup(**{**asdict(base), **given})
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("fedplat").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    started = time.perf_counter()
    out = run(setup)
    _print(out)
    default = Path("bench/results/contribution.json")
    target = args.out or (default if setup == Setup() else None)
    if target:
        write_results(target, out, started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

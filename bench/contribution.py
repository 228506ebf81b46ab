"""Contribution accounting on Fashion-MNIST through the real round engine.

The setting of issue 6 / ALGORITHMS.md section 5 ("CPU test"): 10 clients whose
data sizes vary by 4x (1,500 .. 6,000 training images, IID labels), 2 of them
label-flippers (``y -> 9 - y``), 1 free-rider, FedAvg for 20 rounds, an MLP.

The run goes through :class:`fedplat.server.engine.RoundEngine` with in-process
:class:`fedplat.client.Client` objects over the in-memory transport, driven step
by step like :func:`fedplat.sim.simulate` (whose loop is repeated here because
the engine does not call the accountant yet). After each ``close_round`` the
bench calls :meth:`ContributionAccountant.on_round` exactly as the engine will:
the round's ``[n, d]`` stack and the aggregator's decisions (captured by a thin
wrapper around ``engine.aggregator``), the global weights before the round, a
side-effect-free ``aggregate_fn`` replicating FedAvg + the server optimizer, and
the engine's own evaluator as utility. The held-out set is the first
``--eval-examples`` (2,000) test images: the engine's accuracy of the new global
model *is* ``U(N)`` and the previous round's is ``U(∅)``, so the accountant
evaluates only the proper coalitions.

Writes ``bench/results/contribution.json``::

    {"clients": [{"id", "role", "data_size", "cumulative_score",
                  "reward_share", "flagged_rounds"}],
     "spearman_honest_size_vs_score", "utility_evaluations", "seconds"}

``cumulative_score`` is the accounted GTG-Shapley total (rounds flagged as
free-riding count at most 0), ``flagged_rounds`` the rounds in which the client
was *suspect*, ``utility_evaluations`` and ``seconds`` the cost of contribution
accounting over the run (the whole bench's wall time is printed).

``--partition dirichlet:0.3 --attackers none`` instead measures how often honest
non-IID clients get flagged (printed, and written only with ``--output``).

Run::

    python -m bench.contribution                       # ~10 minutes on 2 busy cores
    python -m bench.contribution --rounds 3 --output /tmp/c.json   # smoke
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from fedplat.aggregators import AggregationResult, Aggregator
from fedplat.client import Client, FitResult
from fedplat.server.config import parse_config
from fedplat.server.engine import RoundEngine
from scipy.stats import spearmanr

from fedplat.contribution import (
    ContributionAccountant,
    ContributionSection,
    load_or_create_signing_key,
    make_utility_from_metric,
    verify_run_ledger,
)
from fedplat.data import Dataset, load_dataset, partition
from fedplat.models import create_model, train_epochs
from fedplat.sim import VirtualClock
from fedplat.store import Store
from fedplat.transport.inmemory import InMemoryConnection
from fedplat.vectors import flatten, layout_of, load_vector

log = logging.getLogger("bench.contribution")

SIZES = [1500, 2000, 2500, 3000, 3500, 4000, 4500, 5000, 5500, 6000]
# Attackers sit inside the size range so honest sizes still span 4x.
ROLES = {2: "label_flipper", 6: "label_flipper", 8: "free_rider"}


class CapturingAggregator:
    """Delegates to the run's aggregator and keeps the last round's inputs."""

    def __init__(self, inner: Aggregator) -> None:
        self.inner = inner
        self.name = inner.name
        self.last: tuple[torch.Tensor, torch.Tensor | None, AggregationResult] | None
        self.last = None

    def __call__(
        self, updates: torch.Tensor, weights: torch.Tensor | None = None
    ) -> AggregationResult:
        result = self.inner(updates, weights)
        self.last = (updates, weights, result)
        return result

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.inner.load_state_dict(state)


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


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="bench-contribution-"))
    train = load_dataset("fashion_mnist", "train")
    if train.name != "fashion_mnist":
        raise SystemExit("Fashion-MNIST is not installed (see ENVIRONMENT.md)")
    n = len(SIZES)
    roles = {
        i: ROLES.get(i, "honest") if args.attackers == "default" else "honest"
        for i in range(n)
    }
    if args.partition == "sized":
        parts = partition("sized", train.y.numpy(), n, args.seed, sizes=SIZES)
    else:
        alpha = float(args.partition.split(":", 1)[1])
        parts = partition("dirichlet", train.y.numpy(), n, args.seed, alpha=alpha)
    cfg = parse_config(
        {
            "run": {"name": "bench-contribution", "rounds": args.rounds, "seed": 0},
            "model": {"name": "mlp", "params": {"hidden": [args.hidden]}},
            "data": {"dataset": "fashion_mnist"},
            "evaluation": {"max_examples": args.eval_examples},
            "selection": {"clients_per_round": n, "min_available": n, "quorum": n},
            "client_training": {"epochs": 1, "batch_size": 32, "lr": 0.05},
            "aggregator": {"name": "fedavg"},
            "server_optimizer": {"name": "fedavg", "lr": 1.0},
            "store": {"url": str(workdir / "fedplat.db")},
            "checkpoints": {"dir": str(workdir / "ckpt"), "keep_last": 1},
        }
    )
    contribution = ContributionSection(
        enabled=True, scorers=["gtg_shapley", "cosine"], budget=1000.0
    )
    store = Store(cfg.store.url)
    clock = VirtualClock()
    engine = RoundEngine(cfg, store, clock=clock)
    capture = CapturingAggregator(engine.aggregator)
    engine.aggregator = capture
    key = load_or_create_signing_key(workdir / "ledger_ed25519.pem")
    accountant = ContributionAccountant(contribution, store, engine.run_id, key)
    utility = make_utility_from_metric(engine.evaluator)
    lr = cfg.server_optimizer.lr

    def factory() -> InMemoryConnection:
        return InMemoryConnection(engine)

    clients = []
    for i in range(n):
        local = train.subset(parts[i])
        if roles[i] == "label_flipper":
            local = Dataset(local.x, 9 - local.y, local.name, local.num_classes)
        model = create_model(
            "mlp", train.input_shape, 10, seed=0, hidden=(args.hidden,)
        )
        clients.append(
            Client(
                None,
                model,
                _train_fn(local, roles[i], args.free_rider, seed=i + 1),
                num_examples=len(local),
                name=f"client-{i:02d}",
                connection_factory=factory,
            )
        )
    for c in clients:
        c.enroll()
    names = {r.id: r.name for r in store.list_clients(engine.run_id)}
    index = {f"client-{i:02d}": i for i in range(n)}

    prev_accuracy: float | None = None
    train_seconds = 0.0
    while not engine.finished:
        for c in clients:
            c.step(wait_seconds=0.0)
        number = engine.open_round()
        global_before = engine.weights.clone()
        t0 = time.perf_counter()
        for c in clients:
            c.step(wait_seconds=0.0)
        train_seconds += time.perf_counter() - t0
        clock.advance(1.0)
        outcome = engine.close_round()
        if not outcome.completed or capture.last is None:
            raise RuntimeError(f"round {number} failed: {outcome.reason}")
        updates, weights, result = capture.last
        ids = sorted(names)  # the engine stacks rows by sorted client id

        def aggregate_fn(
            u: torch.Tensor, w: torch.Tensor | None, g: torch.Tensor = global_before
        ) -> torch.Tensor:
            # FedAvg then the server optimizer (fedavg, lr): no state to touch.
            return g + lr * capture.inner(u, w).aggregate.to(torch.float32)

        rc = accountant.on_round(
            number, ids, updates, weights, global_before, aggregate_fn, utility,
            result.decisions, prev_accuracy, outcome.accuracy,
            aggregate=result.aggregate,
        )  # fmt: skip
        prev_accuracy = outcome.accuracy
        suspects = [names[c.client_id] for c in rc.clients if c.suspect]
        log.info(
            "round %d: accuracy %.4f, %d evaluations, %d permutations, "
            "%.1fs accounting%s; suspect: %s",
            number,
            outcome.accuracy or float("nan"),
            rc.cost.utility_evaluations,
            rc.cost.permutations,
            rc.cost.seconds,
            " (truncated)" if rc.truncated else "",
            ", ".join(suspects) or "-",
        )

    report = verify_run_ledger(store, engine.run_id)
    if not report.ok:
        raise RuntimeError(f"ledger does not verify: {report.problems}")
    standings = {names[s.client_id]: s for s in accountant.standings()}
    rows = []
    for name in sorted(standings):
        s, i = standings[name], index[name]
        rows.append(
            {
                "id": name,
                "role": roles[i],
                "data_size": len(parts[i]),
                "cumulative_score": round(s.cumulative, 6),
                "reward_share": round(s.reward_share, 6),
                "flagged_rounds": s.suspect_rounds,
            }
        )
    honest = [r for r in rows if r["role"] == "honest"]
    rho = spearmanr(
        [r["data_size"] for r in honest], [r["cumulative_score"] for r in honest]
    ).statistic
    out = {
        "clients": rows,
        "spearman_honest_size_vs_score": round(float(rho), 4),
        "utility_evaluations": accountant.total_evaluations,
        "seconds": round(accountant.total_seconds, 1),
    }
    final = prev_accuracy if prev_accuracy is not None else float("nan")
    print(
        f"final accuracy {final:.4f}; ledger OK ({report.entries} entries); "
        f"training {train_seconds:.0f}s; accounting {accountant.total_seconds:.0f}s; "
        f"wall {time.perf_counter() - t_start:.0f}s"
    )
    store.close()
    return out


def check_goals(out: dict[str, Any]) -> list[str]:
    """The issue's goals; returns the ones missed."""
    rows = out["clients"]
    honest = [r for r in rows if r["role"] == "honest"]
    bad = [r for r in rows if r["role"] != "honest"]
    missed = []
    if bad and honest:
        worst_honest = min(r["cumulative_score"] for r in honest)
        above = [r["id"] for r in bad if r["cumulative_score"] >= worst_honest]
        if above:
            missed.append(f"not below every honest client: {above}")
        if out["spearman_honest_size_vs_score"] < 0.8:
            missed.append("Spearman(honest size, score) < 0.8")
    return missed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--eval-examples", type=int, default=2000)
    p.add_argument("--hidden", type=int, default=100, help="MLP hidden width")
    p.add_argument(
        "--free-rider", choices=("zeros", "random", "stale"), default="zeros"
    )
    p.add_argument("--attackers", choices=("default", "none"), default="default")
    p.add_argument(
        "--partition", default="sized", help="sized (4x sizes, IID) | dirichlet:ALPHA"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("fedplat").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    out = run(args)
    rounds = args.rounds
    for r in out["clients"]:
        rate = r["flagged_rounds"] / rounds
        print(
            f"{r['id']} {r['role']:<13} size {r['data_size']:>5} "
            f"score {r['cumulative_score']:+.4f} share {r['reward_share']:.3f} "
            f"flagged {r['flagged_rounds']}/{rounds} ({rate:.0%})"
        )
    print(f"spearman(honest size, score) = {out['spearman_honest_size_vs_score']}")
    honest_rates = [
        r["flagged_rounds"] / rounds for r in out["clients"] if r["role"] == "honest"
    ]
    print(f"max honest flagged rate = {max(honest_rates):.0%}")
    for miss in check_goals(out):
        print(f"GOAL MISSED: {miss}")
    default_run = args.partition == "sized" and args.attackers == "default"
    target = args.output or ("bench/results/contribution.json" if default_run else None)
    if target:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

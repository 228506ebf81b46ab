"""``fedplat demo``: coordinator + client processes on Fashion-MNIST."""

from __future__ import annotations

import argparse
from typing import Any


def cmd_demo(args: argparse.Namespace) -> int:
    from fedplat.demo import DemoArgs, run_demo

    return run_demo(
        DemoArgs(
            clients=args.clients,
            rounds=args.rounds,
            alpha=args.alpha,
            dataset=args.dataset,
            model=args.model,
            seed=args.seed,
            workdir=args.workdir,
            output=args.output,
        )
    )


def register(sub: Any) -> None:
    """Add ``fedplat demo``."""
    d = sub.add_parser("demo", help="coordinator + client processes on Fashion-MNIST")
    d.add_argument("--clients", type=int, default=10, help="client processes")
    d.add_argument("--rounds", type=int, default=20, help="federated rounds")
    d.add_argument(
        "--alpha", type=float, default=0.5, help="Dirichlet label-skew parameter"
    )
    d.add_argument("--dataset", default="fashion_mnist", help="bundled dataset")
    d.add_argument("--model", default="mlp", help="registered model")
    d.add_argument("--seed", type=int, default=0, help="run and partition seed")
    d.add_argument("--workdir", default="runs/demo", help="store, logs, checkpoints")
    d.add_argument(
        "--output", default=None, help="summary JSON (default: WORKDIR/demo.json)"
    )
    d.set_defaults(func=cmd_demo)

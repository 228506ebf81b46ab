"""``fedplat list KIND``: the names every registry accepts in a run file."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def _lister(kind: str) -> Callable[[], list[str]]:
    if kind == "models":
        from fedplat.models import available_models as fn
    elif kind == "datasets":
        from fedplat.data import available_datasets as fn
    elif kind == "partitions":
        from fedplat.data import available_partitioners as fn
    elif kind == "aggregators":
        from fedplat.aggregators.registry import available_aggregators as fn
    elif kind == "pre-aggregators":
        from fedplat.aggregators.registry import available_pre_aggregators as fn
    elif kind == "attacks":
        from fedplat.aggregators.attacks import available_attacks as fn
    elif kind == "compressors":
        from fedplat.compression import available_compressors as fn
    elif kind == "scorers":
        from fedplat.contribution.scorers import available_scorers as fn
    else:
        from fedplat.metrics import available_metrics as fn
    return fn


KINDS = (
    "models",
    "datasets",
    "partitions",
    "aggregators",
    "pre-aggregators",
    "attacks",
    "compressors",
    "scorers",
    "metrics",
)
_WHERE = {
    "models": "model.name (or model.factory: 'package.module:fn')",
    "datasets": "data.dataset (or data.eval: 'package.module:fn')",
    "partitions": "--partition of fedplat client / sim",
    "aggregators": "aggregator.name",
    "pre-aggregators": "aggregator.pre[].name",
    "attacks": "--attack of fedplat client",
    "compressors": "compression.name",
    "scorers": "contribution.scorers",
    "metrics": "evaluation.metrics (or 'package.module:fn')",
}


def cmd_list(args: argparse.Namespace) -> int:
    """Print one registered name per line."""
    for name in _lister(args.kind)():
        print(name)
    return 0


def register(sub: Any) -> None:
    """Add ``fedplat list``."""
    lines = "; ".join(f"{k}: {v}" for k, v in _WHERE.items())
    p = sub.add_parser(
        "list",
        help="list the registered models, datasets, aggregators, metrics, ...",
        description=f"Names accepted by run files and flags. {lines}.",
    )
    p.add_argument("kind", choices=KINDS, help="which registry to list")
    p.set_defaults(func=cmd_list)

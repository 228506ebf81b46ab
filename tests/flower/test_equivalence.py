"""The same seeded workload through fedplat's aggregation and through the Flower
strategy gives the same model, for every registered rule (issue 16).

fedplat's side is configured exactly as the coordinator configures its
aggregation step: a run file is parsed (:func:`fedplat.server.config.
parse_config`), its ``aggregator`` section becomes
``cfg.aggregator.build()``, the rule gets the example counts as
weights when ``weighted`` is set, and the FedAvg server optimizer with lr 1
adds the aggregate to the global model. The Flower side receives the clients'
new models (``global + update``, float32) as Flower arrays.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fedplat.aggregators import available_aggregators
from fedplat.server.config import parse_config

from fedplat.flower import FedplatStrategy, decisions_from_metrics
from tests.support import run_config
from tests.support.flower import (
    contexts,
    flat,
    flower_identity,
    model_arrays,
    run_round,
    shift_app,
)

SHAPES = {"conv": (4, 3, 2), "fc": (6, 5), "bias": (5,)}
D = 24 + 30 + 5
NODES = [9, 17, 23, 31, 42, 57, 64]  # n = 7: Bulyan's n >= 4f + 3 with f = 1
ROUNDS = 3

# Parameters of every registered rule for n = 7 clients (one of them an outlier).
RULES: dict[str, dict[str, Any]] = {
    "fedavg": {},
    "median": {},
    "trimmed_mean": {"f": 1},
    "meamed": {"f": 1},
    "krum": {"f": 1},
    "multi_krum": {"f": 1},
    "bulyan": {"f": 1},
    "geometric_median": {},
    "centered_clipping": {"tau": 0.5},
    "flag": {"m": 3, "rescale": "median_norm"},
}
# Pipelines as in a run file's `pre:` list.
PIPELINES: dict[str, dict[str, Any]] = {
    "bucketing+centered_clipping": {
        "name": "centered_clipping",
        "params": {"tau": 0.5},
        "pre": [{"name": "bucketing", "params": {"bucket_size": 2, "seed": 3}}],
    },
    "nnm+krum": {
        "name": "krum",
        "params": {"f": 1},
        "pre": [{"name": "nnm", "params": {"f": 1}}],
    },
    "clipping+median": {
        "name": "median",
        "pre": [{"name": "clipping", "params": {"max_norm": 2.0}}],
    },
}


def _sections() -> dict[str, dict[str, Any]]:
    out = {name: {"name": name, "params": p} for name, p in RULES.items()}
    out.update(PIPELINES)
    out["fedavg-unweighted"] = {"name": "fedavg", "weighted": False}
    return out


@pytest.fixture(autouse=True)
def _identity() -> Iterator[None]:
    with flower_identity():
        yield


def test_every_registered_rule_is_covered() -> None:
    assert sorted(RULES) == sorted(available_aggregators())


def _workload(round_number: int) -> dict[int, np.ndarray]:
    rng = np.random.default_rng([7, round_number])
    base = rng.normal(size=D)
    updates = {n: base + 0.3 * rng.normal(size=D) for n in NODES}
    updates[NODES[2]] = -8.0 * base  # a sign-flipping client
    return {n: u.astype(np.float32) for n, u in updates.items()}


def _coordinator_step(cfg_section: dict[str, Any], tmp: Path) -> tuple[Any, bool]:
    """The aggregator and ``weighted`` flag as the coordinator builds them."""
    cfg = parse_config(run_config(tmp, clients=len(NODES), aggregator=cfg_section))
    return cfg.aggregator.build(), cfg.aggregator.is_weighted


@pytest.mark.parametrize("label", sorted(_sections()))
def test_flower_strategy_matches_fedplat_aggregation(
    label: str, tmp_path: Path
) -> None:
    section = _sections()[label]
    aggregator, weighted = _coordinator_step(section, tmp_path)
    strategy = FedplatStrategy(
        section,
        min_train_nodes=len(NODES),
        min_available_nodes=len(NODES),
        fraction_evaluate=0.0,
    )
    counts = {n: 10 + 7 * i for i, n in enumerate(NODES)}
    start = np.random.default_rng(1).normal(size=D).astype(np.float32)
    ours, flower_global = torch.from_numpy(start), model_arrays(start, SHAPES)
    ctxs = contexts(NODES)
    for r in range(1, ROUNDS + 1):
        updates = _workload(r)
        # fedplat: rows in the strategy's order (ascending node id), as floats
        # the coordinator would have decoded.
        rows = torch.stack([torch.from_numpy(updates[n]) for n in NODES])
        w = torch.tensor([float(counts[n]) for n in NODES]) if weighted else None
        result = aggregator(rows, w)
        ours = ours + result.aggregate.to(torch.float32)

        app = shift_app(updates, counts)
        new, metrics = run_round(strategy, r, flower_global, app, ctxs)
        assert new is not None and metrics is not None, strategy.reports[r].failure
        flower_global = new
        # float32 tolerance: the strategy sees (global + u) - global, not u.
        np.testing.assert_allclose(flat(new), ours.numpy(), rtol=1e-5, atol=1e-5)
        got = decisions_from_metrics(metrics)
        assert [d.selected for d in got] == [d.selected for d in result.decisions]
        assert [sorted(d.flags) for d in got] == [
            sorted(d.flags) for d in result.decisions
        ]
        np.testing.assert_allclose(
            [d.weight for d in got], [d.weight for d in result.decisions], atol=1e-6
        )

"""examples/flower on Flower's simulation and deployment engines (real processes:
a SuperLink, SuperNodes or Ray workers, all on 127.0.0.1, stopped at the end)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest

from examples.flower.launch import FlowerRuntime

pytestmark = pytest.mark.integration  # starts real processes


def _run(engine: str, supernodes: int, rounds: int, tmp: Path) -> dict[str, Any]:
    results = tmp / "results.json"
    config = (
        f"num-server-rounds={rounds} max-steps=20 num-nodes={supernodes} "
        f'results-path="{results}"'
    )
    with FlowerRuntime(engine, supernodes, tmp) as rt:
        done = rt.run(config, timeout=420)
        logs = rt.log("superlink")
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n{logs}"
    assert results.is_file(), done.stdout[-3000:]
    return dict(json.loads(results.read_text()))


def _check(data: dict[str, Any], supernodes: int, rounds: int) -> None:
    assert data["primary"] == "FedplatStrategy"
    assert data["aggregator"]["name"] == "centered_clipping"
    assert [r["round"] for r in data["rounds"]] == list(range(1, rounds + 1))
    last = data["rounds"][-1]
    # Trained: ten classes start at ~10% and a few rounds of 20 steps each
    # reach well above it (Fashion-MNIST, 2NN MLP).
    assert data["initial_accuracy"] < 0.2
    assert last["accuracy"] > data["initial_accuracy"] + 0.1
    assert last["metrics"]["fedplat.num-accepted"] == supernodes
    assert last["metrics"]["fedplat.failed"] == 0
    assert len(last["decisions"]) == supernodes
    _check_weights(last["decisions"], supernodes)
    # DGC: past its first warm-up stage (density 25%) the updates are sparse.
    assert last["metrics"]["fedplat.compression-ratio"] > 2.0


def _check_weights(decisions: list[dict[str, Any]], supernodes: int) -> None:
    """The app's rule is centered clipping after bucketing (bucket size 2),
    weighted by example counts (pyproject.toml). A client's weight is its
    bucket's coefficient in the output times its share of the bucket's examples
    (aggregators/pipeline.py), so within a bucket ``weight / examples`` is one
    value; the coefficients plus the reference point's sum to 1, the reference
    point's being 0 unless some bucket was clipped (aggregators/cclip.py)."""
    from examples.flower.fedplat_flower_app.task import local_data

    # Each node trains on one Dirichlet(0.5) partition (seed 0, the app's
    # defaults); Flower's node ids do not say which, so try every assignment.
    examples = [len(local_data(p, supernodes, 0.5, 0)) for p in range(supernodes)]
    weights = [float(d["weight"]) for d in decisions]
    assert all(d["selected"] for d in decisions)
    # Every bucket keeps a share: its last clipping step adds w * min(1, tau/r).
    assert all(w > 0 for w in weights), weights
    total = math.fsum(weights)
    assert total <= 1 + 1e-6, weights
    if not any("clipped" in d["flags"] for d in decisions):
        assert total == pytest.approx(1.0, abs=1e-6), weights

    def bucketed(assignment: tuple[int, ...]) -> bool:
        ratio = sorted(
            (w / examples[p], tuple(d["flags"]))
            for w, p, d in zip(weights, assignment, decisions, strict=True)
        )
        # Bucket mates: the same weight per example and the same flags.
        return all(
            a[0] == pytest.approx(b[0], rel=1e-6) and a[1] == b[1]
            for a, b in zip(ratio[::2], ratio[1::2], strict=True)
        )

    assignments = itertools.permutations(range(supernodes))
    assert any(bucketed(a) for a in assignments), (weights, examples)


def test_simulation_engine(tmp_path: Path) -> None:
    data = _run("simulation", 4, 3, tmp_path)
    _check(data, 4, 3)


def test_deployment_engine(tmp_path: Path) -> None:
    data = _run("deployment", 2, 2, tmp_path)
    _check(data, 2, 2)

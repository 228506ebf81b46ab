"""examples/flower on Flower's simulation and deployment engines (real processes:
a SuperLink, SuperNodes or Ray workers, all on 127.0.0.1, stopped at the end)."""

from __future__ import annotations

import json
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
    assert all(
        "clipped" not in d["flags"] or d["weight"] >= 0 for d in last["decisions"]
    )
    # DGC: past its first warm-up stage (density 25%) the updates are sparse.
    assert last["metrics"]["fedplat.compression-ratio"] > 2.0


def test_simulation_engine(tmp_path: Path) -> None:
    data = _run("simulation", 4, 3, tmp_path)
    _check(data, 4, 3)


def test_deployment_engine(tmp_path: Path) -> None:
    data = _run("deployment", 2, 2, tmp_path)
    _check(data, 2, 2)

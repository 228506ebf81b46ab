"""Tiny mode of bench/tabular.py: the schema and the direction of its claims
(federated close to central, DGC compresses and stays close to dense)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

pytestmark = pytest.mark.integration  # starts a process running simulations


def test_tiny_tabular_bench(tmp_path: Path) -> None:
    out = tmp_path / "tabular.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.tabular", "--tiny", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    for key in (
        "central_accuracy",
        "federated_accuracy",
        "dgc_accuracy",
        "dgc_compression_ratio",
        "dgc_warmup_end_drop",
    ):
        assert isinstance(res[key], float), key
    # 8 rounds are far from converged, but the claims' direction must hold: all
    # three learn (chance is 0.63), federated is near central, DGC sends several
    # times fewer bytes without losing much.
    assert min(res["central_accuracy"], res["federated_accuracy"]) > 0.85
    assert abs(res["federated_accuracy"] - res["central_accuracy"]) < 0.05
    assert res["dgc_compression_ratio"] > 3.0
    assert res["dgc_accuracy"] > res["federated_accuracy"] - 0.05
    assert 0.0 <= res["dgc_warmup_end_drop"] < 0.05
    assert res["setup"]["rounds"] == 8 and len(res["curves"]["dgc"]) == 8

"""Tiny mode of bench/demo.py: two demo runs with one seed agree in every round."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

pytestmark = pytest.mark.integration  # starts a coordinator and client processes


def test_tiny_demo_repeats_with_one_seed(tmp_path: Path) -> None:
    out = tmp_path / "demo.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.demo", "--tiny", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads(out.read_text())
    a, b = (r["accuracy_per_round"] for r in res["runs"])
    assert len(a) == len(b) == 2 and a == b and res["same_to_4_digits"] is True
    assert res["runs"][0]["run_id"] != res["runs"][1]["run_id"]
    assert min(a) > 0.1  # learned something (chance is 0.1)
    assert "round   2/2: accuracy" in proc.stdout

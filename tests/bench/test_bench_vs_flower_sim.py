"""bench/vs_flower_sim.py: the schema of its rows, and its tiny mode checking the
direction of the headline claim (same accuracy as Flower's strategy where the
rules are the same; fedplat's aggregation step faster for a robust rule)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO


def _run(rule: str, side: str, acc: float, own: float, peer: float) -> dict[str, Any]:
    rounds = [
        {
            "round": r,
            "accuracy": acc,
            "aggregation_s": own,
            "peer_aggregation_s": peer,
            "metrics": {"fedplat.rule-s": own / 2} if side == "fedplat" else {},
        }
        for r in (1, 2)
    ]
    return {"rule": rule, "strategy": side, "rounds": rounds}


def test_rows_pair_both_sides_of_each_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))
    from bench.vs_flower_sim import goals, rows

    runs = [
        _run("median", "fedplat", 0.80, own=0.01, peer=0.05),
        _run("median", "flower", 0.80, own=0.04, peer=0.01),
        _run("multi_krum", "fedplat", 0.70, own=0.02, peer=0.03),
        _run("multi_krum", "flower", 0.72, own=0.03, peer=0.02),
    ]
    table = rows(runs)
    median, multi = table
    assert median["rule"] == "median" and median["robust"] is True
    # Flower's times: 0.05 (as peer) and 0.04 (driving); fedplat's 0.01 twice.
    assert median["aggregation_speedup"] == pytest.approx(0.045 / 0.01)
    assert median["accuracy_gap"] == 0.0 and median["accuracy_equal"]
    assert multi["accuracy_gap"] == pytest.approx(-0.02) and not multi["accuracy_equal"]
    assert multi["difference"] is not None  # Flower's MultiKrum weighs by examples
    g = goals(table)
    assert g["equal_accuracy_where_rules_match"] is True  # multi_krum differs
    assert g["robust_speedup_min_rule"] == "multi_krum"
    assert g["robust_speedup_met"] is False


@pytest.mark.integration
def test_tiny_run_shows_the_claim(tmp_path: Path) -> None:
    out = tmp_path / "vs_flower_sim.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.vs_flower_sim", "--tiny", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["tiny"] is True
    by_rule = {r["rule"]: r for r in data["rows"]}
    assert set(by_rule) == {"fedavg", "median"}
    for r in data["rows"]:
        # The same rule from the same model on the same client updates: the
        # same accuracy after every round (float32 rounding aside).
        a = r["accuracy_by_round"]
        assert a["fedplat"] == pytest.approx(a["flower"], abs=2e-3)
        assert r["accuracy_equal"]
    # The robust rule: fedplat's aggregation step beats Flower's on the same replies.
    assert by_rule["median"]["aggregation_speedup"] > 1.0
    assert by_rule["median"]["robust"] and not by_rule["fedavg"]["robust"]

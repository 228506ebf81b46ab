"""Smoke test of bench/robustness.py: the ``--tiny`` grid runs and writes the schema.

No accuracy assertions: a few rounds on digits only check the plumbing (clients,
attacks, rules with and without bucketing, summary, markdown).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests.support import REPO


def test_tiny_grid_writes_results_and_markdown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(REPO))  # bench/ is not an installed package
    from bench.robustness import TINY, main

    out, docs = tmp_path / "robustness.json", tmp_path / "robustness.md"
    threads = torch.get_num_threads()
    main(["--tiny", "--out", str(out), "--docs", str(docs), "--threads", str(threads)])
    summary = json.loads(out.read_text())
    assert 0.0 <= summary["no_attack_fedavg"] <= 1.0
    rows = summary["rows"]
    assert len(rows) == len(TINY.rules) * len(TINY.attacks) * 2
    for row in rows:
        assert set(row) >= {"rule", "bucketing", "attack", "accuracy_mean"}
        assert "accuracy_std" in row
        assert math.isfinite(row["accuracy_mean"])
    assert {r["attack"] for r in rows} == set(TINY.attacks)
    assert set(summary["best_per_attack"]) == set(TINY.attacks)
    text = docs.read_text()
    assert "<!-- results:start -->" in text and "| centered_clipping |" in text

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
    assert "<!-- robustness-results:begin -->" in text
    assert "| centered_clipping |" in text
    # Rows are aggregated unweighted, and the page says what the accuracy is.
    assert summary["setup"]["weighted"] is False
    assert "mean of the last 2 test evaluations" in text


def test_replace_rows_keeps_the_other_rules_and_the_baseline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(REPO))
    from bench.robustness import main

    out, docs = tmp_path / "robustness.json", tmp_path / "robustness.md"
    first = main(["--tiny", "--out", str(out), "--docs", str(docs)])
    assert first is not None
    second = main(
        ["--tiny", "--out", str(out), "--docs", str(docs),
         "--rules", "centered_clipping", "--replace-rows"]
    )  # fmt: skip
    assert second is not None
    assert second["no_attack_fedavg_accuracies"] == first["no_attack_fedavg_accuracies"]
    keep = [r for r in first["rows"] if r["rule"] != "centered_clipping"]
    assert [r for r in second["rows"] if r["rule"] != "centered_clipping"] == keep
    assert len(second["rows"]) == len(first["rows"])
    assert second["replaced_rows"]["rules"] == ["centered_clipping"]


def test_tau_is_chosen_on_validation_data_never_on_the_test_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(REPO))
    from dataclasses import replace

    from bench.robustness import TINY, load_data
    from bench.robustness_tau import main

    # The validation set is drawn from the training split, disjoint from what the
    # clients train on.
    setup = replace(TINY, validation=300)
    data = load_data(setup)
    full = load_data(TINY)
    assert len(data.test) == 300

    def rows(x: torch.Tensor) -> list[tuple[float, ...]]:
        return sorted(tuple(r) for r in x.flatten(1).tolist())

    # Training rows + validation rows are exactly the full training split.
    assert rows(torch.cat([data.train.x, data.test.x])) == rows(full.train.x)

    out = tmp_path / "tau.json"
    assert main(["--tiny", "--taus", "1", "100", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["setup"]["validation_examples"] == 300
    best = max(res["taus"], key=lambda t: (res["mean_by_tau"][f"{t:g}"], -t))
    assert res["chosen_tau"] == best
    assert len(res["scores"]) == 2 * len(TINY.attacks) * 2

"""Smoke test of bench/robustness.py: the ``--tiny`` grid runs and writes the schema.

No accuracy assertions: a few rounds on digits only check the plumbing (clients,
attacks, rules with and without bucketing, summary, markdown).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support import REPO


def test_tiny_grid_writes_results_and_markdown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(REPO))  # bench/ is not an installed package
    from bench.robustness import main
    from bench.robustness_setup import TINY

    out, docs = tmp_path / "robustness.json", tmp_path / "robustness.md"
    threads = torch.get_num_threads()
    main(["--tiny", "--out", str(out), "--docs", str(docs), "--threads", str(threads)])
    summary = json.loads(out.read_text())
    assert 0.0 <= summary["no_attack_fedavg"] <= 1.0
    rows = summary["rows"]
    assert len(rows) == len(TINY.rules) * len(TINY.attacks) * 2
    for row in rows:
        assert set(row) >= {"rule", "bucketing", "attack", "accuracy_mean"}
        assert 0.0 <= row["honest_flagged"] <= 1.0
        assert 0.0 <= row["byzantine_flagged"] <= 1.0
        assert "accuracy_std" in row
        assert math.isfinite(row["accuracy_mean"])
    assert {r["attack"] for r in rows} == set(TINY.attacks)
    assert set(summary["best_per_attack"]) == set(TINY.attacks)
    assert len(summary["worst_case"]) == len(TINY.rules) * 2
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
    import numpy as np

    import bench.robustness_tau as rt
    from bench.robustness_setup import TINY, VALIDATION_SEED
    from bench.robustness_train import load_data

    # What every scored run trains and evaluates on (tiny mode: one worker, so
    # the data is built in this process and handed to run_jobs).
    seen: list[Any] = []
    real_run_jobs = rt.run_jobs

    def spy(setup: Any, data: Any, jobs: Any, workers: int) -> Any:
        seen.append(data)
        return real_run_jobs(setup, data, jobs, workers)

    monkeypatch.setattr(rt, "run_jobs", spy)
    out = tmp_path / "tau.json"
    assert rt.main(["--tiny", "--taus", "1", "100", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["setup"]["validation_examples"] == 300
    assert len(res["scores"]) == 2 * len(TINY.attacks) * 2
    assert len(seen) == 2  # one load per tau

    # The evaluation rows are the seeded draw of 300 *training* indices, the
    # clients train on the other indices; the test split is not read for scoring.
    full = load_data(TINY)
    n = len(full.train)
    perm = np.random.default_rng(VALIDATION_SEED).permutation(n)
    val_idx, train_idx = np.sort(perm[:300]), np.sort(perm[300:])
    assert not set(val_idx.tolist()) & set(train_idx.tolist())
    for data in seen:
        assert torch.equal(data.test.x, full.train.x[val_idx])
        assert torch.equal(data.test.y, full.train.y[val_idx])
        assert torch.equal(data.train.x, full.train.x[train_idx])


def _fake_scores(
    monkeypatch: pytest.MonkeyPatch, table: dict[float, list[float]]
) -> list[float]:
    """Make :func:`bench.robustness_tau.tune` score tau ``t``'s jobs (in job
    order: attack-major, then bucketing) ``table[t]``, without training."""
    import bench.robustness_tau as rt
    from bench.robustness_train import RunResult

    taus_run: list[float] = []

    def fake(setup: Any, data: Any, jobs: Any, workers: int) -> Any:
        taus_run.append(setup.cclip_tau)
        assert setup.validation > 0  # scored on held-out training rows
        accs = table[setup.cclip_tau]
        assert len(jobs) == len(accs)
        for job, acc in zip(jobs, accs, strict=True):
            yield job, RunResult(acc, acc, 0.0, setup.rounds)

    monkeypatch.setattr(rt, "run_jobs", fake)
    monkeypatch.setattr(rt, "load_data", lambda setup: None)
    return taus_run


def test_chosen_tau_is_the_best_worst_case_on_validation_data(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(REPO))
    from dataclasses import replace

    from bench.robustness_setup import TINY
    from bench.robustness_tau import tune

    setup = replace(TINY, rules=("centered_clipping",), validation=300)
    # Four jobs per tau (2 attacks x without/with bucketing); dyadic values, so
    # the means are exact. Worst / mean: tau 10 -> 0.5 / 0.6875, 30 -> 0.25 /
    # 0.625 (but the best single score, 1.0), 100 -> 0.75 / 0.75, 300 -> 0.625 /
    # 0.6875, 3 -> as 300, 50 -> 0.625 / 0.8125 (the best mean).
    table = {
        3.0: [0.625, 0.625, 0.75, 0.75],
        10.0: [0.5, 0.625, 0.75, 0.875],
        30.0: [1.0, 0.25, 1.0, 0.25],
        50.0: [0.625, 1.0, 1.0, 0.625],
        100.0: [0.75, 0.75, 0.75, 0.75],
        300.0: [0.625, 0.625, 0.75, 0.75],
    }
    taus_run = _fake_scores(monkeypatch, table)
    res = tune(setup, [300.0, 30.0, 10.0, 100.0], workers=1, log=lambda _: None)
    assert taus_run == [300.0, 30.0, 10.0, 100.0]
    assert res["worst_by_tau"] == {"300": 0.625, "30": 0.25, "10": 0.5, "100": 0.75}
    assert res["mean_by_tau"] == {"300": 0.6875, "30": 0.625, "10": 0.6875, "100": 0.75}
    assert res["chosen_tau"] == 100.0  # the best worst case, not the best score
    assert [s["accuracy"] for s in res["scores"] if s["tau"] == 30.0] == table[30.0]

    def chosen(taus: list[float]) -> float:
        _fake_scores(monkeypatch, table)
        return float(tune(setup, taus, workers=1, log=lambda _: None)["chosen_tau"])

    # 10 and 300 have the same mean: the worst case decides, not the radius.
    assert chosen([10.0, 300.0]) == chosen([300.0, 10.0]) == 300.0
    # 300, 3 and 50 share the worst case: the higher mean (50) wins; 300 and 3
    # tie on both, and the smaller radius wins, whichever order they come in.
    assert chosen([300.0, 3.0, 50.0]) == 50.0
    assert chosen([3.0, 300.0]) == chosen([300.0, 3.0]) == 3.0


def test_a_run_whose_model_blows_up_is_scored_not_crashed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An unbounded attack can take a weak rule's model to Inf/NaN: the run
    stops there and scores the diverged model, instead of the aggregator
    refusing non-finite rows and the whole grid failing (as it once did)."""
    monkeypatch.syspath_prepend(str(REPO))
    from dataclasses import replace

    from bench.robustness_setup import TINY
    from bench.robustness_train import load_data, run_one

    setup = replace(TINY, rounds=6, eval_every=1, eval_last=3)
    data = load_data(setup)
    r = run_one(setup, data, "mean", "ipm_large", False, seed=0)
    big = replace(setup, lr=1e30)  # a step that overflows float32 at once
    blown = run_one(big, data, "mean", "ipm_large", False, seed=0)
    assert r.diverged_round is None or r.diverged_round > 1
    assert blown.diverged_round is not None and blown.rounds < setup.rounds
    assert math.isfinite(blown.accuracy) and 0.0 <= blown.accuracy <= 1.0

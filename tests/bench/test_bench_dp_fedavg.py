"""Tiny mode of bench/dp_fedavg.py (digits, 100 Poisson-sampled clients): the
direction of its claims (DP at a larger epsilon costs less accuracy than at a
smaller one, every row spends at most its epsilon, the count-sketch sends a
fraction of the bytes), and docs/privacy.md quotes the committed JSON exactly.

No timing assertion (the machine is shared)."""

from __future__ import annotations

import json

import pytest

from tests.support import REPO, run_bench


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("dp_fedavg") / "dp_fedavg.json"
    return run_bench("bench.dp_fedavg", out)


def _row(results: dict, eps: float | None, sketch: bool) -> dict:
    (row,) = [
        r
        for r in results["rows"]
        if r["epsilon_target"] == eps and r["sketch"] is sketch
    ]
    return row


@pytest.mark.integration  # starts a real process
def test_schema(tiny: dict) -> None:
    assert tiny["benchmark"] == "dp_fedavg" and tiny["tiny"] is True
    assert tiny["clients"] == 100 and tiny["sample_rate"] == 0.2
    assert tiny["rounds"] == 40 and tiny["delta"] == 1e-5
    assert len(tiny["rows"]) == 6
    for r in tiny["rows"]:
        for key in ("final_accuracy", "uplink_bytes", "wall_s"):
            assert isinstance(r[key], int | float) and r[key] > 0, (key, r)
        assert r["details"]["completed_rounds"] == 40


@pytest.mark.integration  # starts a real process
def test_the_direction_of_the_claims(tiny: dict) -> None:
    plain, eps8, eps2 = (_row(tiny, e, False) for e in (None, 8.0, 2.0))
    # Privacy costs accuracy, more at a smaller epsilon; DP still learns.
    assert plain["final_accuracy"] > eps2["final_accuracy"]
    assert eps8["final_accuracy"] > eps2["final_accuracy"] - 0.05
    assert eps2["final_accuracy"] > 0.15  # 10 classes: chance is 0.1
    for r in tiny["rows"]:
        eps = r["epsilon_target"]
        if eps is None:
            assert r["epsilon_spent"] is None
        else:  # calibrated for the run: spends (almost) exactly its budget
            assert 0.95 * eps <= r["epsilon_spent"] <= eps + 1e-9
        if r["sketch"]:  # b = d / 20 values instead of d
            dense = _row(tiny, eps, False)
            assert r["uplink_bytes"] < dense["uplink_bytes"] / 5


def test_docs_quote_the_committed_results(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))  # bench/ is not an installed package
    from bench.dp_fedavg import RESULTS, render_markdown

    doc = (REPO / "docs" / "privacy.md").read_text()
    begin, end = "<!-- dp-fedavg-table:begin -->\n", "<!-- dp-fedavg-table:end -->"
    quoted = doc[doc.index(begin) + len(begin) : doc.index(end)]
    assert quoted == render_markdown(json.loads(RESULTS.read_text()))

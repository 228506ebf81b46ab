"""Tiny mode of bench/attacks_live.py: against a live coordinator under the
default secure configuration, a sybil flood and huge-magnitude rows are blocked
(decided from the store and the attacker's refused requests), the honest
clients complete every round with the accuracy of the run without attack, and
the store grows by less than 1 MB; and docs/security.md quotes the committed
attacks_live.json."""

from __future__ import annotations

import json

import pytest

from tests.support import REPO, run_bench


@pytest.mark.integration  # starts real processes
def test_tiny_attacks_are_blocked_and_honest_clients_unaffected(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    out = tmp_path_factory.mktemp("attacks") / "attacks.json"
    res = run_bench("bench.attacks_live", out, timeout=1800)
    assert res["tiny"] is True
    assert [r["attack"] for r in res["rows"]] == ["sybil_flood", "huge_magnitude_rows"]
    rounds = res["setup"]["rounds"]
    assert res["no_attack"]["honest_rounds_completed"] == rounds
    for row in res["rows"]:
        ev = row["evidence"]
        assert row["blocked"] is True, (row["attack"], ev)
        assert ev["accepted_requests"] == 0 and ev["updates_aggregated"] == 0
        assert sum(ev["requests"].values()) > 0  # it did attack
        assert row["honest_rounds_completed"] == rounds
        assert abs(row["final_accuracy"] - res["no_attack_accuracy"]) <= 0.01
        assert row["store_growth_mb"] < 1.0
        assert row["store_check"] == "ok"
    sybil = res["rows"][0]["evidence"]
    assert sybil["clients_in_store"] == res["setup"]["clients"]


def test_docs_quote_the_committed_results(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))  # bench/ is not an installed package
    from bench.attacks_live import RESULTS, render_markdown

    doc = (REPO / "docs" / "security.md").read_text()
    begin, end = "<!-- attacks-table:begin -->\n", "<!-- attacks-table:end -->"
    quoted = doc[doc.index(begin) + len(begin) : doc.index(end)]
    assert quoted == render_markdown(json.loads(RESULTS.read_text()))

"""Tiny mode of bench/secagg.py: the unmasked sum matches the plain sum within
1e-6 despite 10% dropouts, the overhead ratios are computed, and the sparse
SecAgg+ graph costs each client fewer bytes than SecAgg's complete graph; and
docs/privacy.md quotes the committed secagg.json exactly.

No timing assertion: only that the ratios exist (the machine is shared).
"""

from __future__ import annotations

import json
import math

import pytest

from tests.support import REPO, run_bench


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("secagg") / "secagg.json"
    return run_bench("bench.secagg", out)


def _ratio(x: object) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


@pytest.mark.integration  # starts a real process
def test_schema(tiny: dict) -> None:
    assert tiny["benchmark"] == "secagg" and tiny["tiny"] is True
    for key in (
        "clients",
        "params",
        "dropout",
        "max_rel_error",
        "time_overhead",
        "bytes_overhead",
    ):
        assert key in tiny, key
    assert tiny["clients"] == 20 and tiny["dropout"] == pytest.approx(0.1)
    assert [r["name"] for r in tiny["rows"]] == [
        "secagg_plus",
        "secagg_plus_no_rotation",
        "secagg_complete",
    ]
    for row in tiny["rows"]:
        assert set(row["phases"]) == {"advertise", "share", "masked_input", "unmask"}
        for side in ("client", "coordinator"):
            assert _ratio(row["time_overhead"][side])
            assert _ratio(row["bytes_overhead"][side])


@pytest.mark.integration  # starts a real process
def test_unmasked_sum_matches_the_plain_sum_despite_dropouts(tiny: dict) -> None:
    assert tiny["max_rel_error"] < 1e-6 and tiny["l2_rel_error"] < 1e-6
    for row in tiny["rows"]:
        assert row["survivors"] == 18 and row["dropped"] == tiny["dropped_clients"]
        # The fixed-point bound holds (plus float32 rounding of the rotation).
        assert row["error_l2"] <= row["error_bound_l2"] * 1.01 + 1e-9
    rows = {r["name"]: r for r in tiny["rows"]}
    # The rotation buys a finer grid for the same 32 bits: a smaller error.
    assert (
        rows["secagg_plus"]["l2_rel_error"]
        < rows["secagg_plus_no_rotation"]["l2_rel_error"]
    )


@pytest.mark.integration  # starts a real process
def test_sparse_graph_costs_clients_less_than_the_complete_graph(tiny: dict) -> None:
    rows = {r["name"]: r for r in tiny["rows"]}
    plus, full = rows["secagg_plus"], rows["secagg_complete"]
    assert plus["degree"] < full["degree"] == tiny["clients"] - 1
    assert plus["bytes"]["client"] < full["bytes"]["client"]
    # Every client uploads at least its update's worth of bytes (the masked
    # input is one uint32 per coordinate of the padded vector).
    assert plus["bytes_overhead"]["client_upload"] >= 1.0


def test_docs_quote_the_committed_results(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))  # bench/ is not an installed package
    from bench.secagg import RESULTS, render_markdown

    doc = (REPO / "docs" / "privacy.md").read_text()
    begin, end = "<!-- secagg-table:begin -->\n", "<!-- secagg-table:end -->"
    quoted = doc[doc.index(begin) + len(begin) : doc.index(end)]
    assert quoted == render_markdown(json.loads(RESULTS.read_text()))

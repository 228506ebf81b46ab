"""Tiny run of bench/contribution.py (``--tiny``: sizes / 5, 3 rounds, in a real
process) through the real coordinator: the direction of the headline claim holds
(the free-rider and both label-flippers score below every honest client and get
nothing), and the JSON has its schema; docs/contribution.md quotes the committed
JSON exactly. Roles are attributed by the client ids the store gave at
enrolment, so a wrong row order would show here as a misplaced score."""

from __future__ import annotations

from typing import Any

import pytest

from fedplat.data import fashion_mnist_available
from tests.support import REPO, run_bench

needs_fashion = pytest.mark.skipif(
    not fashion_mnist_available(), reason="Fashion-MNIST is not installed"
)

KEYS = {
    "setup",
    "clients",
    "spearman_honest_size_vs_score",
    "final_accuracy",
    "valued_rounds",
    "truncated_rounds",
    "utility_evaluations",
    "seconds",
    "wall_seconds",
    "environment",  # the commit the result came from (bench/common.py)
}
CLIENT_KEYS = {
    "id",
    "role",
    "data_size",
    "cumulative_score",
    "reward_share",
    "flagged_rounds",
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("contribution") / "contribution.json"
    result: dict[str, Any] = run_bench("bench.contribution", out)
    return result


@needs_fashion
@pytest.mark.integration  # starts a real process
def test_tiny_schema(tiny: dict[str, Any]) -> None:
    assert set(tiny) == KEYS
    assert all(set(c) == CLIENT_KEYS for c in tiny["clients"])
    assert [c["id"] for c in tiny["clients"]] == [f"client-{i:02d}" for i in range(10)]
    assert [c["data_size"] for c in tiny["clients"]] == list(tiny["setup"]["sizes"])
    roles = [c["role"] for c in tiny["clients"]]
    assert roles.count("label_flipper") == 2 and roles.count("free_rider") == 1
    assert tiny["valued_rounds"] == tiny["setup"]["rounds"] == 3
    assert tiny["utility_evaluations"] > 0 and tiny["seconds"] > 0


@needs_fashion
@pytest.mark.integration  # starts a real process
def test_tiny_attackers_score_below_every_honest_client(tiny: dict[str, Any]) -> None:
    honest = [c for c in tiny["clients"] if c["role"] == "honest"]
    bad = [c for c in tiny["clients"] if c["role"] != "honest"]
    worst_honest = min(c["cumulative_score"] for c in honest)
    for c in bad:
        assert c["cumulative_score"] < worst_honest, (c, worst_honest)
        assert c["reward_share"] == 0.0
    assert sum(c["reward_share"] for c in honest) == pytest.approx(1.0, abs=1e-5)
    rounds = tiny["setup"]["rounds"]
    free_rider = next(c for c in bad if c["role"] == "free_rider")
    assert free_rider["flagged_rounds"] == rounds
    assert all(c["flagged_rounds"] == 0 for c in honest)


@needs_fashion
@pytest.mark.integration  # starts a real process
def test_goal_check_reports_a_misattributed_score(
    tiny: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bench's own goal check would catch the bug it once had."""
    import copy

    monkeypatch.syspath_prepend(str(REPO))
    from bench.contribution import check_goals

    assert check_goals(tiny) == []
    swapped = copy.deepcopy(tiny)
    rows = swapped["clients"]
    rows[8]["cumulative_score"], rows[9]["cumulative_score"] = (
        rows[9]["cumulative_score"],
        rows[8]["cumulative_score"],
    )
    assert any("not below every honest" in m for m in check_goals(swapped))


def test_options_make_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """``main`` parses the options into the setting it writes (no run here)."""
    monkeypatch.syspath_prepend(str(REPO))
    from bench import contribution

    seen: dict[str, Any] = {}

    def fake_run(setup: Any, workdir: Any = None) -> dict[str, Any]:
        seen["setup"] = setup
        raise SystemExit(0)

    monkeypatch.setattr(contribution, "run", fake_run)
    with pytest.raises(SystemExit):
        contribution.main(["--tiny", "--rounds", "2", "--free-rider", "stale"])
    assert seen["setup"].rounds == 2 and seen["setup"].free_rider == "stale"
    assert seen["setup"].sizes == contribution.TINY.sizes


def test_docs_quote_the_committed_results(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/contribution.md holds the tables ``--markdown`` renders from the
    committed JSON, and its summary numbers are the JSON's."""
    import json

    monkeypatch.syspath_prepend(str(REPO))
    from bench.contribution import markdown

    doc = (REPO / "docs" / "contribution.md").read_text()
    for block in markdown(REPO / "bench" / "results").split("\n\n"):
        assert block in doc
    out = json.loads((REPO / "bench" / "results" / "contribution.json").read_text())
    flat = " ".join(doc.split())
    honest = [c for c in out["clients"] if c["role"] == "honest"]
    bad = [c for c in out["clients"] if c["role"] != "honest"]
    for quote in (
        f"highest attacker {max(c['cumulative_score'] for c in bad)},",
        f"lowest honest {min(c['cumulative_score'] for c in honest)}",
        f"Spearman(honest size, score) {out['spearman_honest_size_vs_score']} ",
        f"Final accuracy {out['final_accuracy']}.",
        f"{out['utility_evaluations']} utility evaluations over "
        f"{out['valued_rounds']} valued rounds ({out['truncated_rounds']} of them",
        f"{out['seconds']} s of accounting, {out['wall_seconds']} s for the whole",
    ):
        assert quote in flat, quote

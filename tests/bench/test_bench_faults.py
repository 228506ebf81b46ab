"""bench/faults.py: the coordinator SIGKILLed at random moments and restarted
loses no completed round, records no update twice, passes ``fedplat store
check`` and ends within a point of the same run undisturbed; and
docs/security.md quotes the committed faults.json."""

from __future__ import annotations

import json

import pytest

from tests.support import REPO, run_bench


def _check(res: dict, kills: int) -> None:
    assert res["kills"] == kills, res["disturbed"]["kill_moments"]
    assert res["lost_rounds"] == 0, res["disturbed"]["lost_round_numbers"]
    assert res["duplicate_updates"] == 0
    assert res["store_check"] == "ok"
    assert res["completed_rounds"] == res["setup"]["rounds"]
    assert res["disturbed"]["run_status"] == "completed"
    # Restarts resumed the one run (none started another); a restart killed
    # before it opened the store leaves no ``run_resumed`` event, so only the
    # last one is sure to.
    assert res["disturbed"]["runs_in_store"] == 1
    assert res["disturbed"]["run_resumed_events"] >= 1
    assert res["accuracy_gap_points"] <= 1.0
    assert res["goal_met"] is True


@pytest.mark.integration  # starts real processes
@pytest.mark.timeout(1800)  # a loaded host takes minutes per run
def test_tiny_kills_lose_nothing(tmp_path_factory: pytest.TempPathFactory) -> None:
    out = tmp_path_factory.mktemp("faults") / "faults.json"
    res = run_bench("bench.faults", out, timeout=1800)
    assert res["tiny"] is True
    _check(res, 2)


@pytest.mark.slow  # 20 kills, 8 client processes, two runs (~20 minutes)
@pytest.mark.timeout(3700)
def test_twenty_kills_lose_nothing(tmp_path_factory: pytest.TempPathFactory) -> None:
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("faults") / "faults.json"
    subprocess.run(
        [sys.executable, "-m", "bench.faults", "--out", str(out)],
        cwd=REPO,
        check=True,
        timeout=3600,
    )
    _check(json.loads(out.read_text()), 20)


def test_docs_quote_the_committed_results(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))  # bench/ is not an installed package
    from bench.faults import RESULTS, render_markdown

    doc = (REPO / "docs" / "security.md").read_text()
    begin, end = "<!-- faults-table:begin -->\n", "<!-- faults-table:end -->"
    quoted = doc[doc.index(begin) + len(begin) : doc.index(end)]
    assert quoted == render_markdown(json.loads(RESULTS.read_text()))

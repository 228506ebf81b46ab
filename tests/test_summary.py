"""The end-of-run summary (``fedplat coordinator`` prints it, the monitor shows
it) on the monitor's fixture store, whose every number is known by construction."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fedplat.store import ContributionRecord, Store, StoreError, Verdict
from fedplat.summary import (
    FlaggedClient,
    export_command,
    flag_labels,
    format_bytes,
    run_summary,
    summary_lines,
    verdict,
)
from tests.support.ui_fixture import ACCURACY, build_fixture_db


@pytest.fixture(scope="module")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    path = tmp_path_factory.mktemp("summary") / "runs.db"
    return path, build_fixture_db(path)


def test_a_completed_run(fixture: tuple[Path, dict[str, str]]) -> None:
    path, ids = fixture
    with Store(str(path), migrate=False) as store:
        s = run_summary(store, ids["digits-done"])
    assert (s.run_name, s.status, s.reason) == ("digits-done", "completed", None)
    assert (s.rounds_completed, s.total_rounds, s.final_round) == (3, 3, 3)
    assert (s.final_accuracy, s.accuracy_round) == (ACCURACY[-1], 3)
    assert (s.best_accuracy, s.best_round) == (max(ACCURACY), 3)
    # Every round of the fixture: 4 clients download 4000 B each and client c_i
    # sends 1000 + i B (the late and the rejected upload cost bytes too).
    assert s.bytes_down == 3 * 4 * 4000
    assert s.bytes_up == 3 * (1000 + 1001 + 1002 + 1003)
    assert s.epsilon == 1.5 and s.delta is None  # the fixture states no delta
    assert s.flagged == (
        FlaggedClient("c1", "client-c1", 1, ("flagged",)),
        FlaggedClient("c2", "client-c2", 1, ("suspect",)),
        FlaggedClient("c3", "client-c3", 1, ("excluded",)),
    )
    assert s.ledger.state == "verified" and s.ledger.entries == 12
    assert s.model_path == "/checkpoints/digits-done/round-00003.safetensors"

    lines = summary_lines(s)
    assert lines[0] == "run 'digits-done' completed: 3/3 rounds"
    assert "  accuracy: final 83.00% (round 3), best 83.00% (round 3)" in lines
    assert "  traffic: 11.7 KiB up, 46.9 KiB down" in lines
    assert "  privacy: epsilon 1.5" in lines
    assert (
        "  flagged clients: client-c1 (flagged in 1 round), "
        "client-c2 (suspect in 1 round), client-c3 (excluded in 1 round)"
    ) in lines
    assert lines[-2].startswith("  ledger: verified: 12 entries, chain intact (signed")
    assert lines[-1] == (
        "  model: /checkpoints/digits-done/round-00003.safetensors (round 3)"
    )
    assert export_command(s, "runs/my db.db") == (
        "fedplat export --db 'runs/my db.db' --run digits-done "
        "--format safetensors --out digits-done.safetensors"
    )
    assert export_command(s, "x.db", "torch").endswith("--out digits-done.pt")  # type: ignore[union-attr]


def test_a_failed_run_without_a_model(fixture: tuple[Path, dict[str, str]]) -> None:
    path, ids = fixture
    with Store(str(path), migrate=False) as store:
        s = run_summary(store, ids["digits-failed"])
        with pytest.raises(StoreError, match="unknown run"):
            run_summary(store, "nope")
    assert s.status == "failed" and s.reason is not None
    assert (s.final_round, s.model_path, s.final_accuracy, s.epsilon) == (
        None,
        None,
        None,
        None,
    )
    assert s.flagged == ()  # stragglers are not judged
    assert s.ledger.state == "empty"
    lines = summary_lines(s)
    assert lines[0].startswith("run 'digits-failed' failed: 0/3 rounds (round 1 ")
    assert "  accuracy: not evaluated" in lines
    assert "  flagged clients: none" in lines
    assert not any(line.startswith("  privacy") for line in lines)
    assert lines[-1] == "  model: no completed round, nothing to export"
    assert export_command(s, "x.db") is None


def test_unbounded_epsilon_is_said_so(tmp_path: Path) -> None:
    with Store(str(tmp_path / "e.db")) as store:
        run = store.create_run("dp", {"privacy": {"delta": 1e-5}}, {}, 2)
        store.add_metric(run.id, "privacy.epsilon", 2.0, round_number=1)
        store.add_metric(run.id, "privacy.epsilon_unbounded", 1.0, round_number=2)
        s = run_summary(store, run.id)
    assert s.epsilon == math.inf and s.delta == 1e-5
    assert "  privacy: epsilon unbounded at delta 1e-05" in summary_lines(s)


def test_routine_dp_clipping_flags_nobody() -> None:
    assert verdict("succeeded", Verdict(1.0, True, None, ("dp-clipped",))) == (
        "accepted"
    )
    both = Verdict(1.0, True, None, ("dp-clipped", "clipped"))
    assert verdict("succeeded", both) == "flagged"
    suspect = ContributionRecord("r", 1, "c", None, {}, True, ())
    assert verdict("succeeded", Verdict(1.0, True), suspect) == "suspect"


def _contribution(suspect: bool, flags: tuple[str, ...] = ()) -> ContributionRecord:
    return ContributionRecord("run", 1, "c", None, {}, suspect, flags)


@pytest.mark.parametrize(
    ("status", "v", "contribution", "expected"),
    [
        ("succeeded", Verdict(), None, "not aggregated"),
        ("succeeded", Verdict(1.0, True, 1.0), None, "accepted"),
        ("succeeded", Verdict(1.0, True, None, ("clipped",)), None, "flagged"),
        ("succeeded", Verdict(0.0, False, None, ("krum",)), None, "excluded"),
        ("succeeded", Verdict(0.0, False), _contribution(True), "suspect"),
        ("succeeded", Verdict(1.0, True), _contribution(False), "accepted"),
        ("late", Verdict(), None, "straggler"),
        ("dropped", Verdict(), None, "straggler"),
        ("rejected", Verdict(), None, "rejected"),
        # Written at close: a client still "downloaded" never sent its update.
        ("downloaded", Verdict(), None, "straggler"),
        ("selected", Verdict(), None, "straggler"),
    ],
)
def test_verdict(
    status: str, v: Verdict, contribution: ContributionRecord | None, expected: str
) -> None:
    assert verdict(status, v, contribution) == expected


def test_flag_labels_merge_without_aggregator_duplicates() -> None:
    v = Verdict(1.0, True, None, ("clipped",))
    c = _contribution(False, ("agg:clipped", "zero-update", "clipped"))
    assert flag_labels(v, c) == ["clipped", "zero-update"]


def test_format_bytes() -> None:
    assert format_bytes(None) == "-"
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 * 1024**3) == "3.0 GiB"

"""bench/vs_flower.py: its goals on hand-made rows, and its tiny mode checking
the direction of the headline claims (fedplat well ahead of Flower's
deployment engine, the loopback floor below everything)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import REPO, run_bench


@pytest.fixture(autouse=True)
def _bench_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))


def test_round_time_is_the_gap_between_completions() -> None:
    from bench.fleet import intervals

    assert intervals([10.0, 10.5, 11.5, 11.75]) == [0.5, 1.0, 0.25]
    assert intervals([3.0]) == []


def test_clients_are_split_over_processes() -> None:
    from bench.vs_flower import _split

    assert _split(4, 1) == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert _split(5, 2) == [(0, 2), (2, 2), (4, 1)]


def test_rows_take_medians_and_judge_every_goal() -> None:
    from bench.vs_flower import Measured, make_row, summary

    def rep(f: float, emb: float, dep: float, floor: float) -> dict[str, Measured]:
        return {
            "fedplat": Measured([f, f], 500.0, ["python"]),
            "flower_embedded": Measured([emb], 400.0, ["python"]),
            "flower_deployment": Measured([dep], 150.0, ["flower-superlin"]),
            "loopback_floor": Measured([floor], 30.0, ["python"]),
            "grpc_floor": Measured([2 * floor], 40.0, ["python"]),
        }

    row = make_row(
        1_000_000,
        4,
        [rep(0.2, 0.3, 7.0, 0.05), rep(0.4, 0.3, 6.0, 0.1), rep(0.3, 0.2, 8.0, 0.1)],
    )
    assert row["bytes_per_round"] == 4 * 2 * 4_000_000
    assert row["fedplat_round_s"] == 0.3 and row["flower_embedded_round_s"] == 0.3
    assert row["flower_deployment_round_s"] == 7.0 and row["loopback_floor_s"] == 0.1
    g = row["goals"]
    assert g["speedup_vs_deployment"] == pytest.approx(7.0 / 0.3, abs=0.01)
    assert g["speedup_vs_deployment_met"] and g["no_slower_than_embedded_met"]
    assert g["floor_ratio"] == 3.0 and g["within_3x_of_floor_met"]
    # The gRPC floor's ratios are reported, not judged.
    assert row["grpc_floor_s"] == 0.2
    assert g["grpc_floor_ratio_vs_loopback"] == 2.0
    assert g["fedplat_ratio_vs_grpc_floor"] == 1.5
    assert not g["memory_no_more_than_embedded_met"]  # 500 MB > 400 MB
    assert len(row["repetitions"]) == 3
    assert summary([row]) == {
        "speedup_vs_deployment_met": True,
        "no_slower_than_embedded_met": True,
        "within_3x_of_floor_met": True,
        "memory_no_more_than_embedded_met": False,
    }


@pytest.mark.integration
def test_tiny_run_shows_the_direction_of_the_claims(tmp_path: Path) -> None:
    data = run_bench("bench.vs_flower", tmp_path / "vs.json", timeout=900)
    assert data["tiny"] is True
    (row,) = data["rows"]
    for key in ("fedplat", "flower_embedded", "flower_deployment"):
        assert row[f"{key}_peak_rss_mb"] > 0
    # The deployment engine starts a process per message: fedplat is far ahead.
    assert row["goals"]["speedup_vs_deployment"] > 2.0
    # Nothing beats moving the bytes alone.
    assert row["loopback_floor_s"] < row["fedplat_round_s"]
    assert row["loopback_floor_s"] < row["flower_embedded_round_s"]
    # Bare gRPC moves the bytes faster than fedplat's whole round.
    assert 0 < row["grpc_floor_s"] < row["fedplat_round_s"]
    rep = row["repetitions"][0]
    assert len(rep["fedplat"]["round_s"]) == data["setup"]["rounds"] - 1
    assert any("flower" in p for p in rep["flower_deployment"]["server_processes"])


def test_doc_block_quotes_the_row_and_says_which_goals_were_missed() -> None:
    from bench.docs_fleet import vs_flower_block
    from bench.vs_flower import FULL, Measured, deviations, make_row, summary

    rep = {
        "fedplat": Measured([0.3], 500.0, ["python"]),
        "flower_embedded": Measured([0.2], 400.0, ["python"]),
        "flower_deployment": Measured([6.0], 150.0, ["flower-superlin"]),
        "loopback_floor": Measured([0.0075], 30.0, ["python"]),
        "grpc_floor": Measured([0.025], 40.0, ["python"]),
    }
    row = make_row(1_000_000, 4, [rep])
    setup = {
        "rounds": 6,
        "repetitions": 2,
        "loadavg_start": [1.5, 1, 1],
        "loadavg_end": [3.0, 2, 2],
        "deviations": deviations(FULL, False, 1),
    }
    data = {"rows": [row], "goals": summary([row]), "setup": setup}
    text = vs_flower_block({**data, "repetitions_completed": 1})
    assert "median over 1 interleaved repetition(s)" in text
    cells = "| 4 x 1M | 0.3 s | 0.2 s | 6 s | 7.5 ms | 0.025 s | 40.0x | 20.0x "
    cells += "| 0.667x |"
    assert cells in text
    assert "- 4 x 1M: gRPC floor / loopback 3.33x, fedplat / gRPC floor 12.0x" in text
    assert "| 500 / 400 / 150 MB |" in text
    assert "- speedup vs deployment: met" in text
    assert "- within 3x of floor: **missed**" in text
    assert "- no slower than embedded: **missed**" in text
    assert "1 of 3 repetitions completed" in text

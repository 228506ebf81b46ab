"""``fedplat gossip sim`` and the disruption bench, end to end on digits."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fedplat.cli import main
from tests.support import REPO

EXAMPLES = REPO / "examples" / "scenarios"


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_gossip_sim_cli_writes_summary_and_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedplat.store import Store

    out = tmp_path / "summary.json"
    db = tmp_path / "g.db"
    rc = main(
        [
            "gossip",
            "sim",
            "--scenario",
            str(EXAMPLES / "ring_kill.toml"),
            "--store",
            str(db),
            "--output",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["scenario"] == "ring-kill" and printed["alive"] == 7
    summary = json.loads(out.read_text())
    assert len(summary["accuracy_per_round"]) == 16
    assert [c["kind"] for c in summary["changes"]] == [
        "gossip_node_removed",
        "gossip_node_rejoined",
    ]
    assert summary["changes"][0]["nodes"] == [2, 5]
    with Store(str(db)) as store:
        run = store.get_run(summary["run_id"])
        assert run is not None and run.status == "completed"
        assert run.config["mode"] == "gossip"


def test_gossip_sim_cli_reports_scenario_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: x\nrounds: 3\ntopology: {kind: ring, n: 4}\n"
        "events: [{round: 1, action: remove_nodes, nodes: [7]}]\n"
    )
    assert main(["gossip", "sim", "--scenario", str(bad), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "events.0 (remove_nodes): nodes [7] do not exist" in err


def test_disruption_bench_smoke(tmp_path: Path) -> None:
    from bench.gossip_disruption import main as bench

    out = tmp_path / "g.json"
    assert (
        bench(
            [
                "--dataset",
                "digits",
                "--nodes",
                "12",
                "--rounds",
                "3",
                "--at",
                "1",
                "--fractions",
                "0.25",
                "--hidden",
                "16",
                "--lr",
                "0.1",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    data = json.loads(out.read_text())
    assert set(data) == {"rows", "baseline_accuracy", "setup"}
    assert len(data["rows"]) == 4  # degree/random x with/without data
    for row in data["rows"]:
        assert set(row) == {
            "removed_fraction",
            "removal",
            "with_data",
            "final_mean_accuracy",
            "final_min_accuracy",
            "components",
        }
    assert 0 < data["baseline_accuracy"] <= 1

"""``fedplat demo``: what it says while nothing completes, where it writes."""

from __future__ import annotations

from pathlib import Path

from fedplat.demo import DemoArgs, _activity
from fedplat.store import Store


def test_activity_reads_the_coordinators_heartbeat(tmp_path: Path) -> None:
    with Store(f"sqlite:///{tmp_path / 's.db'}") as store:
        run = store.create_run("demo-x", {}, {}, 20)
        assert _activity(store, run.id, 0, 20) == "waiting for clients: 0 enrolled"
        store.heartbeat(run.id, phase="waiting_for_clients", live_clients=0)
        assert _activity(store, run.id, 0, 20) == "waiting for clients: 0 enrolled"
        store.heartbeat(run.id, phase="training", live_clients=7)
        assert (
            _activity(store, run.id, 2, 20)
            == "round 3/20: training (7 clients connected)"
        )
        store.heartbeat(run.id, phase="aggregating", live_clients=7)
        assert _activity(store, run.id, 2, 20).startswith("round 3/20: aggregating")


def test_the_summary_goes_under_the_work_directory_by_default() -> None:
    # A committed file (bench/results/demo.json) is written only by bench/demo.py.
    assert DemoArgs().output is None and DemoArgs().workdir == "runs/demo"

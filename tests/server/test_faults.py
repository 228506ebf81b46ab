"""Faults with real processes: a client killed mid-round, a coordinator SIGKILLed and
restarted."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

from fedplat.store import Store
from fedplat.store.check import check_store
from fedplat.transport.health import wait_healthy
from tests.support import REPO, Procs, issue_tokens, run_config, wait_for, write_config

pytestmark = pytest.mark.integration  # starts real processes


def _store(cfg: dict) -> Store:
    return Store(cfg["store"]["url"], migrate=False)


def test_client_killed_mid_round_does_not_stall_past_deadline(
    tmp_path: Path, procs: Procs
) -> None:
    deadline = 15.0
    cfg = run_config(
        tmp_path,
        rounds=1,
        clients=4,
        quorum=3,
        min_available=4,
        deadlines={"round_seconds": deadline, "liveness_seconds": 5},
    )
    address = cfg["server"]["address"]
    coord = procs.coordinator(write_config(tmp_path, cfg))
    wait_healthy(address, 180)
    # The slow client enrols first, so it is live when round 1 selects all four.
    tokens = issue_tokens(cfg, 4)
    slow = procs.start(
        "slow", [str(REPO / "tests/apps/slow_client.py"), address, "600", tokens[3]]
    )
    for i in range(3):
        procs.client(address, i, 3, token=tokens[i])
    wait_for(
        lambda: "training started" in procs.log("slow"),
        180,
        "the slow client to start training",
        procs=procs,
    )
    store = _store(cfg)
    run = store.get_run_by_name("test")
    assert run is not None
    r1 = store.get_round(run.id, 1)
    assert r1 is not None and r1.num_selected == 4
    slow.send_signal(signal.SIGKILL)
    killed_at = time.time()
    wait_for(lambda: coord.poll() is not None, 180, "the run to finish", procs=procs)
    assert coord.returncode == 0, procs.log("coordinator")
    r1 = store.get_round(run.id, 1)
    assert r1 is not None and r1.status == "completed" and r1.num_succeeded == 3
    assert r1.finished_at is not None and r1.started_at is not None
    # Closed by its deadline, not later (generous slack for a loaded CI machine).
    assert (r1.finished_at - r1.started_at).total_seconds() < deadline + 10
    assert r1.finished_at.timestamp() < killed_at + deadline + 10
    statuses = sorted(p.status for p in store.list_participations(run.id, 1))
    assert statuses == ["dropped", "succeeded", "succeeded", "succeeded"]
    assert store.list_events(run.id, kind="client_dropped")
    store.close()


def test_coordinator_sigkill_restart_resumes_from_last_round(
    tmp_path: Path, procs: Procs
) -> None:
    cfg = run_config(
        tmp_path,
        rounds=5,
        clients=3,
        client_training={"epochs": 3, "batch_size": 16, "lr": 0.1},
    )
    address = cfg["server"]["address"]
    cfg_path = write_config(tmp_path, cfg)
    coord = procs.coordinator(cfg_path)
    wait_healthy(address, 180)
    tokens = issue_tokens(cfg, 3)
    clients = [procs.client(address, i, 3, token=tokens[i]) for i in range(3)]
    store = _store(cfg)

    def completed() -> int:
        run = store.get_run_by_name("test")
        return 0 if run is None else run.current_round

    wait_for(lambda: completed() >= 2, 240, "two completed rounds", procs=procs)
    coord.send_signal(signal.SIGKILL)
    coord.wait(timeout=10)
    done_before = completed()
    run = store.get_run_by_name("test")
    assert run is not None and run.status == "running"
    acc_before = store.get_round(run.id, done_before).accuracy

    coord2 = procs.coordinator(cfg_path, name="coordinator-restarted")
    wait_for(
        lambda: coord2.poll() is not None, 300, "the resumed run to finish", procs=procs
    )
    assert coord2.returncode == 0, procs.log("coordinator-restarted")
    for c in clients:  # the same client processes reconnected and finished
        assert c.wait(timeout=60) == 0
    run = store.get_run_by_name("test")
    assert run is not None and run.status == "completed" and run.current_round == 5
    rounds = store.list_rounds(run.id)
    assert [r.number for r in rounds] == [1, 2, 3, 4, 5]
    assert all(r.status == "completed" for r in rounds)
    resumed = store.list_events(run.id, kind="run_resumed")
    assert resumed and f"after round {done_before}" in resumed[0].message
    # Finished rounds were not redone: their checkpoints' accuracy is unchanged and
    # the run continued from the stored model (no restart from scratch).
    assert store.get_round(run.id, done_before).accuracy == acc_before
    assert rounds[-1].accuracy > rounds[0].accuracy
    log0 = procs.log("client-0")
    assert "unavailable" in log0.lower()  # it saw the coordinator go away
    ids = re.findall(r"enrolled in run test as (\w+)", log0)
    assert len(ids) == 2 and ids[0] == ids[1]  # and came back as itself
    assert check_store(store) == []
    store.close()

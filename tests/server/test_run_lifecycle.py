"""A coordinator process across restarts and failures: a larger ``run.rounds``
extends a completed run; a round loop that cannot write its checkpoint marks the
run failed with the reason, logs one line and exits non-zero."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedplat.store import Store
from fedplat.store.check import check_store
from fedplat.transport.health import wait_healthy
from tests.support import Procs, issue_tokens, run_config, wait_for, write_config

pytestmark = pytest.mark.integration  # starts real processes


def _store(cfg: dict) -> Store:
    return Store(cfg["store"]["url"], migrate=False)


def test_a_larger_run_rounds_extends_a_completed_run(
    tmp_path: Path, procs: Procs
) -> None:
    cfg = run_config(tmp_path, rounds=2, clients=2)
    address = cfg["server"]["address"]
    path = write_config(tmp_path, cfg)
    coord = procs.coordinator(path)
    wait_healthy(address, 180)
    tokens = issue_tokens(cfg, 2)
    state = [tmp_path / f"state-{i}" for i in range(2)]
    first = [
        procs.client(address, i, 2, "--state-dir", str(state[i]), token=tokens[i])
        for i in range(2)
    ]
    wait_for(lambda: coord.poll() is not None, 240, "the first run", procs=procs)
    assert coord.returncode == 0 and all(c.wait(60) == 0 for c in first)
    store = _store(cfg)
    run = store.get_run_by_name("test")
    assert run is not None and run.status == "completed" and run.current_round == 2
    before = store.list_participations(run.id, 2)

    # The README's override: the same run file, FEDPLAT__RUN__ROUNDS=3.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FEDPLAT__RUN__ROUNDS", "3")
        coord = procs.coordinator(path, name="coordinator-extended")
    wait_healthy(address, 180)
    # The same clients come back as themselves (no new token needed).
    again = [
        procs.client(address, i, 2, "--state-dir", str(state[i])) for i in range(2)
    ]
    wait_for(lambda: coord.poll() is not None, 240, "the extension", procs=procs)
    assert coord.returncode == 0, procs.log("coordinator-extended")
    assert all(c.wait(60) == 0 for c in again)
    run = store.get_run(run.id)
    assert run is not None and run.status == "completed"
    assert run.current_round == 3 and run.total_rounds == 3
    rounds = store.list_rounds(run.id)
    assert [(r.number, r.status) for r in rounds] == [
        (1, "completed"),
        (2, "completed"),
        (3, "completed"),
    ]
    assert store.list_participations(run.id, 2) == before  # history untouched
    extended = store.list_events(run.id, kind="run_extended")
    assert extended and "2 -> 3" in extended[0].message
    assert len(store.list_clients(run.id)) == 2
    assert check_store(store) == []
    store.close()


def test_a_checkpoint_that_cannot_be_written_fails_the_run_loudly(
    tmp_path: Path, procs: Procs
) -> None:
    cfg = run_config(tmp_path, rounds=3, clients=2)
    address = cfg["server"]["address"]
    coord = procs.coordinator(write_config(tmp_path, cfg))
    wait_healthy(address, 180)
    store = _store(cfg)
    run = store.get_run_by_name("test")
    assert run is not None
    # The run's checkpoint folder becomes unusable after the start-up check
    # (as a full or unmounted disk would): a file stands where it must be made.
    (Path(cfg["checkpoints"]["dir"]) / run.id).write_text("in the way")
    tokens = issue_tokens(cfg, 2)
    for i in range(2):
        procs.client(address, i, 2, token=tokens[i])
    wait_for(
        lambda: coord.poll() is not None, 240, "the coordinator to stop", procs=procs
    )
    assert coord.returncode == 1
    run = store.get_run(run.id)
    assert run is not None and run.status == "failed"
    assert run.reason is not None and "cannot write in" in run.reason
    assert "not a folder" in run.reason
    failed = store.list_events(run.id, kind="run_failed")
    assert failed and "cannot write in" in failed[0].message
    log = procs.log("coordinator")
    assert "Traceback" not in log
    errors = [ln for ln in log.splitlines() if " ERROR " in ln]
    assert any("cannot write in" in ln for ln in errors), log[-2000:]
    # Nothing of the round was recorded: round 1 stays open, the store checks.
    assert store.last_completed_round(run.id) is None
    assert check_store(store) == []
    store.close()

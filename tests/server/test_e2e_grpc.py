"""End to end over real gRPC: a coordinator process and 4 client processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedplat.store import Store
from fedplat.store.check import check_store
from fedplat.transport.health import wait_healthy
from tests.support import Procs, issue_tokens, run_config, wait_for, write_config

pytestmark = pytest.mark.integration  # starts real processes


def test_four_client_processes_three_rounds(tmp_path: Path, procs: Procs) -> None:
    cfg = run_config(tmp_path, rounds=3, clients=4)
    address = cfg["server"]["address"]
    coord = procs.coordinator(write_config(tmp_path, cfg))
    wait_healthy(address, 180)
    tokens = issue_tokens(cfg, 4)
    clients = [procs.client(address, i, 4, token=tokens[i]) for i in range(4)]
    wait_for(lambda: coord.poll() is not None, 240, "the run to finish", procs=procs)
    assert coord.returncode == 0, procs.log("coordinator")
    for c in clients:  # clients hear FINISHED and exit cleanly
        assert c.wait(timeout=60) == 0

    store = Store(cfg["store"]["url"], migrate=False)
    run = store.get_run_by_name("test")
    assert run is not None and run.status == "completed" and run.current_round == 3
    rounds = store.list_rounds(run.id)
    assert [r.number for r in rounds] == [1, 2, 3]
    assert all(r.status == "completed" and r.num_succeeded == 4 for r in rounds)
    acc = [r.accuracy for r in rounds]
    assert acc[2] > acc[0] + 0.05, acc
    parts = store.list_participations(run.id)
    assert len(parts) == 12
    assert all(
        p.status == "succeeded"
        and p.bytes_up > 0
        and p.bytes_down > 0
        and p.num_examples > 0
        for p in parts
    )
    # 1797 digits, 80% train split over 4 partitions
    assert sum(p.num_examples for p in parts if p.round_number == 1) == 1437
    assert check_store(store) == []
    assert len(store.list_clients(run.id)) == 4
    assert all(Path(r.checkpoint_path).exists() for r in rounds[-1:])
    store.close()

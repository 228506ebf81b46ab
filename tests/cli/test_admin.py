"""``fedplat clients list``: the states the monitor shows (fedplat.ui.status)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedplat.cli import main
from fedplat.store import Store


def _states(db: str, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    assert main(["clients", "list", "--db", db, "--run", "r"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    return {r[0]: r[1] for r in rows}


def test_clients_list_says_what_the_monitor_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "s.db")
    with Store(db) as store:
        run = store.create_run("r", {}, {}, 3)
        store.update_run(run.id, status="running")
        store.heartbeat(run.id, phase="training", live_clients=2)
        for cid in ("a", "b"):
            store.upsert_client(run.id, cid, name=cid, num_examples=10)
    assert _states(db, capsys) == {"a": "active", "b": "active"}
    assert main(["clients", "revoke", "b", "--db", db, "--run", "r"]) == 0
    capsys.readouterr()
    with Store(db) as store:
        store.update_run(run.id, status="completed")
    # The run ended: its clients are finished, not "active" (the stored row).
    assert _states(db, capsys) == {"a": "finished", "b": "revoked"}

"""The monitor's fixture store holds a run in every state the pages render."""

from __future__ import annotations

from pathlib import Path

from fedplat.store import Store
from tests.support.ui_fixture import ACCURACY, build_fixture_db


def test_fixture_db_has_every_state(tmp_path: Path) -> None:
    ids = build_fixture_db(tmp_path / "m.db")
    with Store(str(tmp_path / "m.db"), migrate=False) as store:
        status = {r.name: r.status for r in store.list_runs()}
        assert status == {
            "digits-done": "completed",
            "digits-live": "running",
            "digits-failed": "failed",
            "digits-pending": "pending",
            "gossip-ring": "running",
        }
        done = store.list_rounds(ids["digits-done"])
        assert [r.accuracy for r in done] == ACCURACY
        assert [r.status for r in store.list_rounds(ids["digits-live"])] == [
            "completed",
            "open",
        ]

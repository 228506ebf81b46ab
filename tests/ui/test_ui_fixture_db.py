"""The monitor's fixture store holds a run in every state the pages render."""

from __future__ import annotations

from pathlib import Path

from fedplat.store import Store
from fedplat.store.check import check_store
from tests.support.ui_fixture import ACCURACY, CLIENTS, build_fixture_db


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
        assert [(r.num_succeeded, r.num_failed) for r in done] == [
            (4, 0),
            (3, 1),
            (3, 1),
        ]
        verdicts = {
            (p.round_number, p.client_id): p.verdict
            for p in store.list_participations(ids["digits-done"])
        }
        assert verdicts[(3, "c3")].selected is False
        assert verdicts[(2, "c1")].flags == ("clipped",)
        contributions = store.list_contributions(ids["digits-done"])
        assert len(contributions) == len(ACCURACY) * len(CLIENTS)
        assert [(c.round_number, c.client_id) for c in contributions if c.suspect] == [
            (2, "c2")
        ]
        assert len(store.list_ledger_entries(ids["digits-done"])) == 12

        live = ids["digits-live"]
        assert [r.status for r in store.list_rounds(live)] == ["completed", "open"]
        # An open round holds nothing until it closes; the heartbeat says more.
        assert store.list_participations(live, 2) == []
        run = store.get_run(live)
        assert run is not None and (run.phase, run.live_clients) == ("training", 3)
        assert store.list_contributions(live) == []

        failed = store.get_run(ids["digits-failed"])
        assert failed is not None and failed.reason is not None
        assert "quorum not reached" in failed.reason

        # Written only through the Store API, the fixture holds every invariant
        # that `fedplat store check` verifies.
        assert [str(p) for p in check_store(store)] == []

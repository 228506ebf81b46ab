"""The clients table: displayed states and last contact on the monitor's fixture
store, and the clients page's filters."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
from fedplat.ui import data, status
from fedplat.ui.clients import ClientFilter, clients_frame, filter_clients

from fedplat.store import Store
from tests.support.ui_fixture import build_fixture_db, keep_alive


def test_filter_clients() -> None:
    frame = pd.DataFrame(
        {
            "client_id": ["a1", "b2", "c3"],
            "name": ["alpha", "Beta", "gamma"],
            "state": ["active", "idle", "lost"],
            "rounds_joined": [5, 2, 0],
            "flagged_rounds": [0, 1, 3],
        }
    )

    def ids(f: ClientFilter) -> list[str]:
        return list(filter_clients(frame, f)["client_id"])

    assert ids(ClientFilter()) == ["a1", "b2", "c3"]
    assert ids(ClientFilter(states=("idle", "lost"))) == ["b2", "c3"]
    assert ids(ClientFilter(name_contains=" beta ")) == ["b2"]
    assert ids(ClientFilter(name_contains="3")) == ["c3"]
    assert ids(ClientFilter(min_rounds_joined=2)) == ["a1", "b2"]
    assert ids(ClientFilter(flagged_only=True, min_rounds_joined=1)) == ["b2"]


def test_clients_frame_shows_derived_states_and_last_contact(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    ids = build_fixture_db(path)
    keep_alive(path, ids)
    now = datetime.now(UTC)
    with Store(str(path), migrate=False) as store:
        frames = {}
        for name in ("digits-done", "digits-live", "digits-waiting", "digits-crashed"):
            run = store.get_run(ids[name])
            assert run is not None
            clients = store.list_clients(run.id)
            parts = data.participations_frame(
                store.list_participations(run.id), clients
            )
            view = status.run_view(run, now)
            frames[name] = clients_frame(clients, parts, run=view, now=now)
    states = {
        n: dict(zip(f["client_id"], f["state"], strict=True)) for n, f in frames.items()
    }
    assert set(states["digits-done"].values()) == {"finished"}
    assert set(states["digits-live"].values()) == {"active"}
    assert states["digits-waiting"] == {"w0": "active", "w1": "active", "w2": "lost"}
    assert states["digits-crashed"] == {"x0": "interrupted", "x1": "lost"}
    waiting = frames["digits-waiting"].set_index("client_id")
    assert waiting.loc["w2", "seen"].startswith("10m ")
    assert waiting.loc["w2", "status"] == "enrolled"  # the stored column, unchanged

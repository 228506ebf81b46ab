"""Contribution accounting wired into the round engine: ledger written per round,
verifiable with ``fedplat ledger verify``; a label-flipper scores below the honest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedplat.client import Client
from fedplat.server.config import parse_config

from fedplat.cli import main
from fedplat.sim import simulate
from fedplat.store import Store
from tests.support import digits_client, run_config


def test_ledger_through_the_engine(tmp_path: Path, capsys: Any) -> None:
    n = 5
    cfg = parse_config(
        run_config(
            tmp_path,
            rounds=3,
            clients=n,
            client_training={"epochs": 2, "lr": 0.1},
            contribution={
                "enabled": True,
                "scorers": ["leave_one_out", "cosine"],
                "primary": "leave_one_out",
                "budget": 100.0,
                "key_path": str(tmp_path / "ledger.pem"),
                "gtg": {"round_truncation": 0.0},
            },
        )
    )

    def build(i: int, factory: Any) -> Client:
        client: Client = digits_client(i, factory, n, label_flip=(i == 0))
        return client

    res = simulate(cfg, build, n)
    assert all(r.completed for r in res.rounds)
    store = Store(cfg.store.url, migrate=False)
    entries = store.list_ledger_entries(res.run_id)
    assert len(entries) == 3 * n
    names = {c.id: c.name for c in store.list_clients(res.run_id)}
    # The last round's entries carry each client's cumulative contribution.
    last = [json.loads(e.payload_json) for e in entries if e.round_number == 3]
    by_name = {names[p["client_id"]]: p["cumulative"] for p in last}
    honest = [v for k, v in by_name.items() if k != "c0"]
    assert by_name["c0"] < min(honest), by_name
    shares = {names[p["client_id"]]: p["reward_share"] for p in last}
    assert shares["c0"] == 0.0 and abs(sum(shares.values()) - 1.0) < 1e-9
    store.close()
    assert main(["ledger", "verify", "--db", cfg.store.url, "--run", "test"]) == 0
    assert "OK" in capsys.readouterr().out

"""Contribution accounting through the real coordinator (in-process clients, the
in-memory transport): each completed round stores one contributions row per
aggregated client, its ledger entries (verifiable with ``fedplat ledger verify``)
and metrics in the round's closing transaction; the store's invariants hold; a
label-flipper and a free-rider score below every honest client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fedplat.client import Client, FitResult
from fedplat.server.config import RunConfig, parse_config

from fedplat.cli import main
from fedplat.sim import simulate
from fedplat.store import Store
from fedplat.store.check import check_store
from tests.support import digits_client, run_config

N = 6
ROUNDS = 3
FLIPPER, FREE_RIDER = "c0", "c5"


@dataclass(frozen=True)
class Run:
    cfg: RunConfig
    run_id: str
    store: Store
    names: dict[str, str]  # client id -> name


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("contribution")
    cfg = parse_config(
        run_config(
            tmp,
            rounds=ROUNDS,
            clients=N,
            client_training={"epochs": 2, "lr": 0.1},
            contribution={
                "enabled": True,
                "scorers": ["leave_one_out", "cosine"],
                "primary": "leave_one_out",
                "budget": 100.0,
                "key_path": str(tmp / "ledger.pem"),
                "gtg": {"round_truncation": 0.0},
            },
        )
    )

    def build(i: int, factory: Any) -> Client:
        client: Client = digits_client(i, factory, N, label_flip=(i == 0))
        if client.name == FREE_RIDER:  # sends the global model back untouched
            client.train_fn = lambda model, config: FitResult(client.num_examples)
        return client

    res = simulate(cfg, build, N)
    assert [r.completed for r in res.rounds] == [True] * ROUNDS
    store = Store(cfg.store.url, migrate=False)
    names = {c.id: c.name for c in store.list_clients(res.run_id)}
    yield Run(cfg, res.run_id, store, names)
    store.close()


def test_one_contribution_row_per_aggregated_client_per_round(run: Run) -> None:
    store, run_id = run.store, run.run_id
    for r in range(1, ROUNDS + 1):
        aggregated = {
            p.client_id
            for p in store.list_participations(run_id, r)
            if p.status == "succeeded" and p.verdict.selected is not None
        }
        rows = store.list_contributions(run_id, r)
        assert len(aggregated) == N
        assert sorted(c.client_id for c in rows) == sorted(aggregated)
        # The row and the round's ledger entry say the same, by client id.
        entries = {
            e.client_id: json.loads(e.payload_json)
            for e in store.list_ledger_entries(run_id, round_number=r)
        }
        assert set(entries) == aggregated
        for c in rows:
            e = entries[c.client_id]
            assert (e["round"], e["attempt"]) == (r, 1)
            assert c.score == pytest.approx(e["credit"])
            assert c.scores == pytest.approx(e["scores"])
            assert set(c.scores) == {"leave_one_out", "cosine"}
            assert list(c.flags) == e["flags"] and c.suspect == e["suspect"]
        metrics = {m.name for m in store.list_metrics(run_id) if m.round_number == r}
        assert {"contribution.utility_evaluations", "contribution.seconds"} <= metrics


def test_suspects_get_one_flag_event_each(run: Run) -> None:
    store, run_id = run.store, run.run_id
    events = store.list_events(run_id, kind="contribution_flag")
    suspects = [
        (c.round_number, run.names[c.client_id])
        for c in store.list_contributions(run_id)
        if c.suspect
    ]
    # The free-rider's zero update is caught every round.
    assert {(r, FREE_RIDER) for r in range(1, ROUNDS + 1)} <= set(suspects)
    got = [(e.round_number, run.names[e.client_id or ""]) for e in events]
    assert sorted(got) == sorted(suspects)


def test_attackers_score_below_every_honest_client(run: Run) -> None:
    entries = run.store.list_ledger_entries(run.run_id, round_number=ROUNDS)
    assert len(run.store.list_ledger_entries(run.run_id)) == ROUNDS * N
    # The last round's entries carry each client's cumulative contribution.
    last = {run.names[e.client_id]: json.loads(e.payload_json) for e in entries}
    cumulative = {name: p["cumulative"] for name, p in last.items()}
    honest = [v for k, v in cumulative.items() if k not in (FLIPPER, FREE_RIDER)]
    assert max(cumulative[FLIPPER], cumulative[FREE_RIDER]) < min(honest), cumulative
    # ... which is the sum of its stored per-round credits.
    for cid, name in run.names.items():
        credits = [c.score for c in run.store.list_contributions(run.run_id, None, cid)]
        assert sum(x for x in credits if x is not None) == pytest.approx(
            cumulative[name]
        )
    shares = {name: p["reward_share"] for name, p in last.items()}
    assert shares[FLIPPER] == shares[FREE_RIDER] == 0.0
    assert sum(shares.values()) == pytest.approx(1.0)


def test_ledger_verifies_and_the_store_checks(run: Run, capsys: Any) -> None:
    assert check_store(run.store) == []
    url = run.cfg.store.url
    assert main(["ledger", "verify", "--db", url, "--run", run.cfg.run.name]) == 0
    assert "OK" in capsys.readouterr().out
    assert main(["store", "check", "--db", url]) == 0


def test_a_restarted_accountant_continues_from_the_stored_ledger(run: Run) -> None:
    from fedplat.contribution import (
        ContributionAccountant,
        ContributionError,
        load_or_create_signing_key,
    )

    c = run.cfg.contribution
    assert c.key_path is not None
    key = load_or_create_signing_key(c.key_path)
    acc = ContributionAccountant(c, run.store, run.run_id, key)
    entries = run.store.list_ledger_entries(run.run_id, round_number=ROUNDS)
    last = {e.client_id: json.loads(e.payload_json) for e in entries}
    standings = {s.client_id: s for s in acc.standings()}
    assert set(standings) == set(last)
    for cid, s in standings.items():
        assert s.rounds == ROUNDS
        assert s.cumulative == pytest.approx(last[cid]["cumulative"])
        assert s.reward_share == pytest.approx(last[cid]["reward_share"])
    with pytest.raises(ContributionError, match="signed with key"):
        ContributionAccountant(c, run.store, run.run_id, None)

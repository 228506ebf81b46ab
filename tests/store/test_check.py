"""``fedplat store check`` (:func:`fedplat.store.check.check_store`): a store
written through the Store API passes; each invariant, broken by hand-editing
rows with raw SQL, is reported. On SQLite and PostgreSQL (see ``conftest.py``).
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedplat.store import ContributionRow, EventRow, ParticipationRow, Store
from fedplat.store.check import Problem, check_store
from tests.support.store import (
    deadline,
    ledger_append,
    ok,
    play_round,
    run_with_clients,
    sql,
)

RUN = "checked"


def _federated_run(store: Store) -> str:
    """Run ``checked``: clients c0..c3; rounds 1 and 2 completed (a rejected
    update, contribution rows and a signed ledger), round 3 open."""
    run = store.create_run(RUN, {"mode": "federated"}, {}, 5)
    for i in range(4):
        store.upsert_client(run.id, f"c{i}", name=f"c{i}", num_examples=10)
    key = Ed25519PrivateKey.generate()
    ledger = ledger_append(run.id, key, [(1, "c0"), (1, "c2")])
    play_round(
        store,
        run.id,
        1,
        (ok("c0", up=5, down=7), ParticipationRow("c1", "rejected"), ok("c2", up=1)),
        accuracy=0.5,
        contributions=(
            ContributionRow("c0", 1.0, {"loo": 1.0}, False),
            ContributionRow("c2", 0.0, {"loo": 0.0}, True, ("zero-update",)),
        ),
        events=(EventRow("round_completed", "round 1", round_number=1),),
        ledger=ledger,
    )
    head = ledger[1]
    more = ledger_append(
        run.id, key, [(2, "c0")], start_seq=head.seq + 1, prev_hash=head.head_hash
    )
    play_round(store, run.id, 2, (ok("c0", up=2), ok("c3")), accuracy=0.6, ledger=more)
    store.open_round(run.id, 3, num_selected=2, deadline_at=deadline(), model_version=2)
    return run.id


def test_a_store_written_through_the_api_passes(store: Store) -> None:
    _federated_run(store)
    # A failed round in the middle of the rounds still to come.
    other = run_with_clients(store, 2)
    play_round(store, other, 1, (ok("c0"),))
    play_round(
        store,
        other,
        2,
        (ParticipationRow("c0", "late"), ok("c1")),
        status="failed",
        reason="quorum",
        run_status="failed",
    )
    store.create_run("pending", {}, {}, 3)
    # A gossip run keeps no round rows; its current_round advances directly.
    gossip = store.create_run("gossip", {"mode": "gossip"}, {}, 4)
    store.update_run(gossip.id, status="running", started_at=datetime.now(UTC))
    store.update_run(gossip.id, current_round=3)
    assert check_store(store) == []
    assert check_store(store, RUN) == []
    assert check_store(store, gossip.id) == []  # by id as well as by name
    assert check_store(store, "nope") == [Problem("nope", None, "no such run")]


# (raw SQL on the run ``checked``, expected round, expected message)
_BROKEN: list[tuple[str, str, int | None, str]] = [
    (
        "counters",
        "UPDATE rounds SET num_succeeded = num_succeeded + 1 WHERE number = 1",
        1,
        "counters 3/1 but 2 succeeded rows",
    ),
    (
        "aggregated",
        "UPDATE rounds SET num_aggregated = 1 WHERE number = 2",
        2,
        "1 aggregated updates but 2 succeeded",
    ),
    (
        "bytes-up",
        "UPDATE rounds SET bytes_up = bytes_up + 1 WHERE number = 1",
        1,
        "bytes_up differs from the sum over participations",
    ),
    (
        "bytes-down",
        "UPDATE rounds SET bytes_down = 0 WHERE number = 1",
        1,
        "bytes_down differs from the sum over participations",
    ),
    (
        "selected",
        "UPDATE rounds SET num_selected = 4 WHERE number = 1",
        1,
        "3 participations for 4 selected clients",
    ),
    (
        "open-participation",
        "INSERT INTO participations (run_id, round_number, client_id, status,"
        " bytes_up, bytes_down, num_examples, flags, updated_at) VALUES (:run, 3,"
        " 'c0', 'succeeded', 1, 1, 1, '[]', CURRENT_TIMESTAMP)",
        3,
        "open round holds 1 participations and 0 contributions",
    ),
    (
        "open-contribution",
        "INSERT INTO contributions (run_id, round_number, client_id, score,"
        " scores_json, suspect, flags) VALUES (:run, 3, 'c1', 1.0, '{}', false,"
        " '[]')",
        3,
        "open round holds 0 participations and 1 contributions",
    ),
    (
        "checkpoint",
        "UPDATE rounds SET checkpoint_sha256 = NULL WHERE number = 2",
        2,
        "completed without a recorded checkpoint",
    ),
    (
        "gap",
        "UPDATE rounds SET status = 'failed' WHERE number = 1",
        None,
        "completed rounds [2]",
    ),
    (
        "current-round",
        "UPDATE runs SET current_round = 1",
        None,
        "current_round 1 differs from the last completed round",
    ),
    (
        "beyond-total",
        "UPDATE runs SET total_rounds = 1",
        None,
        "current_round > total_rounds",
    ),
    (
        "verdict",
        "UPDATE participations SET selected = false WHERE client_id = 'c1'",
        1,
        "a verdict is recorded for an update that did not succeed",
    ),
    (
        "stray-contribution",
        "INSERT INTO contributions (run_id, round_number, client_id, score,"
        " scores_json, suspect, flags) VALUES (:run, 1, 'c3', 0.5, '{}', false,"
        " '[]')",
        1,
        "contributions for clients not in the round: ['c3']",
    ),
]


@pytest.mark.parametrize(
    "statement, round_number, message",
    [pytest.param(s, r, m, id=i) for i, s, r, m in _BROKEN],
)
def test_each_broken_invariant_is_reported(
    store: Store, db_url: str, statement: str, round_number: int | None, message: str
) -> None:
    run_id = _federated_run(store)
    bystander = run_with_clients(store, 1)
    play_round(store, bystander, 1, (ok("c0"),))
    assert check_store(store) == []
    # Every statement edits the run's rows only (the bystander is untouched).
    if statement.startswith("UPDATE runs"):
        statement += " WHERE id = :run"
    elif statement.startswith("UPDATE"):
        statement += " AND run_id = :run"
    sql(db_url, statement, run=run_id)
    assert check_store(store) == [Problem(RUN, round_number, message)]
    assert check_store(store, RUN) == [Problem(RUN, round_number, message)]
    text = str(check_store(store)[0])
    assert text.startswith(f"run {RUN!r}") and message in text


def test_a_tampered_ledger_entry_is_reported(store: Store, db_url: str) -> None:
    run_id = _federated_run(store)
    # Raise c2's round-1 credit after the fact, without re-hashing the chain.
    sql(
        db_url,
        "UPDATE ledger_entries SET payload_json = REPLACE(payload_json, :old, :new)"
        " WHERE run_id = :run AND seq = 2",
        old='"credit":1.0',
        new='"credit":9.0',
        run=run_id,
    )
    [entry] = [e for e in store.list_ledger_entries(run_id) if e.seq == 2]
    assert '"credit":9.0' in entry.payload_json  # the edit happened
    problems = check_store(store)
    assert problems, "a tampered ledger must be reported"
    assert all(p.run == RUN and p.round is None for p in problems)
    assert all(p.message.startswith("ledger: ") for p in problems)
    assert any("seq 2" in p.message for p in problems), problems

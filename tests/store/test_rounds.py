"""Rounds: opened once, closed once in one transaction, then never rewritten.

Runs on SQLite and PostgreSQL (see ``conftest.py``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedplat.store import (
    PARTICIPATION_STATUSES,
    ContributionRecord,
    ContributionRow,
    EventRow,
    ParticipationRow,
    RoundClose,
    Store,
    StoreError,
    Verdict,
)
from tests.support.store import (
    SHA,
    deadline,
    ledger_append,
    ok,
    play_round,
    race,
    run_with_clients,
)


def test_round_lifecycle(store: Store) -> None:
    run_id = run_with_clients(store, 3)
    when = datetime(2030, 5, 6, 7, 8, 9, tzinfo=timezone(timedelta(hours=2)))
    rnd = store.open_round(run_id, 1, num_selected=3, deadline_at=when, model_version=3)
    assert (rnd.number, rnd.status, rnd.num_selected, rnd.model_version) == (
        1,
        "open",
        3,
        3,
    )
    assert rnd.deadline_at == when and rnd.deadline_at.tzinfo == UTC
    assert (rnd.num_succeeded, rnd.num_failed, rnd.bytes_up, rnd.finished_at) == (
        0,
        0,
        0,
        None,
    )
    # Nothing of an open round is written before it closes.
    assert store.list_participations(run_id) == []

    verdict = Verdict(weight=0.75, selected=True, score=1.2, flags=("clipped",))
    done = store.close_round(
        run_id,
        1,
        RoundClose(
            status="completed",
            participations=(
                ParticipationRow(
                    "c0",
                    "succeeded",
                    bytes_up=30,
                    bytes_down=150,
                    num_examples=12,
                    duration_s=1.5,
                    train_loss=0.25,
                    verdict=verdict,
                ),
                ParticipationRow(
                    "c1", "rejected", bytes_up=10, bytes_down=100, reason="nan"
                ),
                ParticipationRow("c2", "dropped", bytes_down=40, reason="no update"),
            ),
            accuracy=0.8,
            loss=0.4,
            checkpoint_path="/ckpt/r1.safetensors",
            checkpoint_sha256=SHA.upper(),
            metrics={"round_seconds": 2.0},
            client_metrics={"c0": {"client.accuracy": 0.9}},
            contributions=(
                ContributionRow("c0", 0.5, {"loo": 0.5, "gtg": 0.25}, False, ("x",)),
            ),
            events=(EventRow("round_completed", "round 1 done", round_number=1),),
        ),
    )
    assert (done.status, done.num_succeeded, done.num_failed) == ("completed", 1, 2)
    assert done.num_aggregated == 1
    assert (done.bytes_up, done.bytes_down) == (40, 290)
    assert (done.accuracy, done.loss, done.checkpoint_sha256) == (0.8, 0.4, SHA)
    assert done.checkpoint_path == "/ckpt/r1.safetensors"
    assert done.finished_at is not None and done.finished_at.tzinfo is not None

    c0, c1, c2 = store.list_participations(run_id, 1)
    assert (c0.client_id, c0.status, c0.bytes_up, c0.bytes_down) == (
        "c0",
        "succeeded",
        30,
        150,
    )
    assert (c0.num_examples, c0.duration_s, c0.train_loss) == (12, 1.5, 0.25)
    assert c0.verdict == verdict and c0.weight == 0.75
    assert c0.updated_at.tzinfo is not None
    assert (c1.status, c1.reason, c1.verdict) == ("rejected", "nan", Verdict())
    assert (c2.status, c2.bytes_down) == ("dropped", 40)
    assert store.list_contributions(run_id) == [
        ContributionRecord(
            run_id, 1, "c0", 0.5, {"loo": 0.5, "gtg": 0.25}, False, ("x",)
        )
    ]
    assert [
        (m.name, m.round_number, m.client_id) for m in store.list_metrics(run_id)
    ] == [
        ("round_seconds", 1, None),
        ("client.accuracy", 1, "c0"),
    ]
    assert [e.kind for e in store.list_events(run_id)] == ["round_completed"]
    run = store.get_run(run_id)
    assert run is not None and (run.current_round, run.best_accuracy) == (1, 0.8)

    # A worse round advances the run but keeps the best accuracy.
    play_round(store, run_id, 2, (ok("c1"),), accuracy=0.6)
    run = store.get_run(run_id)
    assert run is not None and (run.current_round, run.best_accuracy) == (2, 0.8)
    # A round without an evaluation advances it too.
    play_round(store, run_id, 3, (ok("c1"),))
    # A failed round does not count, and does not finish the run.
    failed = play_round(
        store,
        run_id,
        4,
        (ParticipationRow("c2", "late"), ok("c0", up=5)),
        status="failed",
        reason="quorum not reached",
    )
    assert (failed.status, failed.reason, failed.num_succeeded) == (
        "failed",
        "quorum not reached",
        1,
    )
    assert failed.num_failed == 1 and failed.checkpoint_sha256 is None
    run = store.get_run(run_id)
    assert run is not None
    assert (run.current_round, run.best_accuracy, run.status) == (3, 0.8, "pending")

    assert [r.number for r in store.list_rounds(run_id)] == [1, 2, 3, 4]
    last = store.last_completed_round(run_id)
    assert last is not None and last.number == 3
    assert store.get_round(run_id, 1) == done
    assert store.get_round(run_id, 9) is None
    assert store.last_completed_round("no-run") is None
    assert [
        p.round_number for p in store.list_participations(run_id, client_id="c1")
    ] == [1, 2, 3]


def test_a_closed_round_is_never_reopened_or_closed_again(store: Store) -> None:
    run_id = run_with_clients(store, 2)
    done = play_round(store, run_id, 1, (ok("c0", up=3), ok("c1")), accuracy=0.5)
    failed = play_round(store, run_id, 2, (ok("c0"),), status="failed", reason="r")
    before = (store.list_participations(run_id), store.list_metrics(run_id))
    again = RoundClose("completed", (ok("c1", up=99),), accuracy=0.99)
    for number, status in ((1, "completed"), (2, "failed")):
        with pytest.raises(StoreError, match=f"is {status}; a closed round is never"):
            store.open_round(
                run_id, number, num_selected=1, deadline_at=deadline(), model_version=7
            )
        with pytest.raises(StoreError, match="not open; a closed round is never"):
            store.close_round(run_id, number, again)
    assert (store.get_round(run_id, 1), store.get_round(run_id, 2)) == (done, failed)
    assert (store.list_participations(run_id), store.list_metrics(run_id)) == before
    run = store.get_run(run_id)
    assert run is not None and (run.current_round, run.best_accuracy) == (1, 0.5)
    with pytest.raises(StoreError, match="unknown round"):
        store.close_round(run_id, 3, again)


def test_an_open_round_may_be_reopened(store: Store) -> None:
    """A coordinator restarted mid-round, or a retry after an attempt without
    quorum, opens the same round again with a fresh selection."""
    run_id = run_with_clients(store, 3)
    store.open_round(run_id, 1, num_selected=2, deadline_at=deadline(), model_version=0)
    later = deadline(10)
    again = store.open_round(
        run_id, 1, num_selected=3, deadline_at=later, model_version=1
    )
    assert (again.status, again.num_selected, again.model_version) == ("open", 3, 1)
    assert again.deadline_at == later
    assert len(store.list_rounds(run_id)) == 1
    parts = (ok("c0"), ok("c1"), ok("c2"))
    done = store.close_round(
        run_id, 1, RoundClose("completed", parts, checkpoint_sha256=SHA)
    )
    assert (done.num_selected, done.num_succeeded) == (3, 3)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"number": 0}, ">= 1"),
        ({"number": 6}, "exceeds total_rounds"),
        ({"num_selected": 0}, ">= 1"),
        ({"num_selected": 2.0}, "integer"),
        ({"model_version": -1}, ">= 0"),
        ({"deadline_at": datetime(2030, 1, 1)}, "timezone-aware"),
        ({"run_id": "no-run"}, "unknown run"),
    ],
)
def test_open_round_validation(
    store: Store, kwargs: dict[str, Any], match: str
) -> None:
    run_id = run_with_clients(store, 2)
    args: dict[str, Any] = {
        "run_id": run_id,
        "number": 1,
        "num_selected": 2,
        "deadline_at": deadline(),
        "model_version": 0,
    }
    args.update(kwargs)
    with pytest.raises(StoreError, match=match):
        store.open_round(**args)
    assert store.list_rounds(run_id) == []


def _good_close(run_id: str) -> RoundClose:
    """Round 1 of a run with clients c0..c2, of which c0 and c1 were selected."""
    return RoundClose(
        status="completed",
        participations=(ok("c0", up=10, down=20), ok("c1", up=1)),
        accuracy=0.7,
        checkpoint_sha256=SHA,
        metrics={"num_updates": 2.0},
        client_metrics={"c0": {"client.loss": 0.1}},
        contributions=(ContributionRow("c0", 1.0, {"loo": 1.0}, False),),
        events=(EventRow("round_completed", "done", round_number=1),),
    )


def _bad_participation(index: int = 0, **kw: Any) -> Any:
    def make(close: RoundClose, run_id: str) -> RoundClose:
        parts = list(close.participations)
        parts[index] = replace(parts[index], **kw)
        return replace(close, participations=tuple(parts))

    return make


def _wrong_ledger(close: RoundClose, run_id: str) -> RoundClose:
    # Validated inside the transaction, after every other row was inserted.
    key = Ed25519PrivateKey.generate()
    return replace(close, ledger=ledger_append(run_id, key, [(1, "c0")], start_seq=2))


_BAD_CLOSES: list[tuple[str, Any, str]] = [
    ("status", lambda c, _: replace(c, status="open"), "status must be one of"),
    ("accuracy", lambda c, _: replace(c, accuracy=math.nan), "finite"),
    ("loss", lambda c, _: replace(c, loss=math.inf), "finite"),
    ("sha", lambda c, _: replace(c, checkpoint_sha256="xyz"), "64 hexadecimal"),
    ("p-status", _bad_participation(status="winning"), "status must be one of"),
    ("p-bytes", _bad_participation(bytes_up=-1), ">= 0"),
    ("p-float", _bad_participation(bytes_down=1.5), "integer"),
    ("p-loss", _bad_participation(train_loss=math.nan), "finite"),
    ("p-time", _bad_participation(duration_s=-1.0), ">= 0"),
    ("p-weight", _bad_participation(verdict=Verdict(math.inf)), "finite"),
    ("p-flags", _bad_participation(verdict=Verdict(flags=("f",) * 33)), "at most 32"),
    ("p-flag", _bad_participation(verdict=Verdict(flags=("x" * 65,))), "at most 64"),
    ("p-empty", _bad_participation(verdict=Verdict(flags=(" ",))), "non-empty"),
    ("p-twice", _bad_participation(client_id="c1"), "appears twice"),
    ("p-ghost", _bad_participation(1, client_id="ghost"), "not enrolled"),
    (
        "p-missing",
        lambda c, _: replace(c, participations=c.participations[:1]),
        "one per selected client",
    ),
    (
        "c-score",
        lambda c, _: replace(
            c, contributions=(ContributionRow("c0", 1.0, {"loo": math.nan}, False),)
        ),
        "finite",
    ),
    (
        "c-stray",
        lambda c, _: replace(c, contributions=(ContributionRow("c2", 1.0, {}, False),)),
        "without a participation",
    ),
    ("metric", lambda c, _: replace(c, metrics={"x": math.inf}), "finite"),
    (
        "c-metric",
        lambda c, _: replace(c, client_metrics={"c0": {"": 1.0}}),
        "non-empty",
    ),
    (
        "e-level",
        lambda c, _: replace(c, events=(EventRow("k", "m", level="debug"),)),
        "level must be one of",
    ),
    (
        "e-details",
        lambda c, _: replace(
            c, events=(EventRow("k", "m", details={"blob": "x" * 5000}),)
        ),
        "longer than 4096",
    ),
    ("ledger", _wrong_ledger, "next entry must be seq 1"),
    ("run-status", lambda c, _: replace(c, run_status="paused"), "run_status"),
]


@pytest.mark.parametrize(
    "make, match", [pytest.param(m, x, id=i) for i, m, x in _BAD_CLOSES]
)
def test_a_bad_close_writes_nothing(store: Store, make: Any, match: str) -> None:
    run_id = run_with_clients(store, 3)
    opened = store.open_round(
        run_id, 1, num_selected=2, deadline_at=deadline(), model_version=0
    )
    run = store.get_run(run_id)
    with pytest.raises(StoreError, match=match):
        store.close_round(run_id, 1, make(_good_close(run_id), run_id))
    assert store.get_round(run_id, 1) == opened
    assert store.get_run(run_id) == run
    assert store.list_participations(run_id) == []
    assert store.list_contributions(run_id) == []
    assert store.list_metrics(run_id) == []
    assert store.list_events(run_id) == []
    assert store.list_ledger_entries(run_id) == []
    assert store.get_ledger_head(run_id) is None
    # The round is still open, and the good close goes through.
    done = store.close_round(run_id, 1, _good_close(run_id))
    assert (done.status, done.num_succeeded, done.bytes_up) == ("completed", 2, 11)


def test_close_round_rolls_back_on_a_crash(store: Store) -> None:
    """A failure at the last statement (the run's progress) rolls back every row
    the close had already written: participations, contributions, metrics,
    events, ledger entries and the round itself."""
    run_id = run_with_clients(store, 3)
    store.open_round(run_id, 1, num_selected=2, deadline_at=deadline(), model_version=0)
    key = Ed25519PrivateKey.generate()
    close = replace(
        _good_close(run_id), ledger=ledger_append(run_id, key, [(1, "c0"), (1, "c1")])
    )
    seen: list[str] = []

    def crash_on_run_update(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(" ".join(statement.split()[:3]).upper())
        if statement.lstrip().upper().startswith("UPDATE RUNS"):
            raise RuntimeError("simulated crash before the run's progress")

    engine = store._engine
    sa.event.listen(engine, "before_cursor_execute", crash_on_run_update)
    try:
        with pytest.raises((StoreError, RuntimeError)):
            store.close_round(run_id, 1, close)
    finally:
        sa.event.remove(engine, "before_cursor_execute", crash_on_run_update)
    for table in ("PARTICIPATIONS", "CONTRIBUTIONS", "METRICS", "EVENTS"):
        assert f"INSERT INTO {table}" in seen, seen
    assert "INSERT INTO LEDGER_ENTRIES" in seen and "UPDATE ROUNDS SET" in seen
    rnd = store.get_round(run_id, 1)
    assert rnd is not None and rnd.status == "open" and rnd.accuracy is None
    assert store.list_participations(run_id) == []
    assert store.list_contributions(run_id) == []
    assert store.list_metrics(run_id) == store.list_events(run_id) == []
    assert store.list_ledger_entries(run_id) == []
    run = store.get_run(run_id)
    assert run is not None and (run.current_round, run.best_accuracy) == (0, None)

    store.close_round(run_id, 1, close)
    run = store.get_run(run_id)
    assert run is not None and (run.current_round, run.best_accuracy) == (1, 0.7)
    assert [e.seq for e in store.list_ledger_entries(run_id)] == [1, 2]


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(PARTICIPATION_STATUSES),
            st.integers(0, 2**40),
            st.integers(0, 2**40),
        ),
        min_size=1,
        max_size=6,
    ),
    status=st.sampled_from(["completed", "failed"]),
)
def test_counters_and_bytes_come_from_the_participations(
    store: Store, rows: list[tuple[str, int, int]], status: str
) -> None:
    run_id = run_with_clients(store, len(rows), rounds=1)
    parts = tuple(
        ParticipationRow(f"c{i}", s, bytes_up=up, bytes_down=down)
        for i, (s, up, down) in enumerate(rows)
    )
    done = play_round(store, run_id, 1, parts, status=status)
    succeeded = sum(s == "succeeded" for s, _, _ in rows)
    assert (done.num_selected, done.num_succeeded, done.num_aggregated) == (
        len(rows),
        succeeded,
        succeeded,
    )
    assert done.num_failed == len(rows) - succeeded
    # 64-bit totals: many clients moving large models pass 2 GiB quickly.
    assert done.bytes_up == sum(up for _, up, _ in rows)
    assert done.bytes_down == sum(down for _, _, down in rows)
    assert store.get_round(run_id, 1) == done


@pytest.mark.parametrize("outcome", ["completed", "failed"])
def test_run_status_finishes_the_run(store: Store, outcome: str) -> None:
    run_id = run_with_clients(store, 1, rounds=2)
    store.update_run(run_id, status="running", started_at=datetime.now(UTC))
    store.heartbeat(run_id, phase="training", live_clients=1)
    play_round(store, run_id, 1, (ok("c0"),), accuracy=0.5)
    run = store.get_run(run_id)
    assert run is not None and (run.status, run.finished_at) == ("running", None)
    reason = "gave up" if outcome == "failed" else None
    play_round(
        store,
        run_id,
        2,
        (ok("c0"),),
        status=outcome,
        reason=reason,
        accuracy=0.6,
        run_status=outcome,
    )
    run = store.get_run(run_id)
    assert run is not None
    assert (run.status, run.phase, run.reason) == (outcome, None, reason)
    assert run.finished_at is not None
    assert run.current_round == (2 if outcome == "completed" else 1)
    assert run.best_accuracy == (0.6 if outcome == "completed" else 0.5)


def test_list_contributions_filters_and_orders(store: Store) -> None:
    run_id = run_with_clients(store, 2)
    for r in (1, 2):
        play_round(
            store,
            run_id,
            r,
            (ok("c1"), ok("c0")),
            contributions=(
                ContributionRow("c1", 0.1 * r, {"gtg": 0.1 * r}, r == 2, ("zero",)),
                ContributionRow("c0", None, {}, False),
            ),
        )
    keys = [(c.round_number, c.client_id) for c in store.list_contributions(run_id)]
    assert keys == [(1, "c0"), (1, "c1"), (2, "c0"), (2, "c1")]
    [suspect] = store.list_contributions(run_id, round_number=2, client_id="c1")
    assert (suspect.suspect, suspect.flags, suspect.scores) == (
        True,
        ("zero",),
        {"gtg": 0.2},
    )
    assert [c.score for c in store.list_contributions(run_id, client_id="c0")] == [
        None,
        None,
    ]
    assert store.list_contributions("no-run") == []


def test_racing_closes_of_one_round_one_wins(store: Store) -> None:
    """Two coordinators (or a retried call) closing the same round: exactly one
    close is written, whole; the others are refused."""
    n = 4
    run_id = run_with_clients(store, 2)
    store.open_round(run_id, 1, num_selected=2, deadline_at=deadline(), model_version=0)

    def close(t: int) -> object:
        parts = (ok("c0", up=t), ParticipationRow("c1", "late", bytes_down=t))
        return store.close_round(
            run_id,
            1,
            RoundClose("completed", parts, accuracy=t / 10, checkpoint_sha256=SHA),
        )

    won, refused = race(n, close)
    assert len(won) == 1 and len(refused) == n - 1
    assert all("not open" in str(e) for e in refused), refused
    [t] = won
    rnd = store.get_round(run_id, 1)
    assert rnd is not None and (rnd.accuracy, rnd.bytes_up, rnd.bytes_down) == (
        t / 10,
        t,
        t,
    )
    assert [(p.client_id, p.bytes_up) for p in store.list_participations(run_id)] == [
        ("c0", t),
        ("c1", 0),
    ]

"""The store's engine, runs, metrics, events and JSON columns, and many threads
writing at once, on SQLite and, when FEDPLAT_TEST_PG_URL is set, PostgreSQL
(fixtures in ``conftest.py``). Clients, rounds and migrations have files of their
own.
"""

from __future__ import annotations

import json
import math
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedplat.store import (
    PARTICIPATION_STATUSES,
    ROUND_STATUSES,
    RUN_STATUSES,
    ContributionRow,
    EventRow,
    ParticipationRow,
    Store,
    StoreError,
    Verdict,
)
from fedplat.store.engine import make_engine
from fedplat.store.events import MAX_DETAILS, MAX_MESSAGE
from tests.support.store import deadline, ok, play_round, race, run_with_clients

# --------------------------------------------------------------------------- #
# Engine                                                                       #
# --------------------------------------------------------------------------- #


def test_sqlite_path_creates_dirs_and_sets_pragmas(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "fl.db"
    # The connection that ran the migrations (with foreign keys off while
    # tables were rebuilt) is back in the pool enforcing them again.
    with Store(str(path)) as store, store._engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    assert path.exists()
    engine = make_engine(str(path))
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
    finally:
        engine.dispose()


def test_sqlite_memory_url_works() -> None:
    with Store("sqlite://") as s:
        run = s.create_run("mem", {}, {}, 1)
        assert s.get_run(run.id) == run


def test_reopen_keeps_data_and_monitor_opens_without_migrating(db_url: str) -> None:
    with Store(db_url) as s:
        run_id = run_with_clients(s, 2)
        play_round(
            s,
            run_id,
            1,
            (ok("c0", up=7), ParticipationRow("c1", "late")),
            accuracy=0.7,
            metrics={"acc": 0.7},
            contributions=(ContributionRow("c0", 1.0, {"loo": 1.0}, False),),
            events=(EventRow("round_completed", "done", round_number=1),),
        )
        before = (
            s.get_run(run_id),
            s.list_rounds(run_id),
            s.list_participations(run_id),
            s.list_contributions(run_id),
        )

    with Store(db_url) as again:  # migrating an up-to-date database is a no-op
        assert (
            again.get_run(run_id),
            again.list_rounds(run_id),
            again.list_participations(run_id),
            again.list_contributions(run_id),
        ) == before

    monitor = Store(db_url, migrate=False)
    try:
        run = monitor.get_run(run_id)
        assert run is not None and run.current_round == 1
        assert [m.value for m in monitor.list_metrics(run_id)] == [0.7]
        assert [e.kind for e in monitor.list_events(run_id)] == ["round_completed"]
    finally:
        monitor.close()
    with pytest.raises(StoreError, match="closed"):
        monitor.get_run(run_id)


# --------------------------------------------------------------------------- #
# Runs                                                                         #
# --------------------------------------------------------------------------- #


def test_run_crud(store: Store) -> None:
    config = {"aggregator": "trimmed_mean", "beta": 0.1, "nested": {"a": [1, 2]}}
    layout = {"w": [10, 784], "b": [10]}
    first = store.create_run("first", config, layout, 10)
    assert first.status == "pending"
    assert first.current_round == 0 and first.best_accuracy is None
    assert len(first.id) == 32 and int(first.id, 16) >= 0
    assert first.config == config and list(first.layout) == ["w", "b"]
    assert first.created_at.tzinfo is not None
    second = store.create_run("second", {}, {}, 3)

    assert store.get_run(first.id) == first
    assert store.get_run_by_name("second") == second
    assert store.get_run("nope") is None
    assert store.get_run_by_name("nope") is None
    assert [r.name for r in store.list_runs()] == ["second", "first"]

    started = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    updated = store.update_run(
        first.id, status="running", started_at=started, best_accuracy=0.5
    )
    assert updated.status == "running"
    assert updated.started_at == started
    assert updated.best_accuracy == 0.5
    updated = store.update_run(first.id, current_round=4)
    assert (updated.current_round, updated.status) == (4, "running")
    assert store.get_run(first.id) == updated

    assert (first.heartbeat_at, first.phase, first.live_clients, first.reason) == (
        None,
        None,
        None,
        None,
    )
    failed = store.update_run(first.id, status="failed", reason="operator stop")
    assert (failed.status, failed.reason, failed.current_round) == (
        "failed",
        "operator stop",
        4,
    )

    with pytest.raises(StoreError, match="already exists"):
        store.create_run("first", {}, {}, 1)
    with pytest.raises(StoreError, match="unknown run"):
        store.update_run("missing", status="failed")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"status": "paused"}, "status must be one of"),
        ({"current_round": -1}, ">= 0"),
        ({"current_round": 11}, "exceeds total_rounds"),
        ({"best_accuracy": math.nan}, "finite"),
        ({"best_accuracy": "high"}, "real number"),
        ({"started_at": datetime(2026, 1, 1)}, "timezone-aware"),
        ({"total_rounds": 0}, ">= 1"),
        ({"reason": 3}, "string or None"),
    ],
)
def test_update_run_validation(
    store: Store, kwargs: dict[str, Any], match: str
) -> None:
    run = store.create_run("r", {}, {}, 10)
    with pytest.raises(StoreError, match=match):
        store.update_run(run.id, **kwargs)
    assert store.get_run(run.id) == run


@pytest.mark.parametrize(
    "args, match",
    [
        (("", {}, {}, 1), "non-empty"),
        (("x", {}, {}, 0), ">= 1"),
        (("x", [], {}, 1), "must be a dict"),
        (("x", {"v": math.inf}, {}, 1), "JSON"),
        (("x", {1: "a"}, {}, 1), "keys must be str"),
        (("x", {"o": object()}, {}, 1), "JSON"),
    ],
)
def test_create_run_validation(store: Store, args: tuple[Any, ...], match: str) -> None:
    with pytest.raises(StoreError, match=match):
        store.create_run(*args)
    assert store.list_runs() == []


def test_status_vocabularies() -> None:
    assert RUN_STATUSES == ("pending", "running", "completed", "failed")
    assert ROUND_STATUSES == ("open", "completed", "failed")
    assert "succeeded" in PARTICIPATION_STATUSES and "late" in PARTICIPATION_STATUSES


def test_a_run_may_be_extended_but_not_below_its_rounds(store: Store) -> None:
    run_id = run_with_clients(store, 1, rounds=2)
    for r in (1, 2):
        play_round(store, run_id, r, (ok("c0"),))
    with pytest.raises(StoreError, match="exceeds total_rounds 2"):
        store.open_round(
            run_id, 3, num_selected=1, deadline_at=deadline(), model_version=2
        )
    with pytest.raises(StoreError, match="already completed 2 rounds"):
        store.update_run(run_id, total_rounds=1)
    assert store.update_run(run_id, total_rounds=2).total_rounds == 2
    extended = store.update_run(run_id, total_rounds=4, status="running")
    assert (extended.total_rounds, extended.current_round) == (4, 2)
    play_round(store, run_id, 3, (ok("c0"),))
    run = store.get_run(run_id)
    assert run is not None and (run.current_round, run.total_rounds) == (3, 4)


def test_heartbeat(store: Store) -> None:
    run = store.create_run("r", {}, {}, 3)
    store.heartbeat(run.id, phase="training", live_clients=4)
    first = store.get_run(run.id)
    assert first is not None and first.heartbeat_at is not None
    assert first.heartbeat_at.tzinfo is not None
    assert (first.phase, first.live_clients) == ("training", 4)
    # Only the liveness columns change.
    assert (first.status, first.current_round, first.started_at) == ("pending", 0, None)
    store.heartbeat(run.id, phase=None, live_clients=None)
    second = store.get_run(run.id)
    assert second is not None and second.heartbeat_at is not None
    assert second.heartbeat_at >= first.heartbeat_at
    assert (second.phase, second.live_clients) == (None, None)
    for kwargs, match in (
        ({"phase": "", "live_clients": 1}, "non-empty"),
        ({"phase": "x" * 33, "live_clients": 1}, "at most 32"),
        ({"phase": "idle", "live_clients": -1}, ">= 0"),
        ({"phase": "idle", "live_clients": True}, "integer"),
    ):
        with pytest.raises(StoreError, match=match):
            store.heartbeat(run.id, **kwargs)
    assert store.get_run(run.id) == second


# --------------------------------------------------------------------------- #
# Metrics and events                                                           #
# --------------------------------------------------------------------------- #


def test_metrics(store: Store) -> None:
    run_id = run_with_clients(store, 1)
    other = store.create_run("other", {}, {}, 1)
    store.add_metric(run_id, "accuracy", 0.5, round_number=1)
    store.add_metrics(run_id, {"accuracy": 0.6, "loss": 1}, round_number=2)
    store.add_metric(run_id, "train_loss", 0.3, round_number=2, client_id="c0")
    store.add_metric(other.id, "accuracy", 0.1)
    store.add_metrics(run_id, {})  # nothing to do

    acc = store.list_metrics(run_id, "accuracy")
    assert [(m.round_number, m.value) for m in acc] == [(1, 0.5), (2, 0.6)]
    everything = store.list_metrics(run_id)
    assert [m.name for m in everything] == [
        "accuracy",
        "accuracy",
        "loss",
        "train_loss",
    ]
    loss = everything[2]
    assert isinstance(loss.value, float) and loss.value == 1.0
    assert (
        everything[3].client_id == "c0" and everything[3].created_at.tzinfo is not None
    )

    for value in (math.nan, math.inf, -math.inf, "0.5", None):
        with pytest.raises(StoreError):
            store.add_metric(run_id, "accuracy", value)  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="finite"):
        store.add_metrics(run_id, {"ok": 1.0, "bad": math.nan})
    with pytest.raises(StoreError, match="unknown run"):
        store.add_metric("no-run", "accuracy", 0.1)
    with pytest.raises(StoreError, match="non-empty"):
        store.add_metric(run_id, "", 0.1)
    assert len(store.list_metrics(run_id)) == 4  # the rejected batch wrote nothing


def test_events(store: Store) -> None:
    run_id = run_with_clients(store, 1)
    store.add_event(None, "coordinator_started", "up", details={"version": "0.1"})
    store.add_event(run_id, "client_enrolled", "c0 joined", client_id="c0")
    store.add_event(
        run_id,
        "update_rejected",
        "non-finite update",
        level="warning",
        round_number=1,
        client_id="c0",
        details={"norm": 1e30, "reasons": ["nan"]},
    )
    store.add_event(run_id, "round_failed", "quorum", level="error", round_number=1)

    everything = store.list_events()
    assert [e.kind for e in everything] == [
        "round_failed",
        "update_rejected",
        "client_enrolled",
        "coordinator_started",
    ]
    assert everything[-1].run_id is None and everything[-1].details == {
        "version": "0.1"
    }
    rejected = store.list_events(run_id, kind="update_rejected")
    assert len(rejected) == 1
    e = rejected[0]
    assert (e.level, e.round_number, e.client_id, e.message) == (
        "warning",
        1,
        "c0",
        "non-finite update",
    )
    assert e.details == {"norm": 1e30, "reasons": ["nan"]}
    assert [x.kind for x in store.list_events(run_id, limit=2)] == [
        "round_failed",
        "update_rejected",
    ]
    assert store.list_events(kind="nothing") == []

    with pytest.raises(StoreError, match="level must be one of"):
        store.add_event(run_id, "x", "y", level="debug")
    with pytest.raises(StoreError, match="non-empty"):
        store.add_event(run_id, "", "y")
    with pytest.raises(StoreError, match="unknown run"):
        store.add_event("no-run", "x", "y")
    with pytest.raises(StoreError, match=">= 1"):
        store.list_events(limit=0)


def test_add_events_cuts_messages_and_bounds_details(store: Store) -> None:
    run_id = run_with_clients(store, 1)
    at_limit = {"b": "x" * (MAX_DETAILS - 9)}  # '{"b": "..."}' is 4096 long
    assert len(json.dumps(at_limit)) == MAX_DETAILS
    store.add_events(
        run_id,
        [
            EventRow("long", "a" * (MAX_MESSAGE + 500), "warning"),
            EventRow("exact", "b" * MAX_MESSAGE, details=at_limit),
            EventRow("client", "joined", round_number=2, client_id="c0"),
        ],
    )
    by_kind = {e.kind: e for e in store.list_events(run_id)}
    cut = by_kind["long"].message
    # Messages may quote client input: cut, and marked as cut.
    assert len(cut) == MAX_MESSAGE and cut.endswith("\u2026")
    assert cut[:-1] == "a" * (MAX_MESSAGE - 1)
    assert by_kind["exact"].message == "b" * MAX_MESSAGE
    assert by_kind["exact"].details == at_limit
    assert (by_kind["client"].round_number, by_kind["client"].client_id) == (2, "c0")

    over = {"b": "x" * (MAX_DETAILS - 8)}
    for bad, match in (
        (EventRow("big", "m", details=over), f"longer than {MAX_DETAILS}"),
        (EventRow("lvl", "m", level="debug"), "level must be one of"),
        (EventRow("msg", None), "message must be a string"),  # type: ignore[arg-type]
        (EventRow("", "m"), "non-empty"),
    ):
        # One bad event refuses the whole batch.
        with pytest.raises(StoreError, match=match):
            store.add_events(run_id, [EventRow("fine", "ok"), bad])
    assert len(store.list_events(run_id)) == 3
    store.add_events(None, [EventRow("coordinator_started", "up")])
    assert store.list_events(kind="coordinator_started")[0].run_id is None
    store.add_events(run_id, [])  # nothing to do
    with pytest.raises(StoreError, match="unknown run"):
        store.add_events("no-run", [EventRow("x", "y")])


# --------------------------------------------------------------------------- #
# JSON round trips                                                             #
# --------------------------------------------------------------------------- #

_json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
_json = st.recursive(
    _json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
_json_objects = st.dictionaries(st.text(max_size=8), _json, max_size=5)
# Flags and scorer names: non-empty, at most 64 characters.
_label = st.text(min_size=1, max_size=64).filter(str.strip)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    config=_json_objects,
    layout=_json_objects,
    info=_json_objects,
    flags=st.lists(_label, max_size=5),
    scores=st.dictionaries(_label, st.floats(allow_nan=False, allow_infinity=False)),
)
def test_json_round_trips(
    store: Store,
    config: dict[str, Any],
    layout: dict[str, Any],
    info: dict[str, Any],
    flags: list[str],
    scores: dict[str, float],
) -> None:
    run = store.create_run(uuid.uuid4().hex, config, layout, 1)
    stored = store.get_run(run.id)
    assert stored is not None
    assert stored.config == config and stored.layout == layout
    assert list(stored.layout) == list(layout)  # key order survives
    store.upsert_client(run.id, "c", name="c", num_examples=0, info=info)
    client = store.get_client(run.id, "c")
    assert client is not None and client.info == info
    verdict = Verdict(0.5, True, -1.5, tuple(flags))
    play_round(
        store,
        run.id,
        1,
        (ok("c", verdict=verdict),),
        contributions=(ContributionRow("c", None, scores, True, tuple(flags)),),
    )
    assert store.list_participations(run.id, 1)[0].verdict == verdict
    [contribution] = store.list_contributions(run.id)
    assert (contribution.scores, contribution.flags) == (scores, tuple(flags))
    if len(json.dumps(info)) > MAX_DETAILS:
        with pytest.raises(StoreError, match="event details longer than"):
            store.add_event(run.id, "k", "m", details=info)
    else:
        store.add_event(run.id, "k", "m", details=info)
        assert store.list_events(run.id)[0].details == info


def test_json_accepts_numpy_like_scalars(store: Store) -> None:
    class Scalar:
        def __init__(self, value: float) -> None:
            self.value = value

        def item(self) -> float:
            return self.value

    run = store.create_run("np", {"score": Scalar(1.5)}, {}, 1)
    assert run.config == {"score": 1.5}
    with pytest.raises(StoreError, match="JSON"):
        store.create_run("np2", {"score": Scalar(math.nan)}, {}, 1)


# --------------------------------------------------------------------------- #
# Concurrency                                                                  #
# --------------------------------------------------------------------------- #


def test_concurrent_writers(store: Store) -> None:
    """Four threads hammer one store; nothing is lost and nothing is locked out."""
    n_threads, n_ops = 4, 25
    run_id = run_with_clients(store, n_threads, rounds=2)

    def work(t: int) -> None:
        for i in range(n_ops):
            # Everyone races to create its own client, then updates it.
            store.upsert_client(run_id, f"t{t}", name=f"thread {t}", num_examples=i)
            store.touch_clients(run_id, [f"c{t}", "c0"], status="active")
            store.add_metrics(run_id, {"a": float(i), "b": float(t)}, round_number=1)
            store.add_events(
                run_id, [EventRow("tick", f"{t}:{i}", client_id=f"c{t}")] * 2
            )
            store.heartbeat(run_id, phase="training", live_clients=t)
            store.list_clients(run_id)
            store.list_events(run_id, limit=5)

    won, refused = race(n_threads, work)
    assert refused == [] and sorted(won) == list(range(n_threads))

    total = n_threads * n_ops
    assert len(store.list_metrics(run_id)) == 2 * total
    assert len(store.list_events(run_id, kind="tick")) == 2 * total
    clients = {c.id: c for c in store.list_clients(run_id)}
    assert len(clients) == 2 * n_threads
    assert all(clients[f"c{t}"].status == "active" for t in range(n_threads))
    assert all(clients[f"t{t}"].num_examples == n_ops - 1 for t in range(n_threads))
    run = store.get_run(run_id)
    assert run is not None and run.phase == "training"
    # The store stays usable for a round afterwards.
    done = play_round(store, run_id, 1, tuple(ok(f"c{t}") for t in range(n_threads)))
    assert done.num_succeeded == n_threads

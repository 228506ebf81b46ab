"""Tests of fedplat.store on SQLite and, when FEDPLAT_TEST_PG_URL is set, PostgreSQL.

Start a throwaway PostgreSQL with::

    eval "$(scripts/pg_throwaway.sh start "$(mktemp -d)" 55432)"
    python -m pytest tests/test_store.py
    scripts/pg_throwaway.sh stop DIR

Each PostgreSQL test runs in a schema of its own (dropped afterwards), so the
tests need only CREATE on the database, not CREATEDB.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedplat.store import (
    PARTICIPATION_STATUSES,
    ROUND_STATUSES,
    RUN_STATUSES,
    Store,
    StoreError,
    current_revision,
    downgrade,
    head_revision,
    migrate,
)
from fedplat.store.engine import make_engine
from fedplat.store.models import Base
from tests.support import REPO

PG_URL = os.environ.get("FEDPLAT_TEST_PG_URL")
SHA = "ab" * 32

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param(
        "postgres",
        id="postgres",
        marks=[
            pytest.mark.postgres,
            pytest.mark.skipif(
                not PG_URL,
                reason="FEDPLAT_TEST_PG_URL not set (see scripts/pg_throwaway.sh)",
            ),
        ],
    ),
]


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    """A URL of an empty database: a SQLite path, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        # A plain path with missing parents: the store must create them.
        yield str(tmp_path / "nested" / "dir" / "store.db")
        return
    assert PG_URL is not None
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    url = sa.make_url(PG_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.dispose()


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store(db_url)
    try:
        yield s
    finally:
        s.close()


def _deadline() -> datetime:
    return datetime.now(UTC) + timedelta(minutes=5)


def _run_with_clients(store: Store, n: int = 3, *, rounds: int = 5) -> str:
    run = store.create_run(f"run-{uuid.uuid4().hex[:8]}", {"lr": 0.1}, {}, rounds)
    for i in range(n):
        store.upsert_client(run.id, f"c{i}", name=f"client {i}", num_examples=10 * i)
    return run.id


# --------------------------------------------------------------------------- #
# Engine, schema, migrations                                                   #
# --------------------------------------------------------------------------- #


def test_sqlite_path_creates_dirs_and_sets_pragmas(tmp_path: Any) -> None:
    path = tmp_path / "a" / "b" / "fl.db"
    Store(str(path)).close()
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


def _schema_diff(url: str) -> list[Any]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            return list(compare_metadata(ctx, Base.metadata))
    finally:
        engine.dispose()


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_migration_matches_models_and_downgrades(db_url: str) -> None:
    migrate(db_url)
    assert _schema_diff(db_url) == []
    engine = make_engine(db_url)
    try:
        assert current_revision(engine) == head_revision() == "0002"
    finally:
        engine.dispose()
    expected = {"runs", "clients", "rounds", "participations", "metrics", "events"}
    assert expected <= _tables(db_url)

    downgrade(db_url, "base")
    assert _tables(db_url) <= {"alembic_version"}

    migrate(db_url)
    assert expected <= _tables(db_url)
    assert _schema_diff(db_url) == []


@pytest.mark.integration
def test_concurrent_first_opens_migrate_once(db_url: str) -> None:
    """Services opening a fresh database at once (processes and threads) all work."""
    repo = REPO
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), *sys.path])}
    code = "import sys; from fedplat.store import Store; Store(sys.argv[1]).close()"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, db_url], env=env, cwd=repo)
        for _ in range(3)
    ]
    errors: list[BaseException] = []

    def open_store() -> None:
        try:
            Store(db_url).close()
        except BaseException as exc:  # re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    assert errors == [], errors
    assert _schema_diff(db_url) == []


def test_reopen_keeps_data_and_monitor_opens_without_migrating(db_url: str) -> None:
    with Store(db_url) as s:
        run_id = _run_with_clients(s, 2)
        s.start_round(
            run_id, 1, selected=["c0", "c1"], deadline_at=_deadline(), model_version=0
        )
        s.update_participation(run_id, 1, "c0", status="succeeded", bytes_up=7)
        s.finish_round(run_id, 1, status="completed", accuracy=0.7)
        s.add_metric(run_id, "acc", 0.7, round_number=1)
        s.add_event(run_id, "round_completed", "done", round_number=1)
        before = (
            s.get_run(run_id),
            s.list_rounds(run_id),
            s.list_participations(run_id),
        )

    with Store(db_url) as again:  # migrating an up-to-date database is a no-op
        assert (
            again.get_run(run_id),
            again.list_rounds(run_id),
            again.list_participations(run_id),
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


# --------------------------------------------------------------------------- #
# Clients                                                                      #
# --------------------------------------------------------------------------- #


def test_client_crud(store: Store) -> None:
    run = store.create_run("r", {}, {}, 2)
    c = store.upsert_client(
        run.id, "c1", name="phone", num_examples=12, info={"os": "a"}
    )
    assert (c.run_id, c.id, c.name, c.status, c.num_examples) == (
        run.id,
        "c1",
        "phone",
        "enrolled",
        12,
    )
    assert c.info == {"os": "a"}
    assert c.last_seen is not None and c.enrolled_at.tzinfo is not None

    again = store.upsert_client(
        run.id, "c1", name="phone2", num_examples=30, status="active"
    )
    assert again.enrolled_at == c.enrolled_at
    assert (again.name, again.num_examples, again.status) == ("phone2", 30, "active")
    assert again.info == {"os": "a"}  # info=None keeps the stored info

    store.touch_client(run.id, "c1", status="dropped")
    touched = store.get_client(run.id, "c1")
    assert touched is not None and touched.status == "dropped"
    assert touched.last_seen is not None and again.last_seen is not None
    assert touched.last_seen >= again.last_seen

    store.upsert_client(run.id, "c0", name="other", num_examples=0)
    assert [x.id for x in store.list_clients(run.id)] == ["c0", "c1"]
    assert store.get_client(run.id, "zz") is None
    assert store.list_clients("no-run") == []

    with pytest.raises(StoreError, match="unknown client"):
        store.touch_client(run.id, "zz")
    with pytest.raises(StoreError, match="unknown run"):
        store.upsert_client("no-run", "c", name="c", num_examples=1)
    with pytest.raises(StoreError, match="status must be one of"):
        store.upsert_client(run.id, "c", name="c", num_examples=1, status="zombie")
    with pytest.raises(StoreError, match="status must be one of"):
        store.touch_client(run.id, "c1", status="zombie")
    with pytest.raises(StoreError, match=">= 0"):
        store.upsert_client(run.id, "c", name="c", num_examples=-1)
    with pytest.raises(StoreError, match="integer"):
        store.upsert_client(run.id, "c", name="c", num_examples=True)


# --------------------------------------------------------------------------- #
# Rounds and participations                                                    #
# --------------------------------------------------------------------------- #


def test_round_lifecycle(store: Store) -> None:
    run_id = _run_with_clients(store, 3)
    deadline = datetime(2030, 5, 6, 7, 8, 9, tzinfo=timezone(timedelta(hours=2)))
    rnd = store.start_round(
        run_id, 1, selected=["c0", "c1", "c2"], deadline_at=deadline, model_version=3
    )
    assert (rnd.number, rnd.status, rnd.num_selected, rnd.model_version) == (
        1,
        "open",
        3,
        3,
    )
    assert rnd.deadline_at == deadline and rnd.deadline_at.tzinfo == UTC
    parts = store.list_participations(run_id, 1)
    assert [(p.client_id, p.status, p.bytes_up) for p in parts] == [
        ("c0", "selected", 0),
        ("c1", "selected", 0),
        ("c2", "selected", 0),
    ]

    store.update_participation(run_id, 1, "c0", status="downloaded", bytes_down=100)
    store.update_participation(run_id, 1, "c0", bytes_down=50)  # a resumed download
    store.update_participation(
        run_id,
        1,
        "c0",
        status="succeeded",
        bytes_up=30,
        num_examples=12,
        duration_s=1.5,
        train_loss=0.25,
        weight=0.75,
        flags={"selected": True, "score": 1.2, "flags": ["clipped"]},
    )
    store.update_participation(
        run_id, 1, "c1", status="rejected", bytes_up=10, reason="nan"
    )
    store.update_participation(run_id, 1, "c2", bytes_down=40)  # never uploaded

    c0 = store.list_participations(run_id, 1, "c0")[0]
    assert (c0.status, c0.bytes_up, c0.bytes_down, c0.num_examples) == (
        "succeeded",
        30,
        150,
        12,
    )
    assert (c0.duration_s, c0.train_loss, c0.weight) == (1.5, 0.25, 0.75)
    assert c0.flags == {"selected": True, "score": 1.2, "flags": ["clipped"]}
    assert c0.updated_at.tzinfo is not None

    done = store.finish_round(
        run_id,
        1,
        status="completed",
        accuracy=0.8,
        loss=0.4,
        checkpoint_path="/ckpt/r1.safetensors",
        checkpoint_sha256=SHA,
    )
    assert (done.status, done.num_succeeded, done.num_failed) == ("completed", 1, 2)
    assert (done.bytes_up, done.bytes_down) == (40, 190)
    assert (done.accuracy, done.loss, done.checkpoint_sha256) == (0.8, 0.4, SHA)
    assert done.finished_at is not None
    run = store.get_run(run_id)
    assert run is not None and (run.current_round, run.best_accuracy) == (1, 0.8)

    store.start_round(
        run_id, 2, selected=["c1"], deadline_at=_deadline(), model_version=4
    )
    store.update_participation(run_id, 2, "c1", status="succeeded")
    store.finish_round(run_id, 2, status="completed", accuracy=0.6)
    run = store.get_run(run_id)
    assert run is not None and (run.current_round, run.best_accuracy) == (2, 0.8)

    store.start_round(
        run_id, 3, selected=["c2"], deadline_at=_deadline(), model_version=5
    )
    failed = store.finish_round(run_id, 3, status="failed", reason="quorum not reached")
    assert (failed.status, failed.reason, failed.num_failed) == (
        "failed",
        "quorum not reached",
        1,
    )
    run = store.get_run(run_id)
    assert run is not None and run.current_round == 2  # a failed round does not count

    assert [r.number for r in store.list_rounds(run_id)] == [1, 2, 3]
    last = store.last_completed_round(run_id)
    assert last is not None and last.number == 2
    assert store.get_round(run_id, 1) == done
    assert store.get_round(run_id, 9) is None
    assert store.last_completed_round("no-run") is None
    assert [
        p.round_number for p in store.list_participations(run_id, client_id="c1")
    ] == [1, 2]

    with pytest.raises(StoreError, match="completed; it cannot be restarted"):
        store.start_round(
            run_id, 1, selected=["c0"], deadline_at=_deadline(), model_version=9
        )
    with pytest.raises(StoreError, match="not open"):
        store.finish_round(run_id, 2, status="completed")
    with pytest.raises(StoreError, match="unknown round"):
        store.finish_round(run_id, 4, status="completed")


def test_start_round_resets_an_open_or_failed_round(store: Store) -> None:
    run_id = _run_with_clients(store, 3)
    store.start_round(
        run_id, 1, selected=["c0", "c1"], deadline_at=_deadline(), model_version=1
    )
    store.update_participation(run_id, 1, "c0", status="succeeded", bytes_up=99)
    store.finish_round(run_id, 1, status="failed", accuracy=0.9, reason="timeout")

    again = store.start_round(
        run_id, 1, selected=["c1", "c2"], deadline_at=_deadline(), model_version=2
    )
    assert (again.status, again.num_selected, again.model_version) == ("open", 2, 2)
    assert (again.accuracy, again.reason, again.finished_at, again.bytes_up) == (
        None,
        None,
        None,
        0,
    )
    parts = store.list_participations(run_id, 1)
    assert [(p.client_id, p.status, p.bytes_up) for p in parts] == [
        ("c1", "selected", 0),
        ("c2", "selected", 0),
    ]
    # Restarting an open round (a coordinator restarted mid-round) works as well.
    store.start_round(
        run_id, 1, selected=["c0"], deadline_at=_deadline(), model_version=3
    )
    assert [p.client_id for p in store.list_participations(run_id, 1)] == ["c0"]
    run = store.get_run(run_id)
    assert run is not None and (run.current_round, run.best_accuracy) == (0, None)


@pytest.mark.parametrize(
    "number, selected, deadline, match",
    [
        (1, ["c0", "ghost"], _deadline(), "not enrolled"),
        (1, ["c0", "c0"], _deadline(), "duplicate"),
        (1, [], _deadline(), "at least one"),
        (1, "c0", _deadline(), "list of client ids"),
        (6, ["c0"], _deadline(), "exceeds total_rounds"),
        (0, ["c0"], _deadline(), ">= 1"),
        (1, ["c0"], datetime(2030, 1, 1), "timezone-aware"),
    ],
)
def test_start_round_validation(
    store: Store, number: int, selected: Any, deadline: datetime, match: str
) -> None:
    run_id = _run_with_clients(store, 2)
    with pytest.raises(StoreError, match=match):
        store.start_round(
            run_id, number, selected=selected, deadline_at=deadline, model_version=0
        )
    assert store.list_rounds(run_id) == []
    assert store.list_participations(run_id) == []


def test_finish_round_validation(store: Store) -> None:
    run_id = _run_with_clients(store, 1)
    store.start_round(
        run_id, 1, selected=["c0"], deadline_at=_deadline(), model_version=0
    )
    bad: list[tuple[dict[str, Any], str]] = [
        ({"status": "open"}, "status must be one of"),
        ({"status": "completed", "accuracy": math.nan}, "finite"),
        ({"status": "completed", "loss": math.inf}, "finite"),
        ({"status": "completed", "checkpoint_sha256": "xyz"}, "64 hexadecimal"),
    ]
    for kwargs, match in bad:
        with pytest.raises(StoreError, match=match):
            store.finish_round(run_id, 1, **kwargs)
    rnd = store.get_round(run_id, 1)
    assert rnd is not None and rnd.status == "open"


def test_finish_round_is_atomic(store: Store) -> None:
    """A failure while updating the run rolls back the already-written round."""
    run_id = _run_with_clients(store, 1)
    store.start_round(
        run_id, 1, selected=["c0"], deadline_at=_deadline(), model_version=0
    )
    store.update_participation(run_id, 1, "c0", status="succeeded", bytes_up=5)
    seen: list[str] = []

    def crash_on_run_update(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(" ".join(statement.split()[:2]))
        if statement.lstrip().upper().startswith("UPDATE RUNS"):
            raise RuntimeError("simulated crash between round and run updates")

    engine = store._engine
    sa.event.listen(engine, "before_cursor_execute", crash_on_run_update)
    try:
        with pytest.raises((StoreError, RuntimeError)):
            store.finish_round(run_id, 1, status="completed", accuracy=0.9)
    finally:
        sa.event.remove(engine, "before_cursor_execute", crash_on_run_update)
    # The round's UPDATE reached the database before the crash ...
    assert any(s.upper() == "UPDATE ROUNDS" for s in seen), seen
    # ... and was rolled back with the failed run update.
    rnd = store.get_round(run_id, 1)
    assert rnd is not None and rnd.status == "open" and rnd.accuracy is None
    run = store.get_run(run_id)
    assert run is not None and (run.current_round, run.best_accuracy) == (0, None)

    done = store.finish_round(run_id, 1, status="completed", accuracy=0.9)
    run = store.get_run(run_id)
    assert done.status == "completed"
    assert run is not None and (run.current_round, run.best_accuracy) == (1, 0.9)


def test_update_participation_creates_rows_and_validates(store: Store) -> None:
    run_id = _run_with_clients(store, 3)
    store.start_round(
        run_id, 1, selected=["c0"], deadline_at=_deadline(), model_version=0
    )
    # c2 was not selected (e.g. a late volunteer): the row is created on demand.
    store.update_participation(run_id, 1, "c2", bytes_down=10, status="late")
    store.update_participation(run_id, 1, "c2", bytes_down=5, flags={"k": [1, 2]})
    [row] = store.list_participations(run_id, 1, "c2")
    assert (row.status, row.bytes_down, row.bytes_up, row.flags) == (
        "late",
        15,
        0,
        {"k": [1, 2]},
    )
    store.update_participation(run_id, 1, "c1")  # created with defaults
    [row] = store.list_participations(run_id, 1, "c1")
    assert (row.status, row.bytes_up, row.flags, row.weight) == (
        "selected",
        0,
        {},
        None,
    )

    bad: list[tuple[dict[str, Any], str]] = [
        ({"status": "winning"}, "status must be one of"),
        ({"bytes_up": -1}, ">= 0"),
        ({"bytes_down": 1.5}, "integer"),
        ({"train_loss": math.nan}, "finite"),
        ({"duration_s": -1.0}, ">= 0"),
        ({"weight": math.inf}, "finite"),
        ({"flags": {"s": math.nan}}, "JSON"),
        ({"flags": ["x"]}, "must be a dict"),
    ]
    for kwargs, match in bad:
        with pytest.raises(StoreError, match=match):
            store.update_participation(run_id, 1, "c0", **kwargs)
    with pytest.raises(StoreError, match="unknown round"):
        store.update_participation(run_id, 2, "c0", bytes_up=1)
    with pytest.raises(StoreError, match="unknown client"):
        store.update_participation(run_id, 1, "ghost", bytes_up=1)
    [c0] = store.list_participations(run_id, 1, "c0")
    assert (c0.status, c0.bytes_up, c0.bytes_down) == ("selected", 0, 0)


# --------------------------------------------------------------------------- #
# Metrics and events                                                           #
# --------------------------------------------------------------------------- #


def test_metrics(store: Store) -> None:
    run_id = _run_with_clients(store, 1)
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
    run_id = _run_with_clients(store, 1)
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


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(config=_json_objects, layout=_json_objects, flags=_json_objects)
def test_json_round_trips(
    store: Store,
    config: dict[str, Any],
    layout: dict[str, Any],
    flags: dict[str, Any],
) -> None:
    run = store.create_run(uuid.uuid4().hex, config, layout, 1)
    stored = store.get_run(run.id)
    assert stored is not None
    assert stored.config == config and stored.layout == layout
    assert list(stored.layout) == list(layout)  # key order survives
    store.upsert_client(run.id, "c", name="c", num_examples=0, info=flags)
    client = store.get_client(run.id, "c")
    assert client is not None and client.info == flags
    store.start_round(
        run.id, 1, selected=["c"], deadline_at=_deadline(), model_version=0
    )
    store.update_participation(run.id, 1, "c", flags=flags)
    assert store.list_participations(run.id, 1)[0].flags == flags
    store.add_event(run.id, "k", "m", details=flags)
    assert store.list_events(run.id)[0].details == flags


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
    run_id = _run_with_clients(store, n_threads, rounds=2)
    store.start_round(
        run_id, 1, selected=["c0"], deadline_at=_deadline(), model_version=0
    )
    errors: list[BaseException] = []
    barrier = threading.Barrier(n_threads)

    def work(t: int) -> None:
        try:
            barrier.wait()
            for i in range(n_ops):
                # Everyone adds to the same row: increments must not be lost.
                store.update_participation(run_id, 1, "c0", bytes_up=1, bytes_down=2)
                # Everyone races to create the same missing row on the first call.
                store.update_participation(run_id, 1, "c3", bytes_up=1)
                store.upsert_client(run_id, f"t{t}", name=f"thread {t}", num_examples=i)
                store.touch_client(run_id, f"c{t}", status="active")
                store.add_metrics(
                    run_id, {"a": float(i), "b": float(t)}, round_number=1
                )
                store.add_event(run_id, "tick", f"{t}:{i}", client_id=f"c{t}")
                store.list_participations(run_id, 1)
                store.list_events(run_id, limit=5)
        except BaseException as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads)
    assert errors == [], errors

    total = n_threads * n_ops
    [c0] = store.list_participations(run_id, 1, "c0")
    assert (c0.bytes_up, c0.bytes_down) == (total, 2 * total)
    [c3] = store.list_participations(run_id, 1, "c3")
    assert c3.bytes_up == total
    assert len(store.list_metrics(run_id)) == 2 * total
    assert len(store.list_events(run_id, kind="tick")) == total
    clients = {c.id: c for c in store.list_clients(run_id)}
    assert len(clients) == 2 * n_threads
    assert all(clients[f"c{t}"].status == "active" for t in range(n_threads))
    assert all(clients[f"t{t}"].num_examples == n_ops - 1 for t in range(n_threads))
    done = store.finish_round(run_id, 1, status="completed", accuracy=0.5)
    assert (done.bytes_up, done.bytes_down, done.num_failed) == (
        2 * total,
        2 * total,
        2,
    )


def test_insert_races_fall_back_to_update(store: Store, db_url: str) -> None:
    """A row created by another writer between our check and our INSERT is updated.

    Provoked deterministically: just before the store's INSERT, a second
    connection inserts and commits the same key. Only PostgreSQL can interleave
    like this; SQLite serialises writers with BEGIN IMMEDIATE.
    """
    if not db_url.startswith("postgresql"):
        pytest.skip("SQLite serialises writers; there is no race to provoke")
    run_id = _run_with_clients(store, 2)
    store.start_round(
        run_id, 1, selected=["c0"], deadline_at=_deadline(), model_version=0
    )
    other = sa.create_engine(db_url)
    competitor = {
        "participations": (
            "INSERT INTO participations (run_id, round_number, client_id, status,"
            " bytes_up, bytes_down, num_examples, flags_json, updated_at)"
            " VALUES (:run, 1, 'c1', 'downloaded', 100, 7, 0, '{}', now())"
        ),
        "clients": (
            "INSERT INTO clients (run_id, id, name, status, enrolled_at,"
            " num_examples, info_json)"
            " VALUES (:run, 'c9', 'theirs', 'enrolled', now(), 1, '{\"a\": 1}')"
        ),
    }
    fired: list[str] = []

    def sneak_in(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        for table, sql in competitor.items():
            if statement.startswith(f"INSERT INTO {table} ") and table not in fired:
                fired.append(table)
                with other.begin() as c:
                    c.execute(sa.text(sql), {"run": run_id})

    sa.event.listen(store._engine, "before_cursor_execute", sneak_in)
    try:
        store.update_participation(run_id, 1, "c1", status="succeeded", bytes_up=5)
        client = store.upsert_client(run_id, "c9", name="mine", num_examples=3)
    finally:
        sa.event.remove(store._engine, "before_cursor_execute", sneak_in)
        other.dispose()
    assert sorted(fired) == ["clients", "participations"]
    [row] = store.list_participations(run_id, 1, "c1")
    assert (row.status, row.bytes_up, row.bytes_down) == ("succeeded", 105, 7)
    assert (client.name, client.num_examples, client.info) == ("mine", 3, {"a": 1})

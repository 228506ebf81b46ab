"""The store's schema migrations, on SQLite and PostgreSQL (see ``conftest.py``):
the head matches the models, every revision downgrades and upgrades again, and
data written under revision 0002 survives 0003's change of the verdict columns.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from fedplat.store import (
    ContributionRecord,
    ContributionRow,
    ParticipationRow,
    Store,
    StoreError,
    Verdict,
    current_revision,
    downgrade,
    head_revision,
    migrate,
)
from fedplat.store.engine import make_engine
from fedplat.store.models import Base
from tests.support import REPO
from tests.support.store import ok, play_round, run_with_clients, sql

#: Tables of revision 0001, and what 0002, 0003 and 0004 add.
TABLES_0001 = {"runs", "clients", "rounds", "participations", "metrics", "events"}
TABLES_0002 = TABLES_0001 | {"ledger_entries", "ledger_heads"}
TABLES_0003 = TABLES_0002 | {"enrolment_tokens", "contributions"}
TABLES_0004 = TABLES_0003 | {"operator_revocations"}


def _schema_diff(url: str) -> list[Any]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            return list(compare_metadata(ctx, Base.metadata))
    finally:
        engine.dispose()


def _inspect(url: str) -> tuple[str | None, set[str], dict[str, set[str]]]:
    """Revision, tables, and the columns of each table."""
    engine = make_engine(url)
    try:
        insp = sa.inspect(engine)
        tables = set(insp.get_table_names()) - {"alembic_version"}
        columns = {t: {c["name"] for c in insp.get_columns(t)} for t in tables}
        return current_revision(engine), tables, columns
    finally:
        engine.dispose()


def _counts(url: str, tables: set[str]) -> dict[str, int]:
    return {t: sql(url, f"SELECT count(*) FROM {t}")[0][0] for t in sorted(tables)}


def test_head_matches_the_models_and_downgrades_to_base_and_back(
    db_url: str,
) -> None:
    assert head_revision() == "0005"
    migrate(db_url)
    assert _schema_diff(db_url) == []
    rev, tables, _ = _inspect(db_url)
    assert (rev, tables) == ("0005", TABLES_0004)

    downgrade(db_url, "base")
    rev, tables, _ = _inspect(db_url)
    assert (rev, tables) == (None, set())

    migrate(db_url)
    assert _inspect(db_url)[:2] == ("0005", TABLES_0004)
    assert _schema_diff(db_url) == []


def test_a_reader_asks_the_store_for_its_revision(db_url: str) -> None:
    """The monitor's check before it reads: no engine of its own, no migration."""
    with Store(db_url, migrate=False) as reader:
        assert reader.schema_revision() is None  # never migrated
        migrate(db_url, "0002")
        assert reader.schema_revision() == "0002"
        migrate(db_url)
        assert reader.schema_revision() == head_revision()
    with pytest.raises(StoreError, match="closed"):
        reader.schema_revision()


@pytest.mark.integration
def test_concurrent_first_opens_migrate_once(db_url: str) -> None:
    """Services opening a fresh database at once (processes and threads) all work."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}
    code = "import sys; from fedplat.store import Store; Store(sys.argv[1]).close()"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, db_url], env=env, cwd=REPO)
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


# What a coordinator before 0003 wrote into participations.flags_json: the
# aggregator's decision, with contribution accounting's verdict merged in.
_OLD_FLAGS = {
    "c0": {"selected": True, "score": 1.5, "flags": ["clipped"]},
    "c1": {
        "selected": False,
        "score": 9,
        "flags": ["krum_excluded", 7],
        "contribution": {"flags": ["zero-update"], "suspect": True, "score": 0.0},
    },
    "c2": {"contribution": {"flags": [], "suspect": False, "score": 0.25}},
    "c3": {},
}


def _write_0002_round(url: str) -> None:
    """A run with one completed round, as revision 0002's coordinator left it."""
    now = "CURRENT_TIMESTAMP"
    sql(
        url,
        "INSERT INTO runs (id, name, status, config_json, layout_json, total_rounds,"
        " current_round, best_accuracy, created_at, started_at, finished_at)"
        f" VALUES ('r1', 'old', 'running', '{{}}', '{{}}', 3, 1, 0.5, {now}, {now},"
        " NULL)",
    )
    for cid in _OLD_FLAGS:
        sql(
            url,
            "INSERT INTO clients (run_id, id, name, status, enrolled_at, last_seen,"
            f" num_examples, info_json) VALUES ('r1', :c, :c, 'active', {now}, {now},"
            " 10, '{}')",
            c=cid,
        )
    sql(
        url,
        "INSERT INTO rounds (run_id, number, status, started_at, finished_at,"
        " deadline_at, num_selected, num_succeeded, num_failed, accuracy, loss,"
        " model_version, checkpoint_path, checkpoint_sha256, bytes_up, bytes_down,"
        f" reason) VALUES ('r1', 1, 'completed', {now}, {now}, NULL, 4, 3, 1, 0.5,"
        " 1.0, 0, NULL, NULL, 40, 80, NULL)",
    )
    sql(
        url,
        "INSERT INTO metrics (run_id, round_number, client_id, name, value,"
        f" created_at) VALUES ('r1', 1, NULL, 'accuracy', 0.5, {now})",
    )
    sql(
        url,
        "INSERT INTO events (run_id, round_number, client_id, kind, level, message,"
        f" details_json, created_at) VALUES ('r1', 1, NULL, 'round_completed',"
        f" 'info', 'done', '{{}}', {now})",
    )
    for cid, flags in _OLD_FLAGS.items():
        sql(
            url,
            "INSERT INTO participations (run_id, round_number, client_id, status,"
            " bytes_up, bytes_down, num_examples, duration_s, train_loss, weight,"
            " flags_json, reason, updated_at) VALUES ('r1', 1, :c, :s, 10, 20, 10,"
            f" NULL, NULL, :w, :f, NULL, {now})",
            c=cid,
            s="late" if cid == "c3" else "succeeded",
            w=0.0 if cid == "c1" else 0.5,
            f=json.dumps(flags),
        )


def test_0003_moves_0002_flags_into_typed_columns(db_url: str) -> None:
    migrate(db_url, "0002")
    _write_0002_round(db_url)
    before = _counts(db_url, TABLES_0001)
    migrate(db_url)
    assert _schema_diff(db_url) == []
    # Rebuilding a table (SQLite's batch mode) must not cascade into its
    # children: every row of 0002 is still there.
    assert (
        _counts(db_url, TABLES_0001)
        == before
        == {
            "clients": 4,
            "events": 1,
            "metrics": 1,
            "participations": 4,
            "rounds": 1,
            "runs": 1,
        }
    )
    with Store(db_url, migrate=False) as store:
        verdicts = {p.client_id: p.verdict for p in store.list_participations("r1")}
        assert verdicts == {
            "c0": Verdict(0.5, True, 1.5, ("clipped",)),
            # Non-string labels cannot be typed flags; they are dropped.
            "c1": Verdict(0.0, False, 9.0, ("krum_excluded",)),
            "c2": Verdict(0.5, None, None, ()),
            "c3": Verdict(0.5, None, None, ()),
        }
        # The merged contribution verdicts became rows of their own (the old
        # shape had no per-scorer scores).
        assert store.list_contributions("r1") == [
            ContributionRecord("r1", 1, "c1", 0.0, {}, True, ("zero-update",)),
            ContributionRecord("r1", 1, "c2", 0.25, {}, False, ()),
        ]
        rnd = store.get_round("r1", 1)
        assert rnd is not None and (rnd.num_succeeded, rnd.num_aggregated) == (3, 3)
        run = store.get_run("r1")
        assert run is not None and (run.current_round, run.heartbeat_at) == (1, None)
        assert [c.public_key for c in store.list_clients("r1")] == [None] * 4
    assert "flags_json" not in _inspect(db_url)[2]["participations"]


def test_downgrade_to_0002_restores_flags_json(db_url: str) -> None:
    with Store(db_url) as store:
        run_id = run_with_clients(store, 3)
        play_round(
            store,
            run_id,
            1,
            (
                ok("c0", verdict=Verdict(0.5, True, 1.5, ("clipped",))),
                ok("c1", verdict=Verdict(0.0, False, None, ("krum_excluded",))),
                ParticipationRow("c2", "rejected", reason="nan"),
            ),
            contributions=(
                ContributionRow("c0", 0.2, {"gtg": 0.2}, False),
                ContributionRow("c1", 0.0, {"gtg": 0.0}, True, ("zero-update",)),
            ),
        )
        store.add_event(run_id, "k", "m")
        before = store.list_participations(run_id)
    counts = _counts(db_url, TABLES_0001)
    downgrade(db_url, "0002")
    assert _counts(db_url, TABLES_0001) == counts  # nothing cascaded away
    rev, tables, columns = _inspect(db_url)
    assert (rev, tables) == ("0002", TABLES_0002)
    assert {"flags_json", "weight"} <= columns["participations"]
    assert not {"selected", "score", "flags"} & columns["participations"]
    assert not {"public_key", "revoked_at"} & columns["clients"]
    assert "heartbeat_at" not in columns["runs"]
    assert "num_aggregated" not in columns["rounds"]
    stored = {
        c: json.loads(f)
        for c, f in sql(
            db_url,
            "SELECT client_id, flags_json FROM participations WHERE run_id = :r",
            r=run_id,
        )
    }
    assert stored == {
        "c0": {
            "selected": True,
            "score": 1.5,
            "flags": ["clipped"],
            "contribution": {"flags": [], "suspect": False, "score": 0.2},
        },
        "c1": {
            "selected": False,
            "score": None,
            "flags": ["krum_excluded"],
            "contribution": {"flags": ["zero-update"], "suspect": True, "score": 0.0},
        },
        "c2": {},
    }

    # And up again: the verdicts come back; the per-scorer scores, which 0002
    # could not hold, do not.
    migrate(db_url)
    assert _counts(db_url, TABLES_0001) == counts
    with Store(db_url, migrate=False) as store:
        assert [p.verdict for p in store.list_participations(run_id)] == [
            p.verdict for p in before
        ]
        assert [
            (c.client_id, c.score, c.scores) for c in store.list_contributions(run_id)
        ] == [
            ("c0", 0.2, {}),
            ("c1", 0.0, {}),
        ]

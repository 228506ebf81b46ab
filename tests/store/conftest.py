"""Store fixtures: every store test runs on SQLite and, when FEDPLAT_TEST_PG_URL is
set, on PostgreSQL.

Start a throwaway PostgreSQL with::

    eval "$(scripts/pg_throwaway.sh start "$(mktemp -d)" 55432)"
    python -m pytest tests/store
    scripts/pg_throwaway.sh stop DIR

(``scripts/run_tests.sh`` does this by itself.) Each PostgreSQL test runs in a
schema of its own (dropped afterwards), so the tests need only CREATE on the
database, not CREATEDB.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from fedplat.store import Store

PG_URL = os.environ.get("FEDPLAT_TEST_PG_URL")

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
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
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

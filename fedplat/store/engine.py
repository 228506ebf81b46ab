"""Engine construction: URL resolution and the SQLite settings the store relies on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.pool import StaticPool

#: Execution option that makes a SQLite transaction start with ``BEGIN IMMEDIATE``.
WRITE_TRANSACTION_OPTION = "fedplat_write"

# Writers wait this long for SQLite's single write lock before giving up. The
# coordinator writes from several gRPC threads; 30 s rides out any realistic burst.
SQLITE_BUSY_TIMEOUT_S = 30


def resolve_url(url: str) -> URL:
    """Turn a store location into a SQLAlchemy URL.

    Parameters
    ----------
    url
        Any SQLAlchemy URL, or a plain filesystem path (no ``"://"``), which means a
        SQLite database at that path.

    Returns
    -------
    URL
        The parsed URL. For file-backed SQLite the parent directory is created.
    """
    if "://" not in url:
        path = Path(url).expanduser().resolve()
        parsed = URL.create("sqlite", database=str(path))
    else:
        parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and not _is_sqlite_memory(parsed):
        database = parsed.database or ""
        if not database.startswith("file:"):
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    return parsed


def _is_sqlite_memory(url: URL) -> bool:
    database = url.database or ""
    return database in ("", ":memory:") or "mode=memory" in str(url)


def make_engine(url: str | URL) -> Engine:
    """Create an engine configured for concurrent use by the store.

    On SQLite this enables WAL (readers never block the writer), foreign keys
    (off by default in SQLite), a busy timeout, cross-thread connections, and
    SQLAlchemy-controlled transactions so writes can take the write lock up front.

    Parameters
    ----------
    url
        A SQLAlchemy URL or a plain path (see :func:`resolve_url`).

    Returns
    -------
    Engine
        A new engine; the caller owns it and must ``dispose()`` it.
    """
    parsed = resolve_url(url) if isinstance(url, str) else url
    if parsed.get_backend_name() != "sqlite":
        # pre_ping: a coordinator runs for days; PostgreSQL restarts and idle
        # timeouts must not surface as errors in the round engine.
        return create_engine(parsed, pool_pre_ping=True)

    kwargs: dict[str, Any] = {
        "connect_args": {
            "check_same_thread": False,
            "timeout": SQLITE_BUSY_TIMEOUT_S,
        }
    }
    if _is_sqlite_memory(parsed):
        # Every connection to a plain ":memory:" URL is a separate empty
        # database; sharing one connection is the only way to see one database.
        kwargs["poolclass"] = StaticPool
    engine = create_engine(parsed, **kwargs)
    _install_sqlite_hooks(engine)
    return engine


def _install_sqlite_hooks(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy emit BEGIN itself (see _on_begin); the sqlite3 module's
        # own implicit BEGIN is deferred and skipped for SELECT and DDL.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_S * 1000}")
            # Durable at every checkpoint and safe against corruption under WAL;
            # FULL would fsync on every commit for little extra protection.
            cursor.execute("PRAGMA synchronous=NORMAL")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # A deferred transaction that reads and then writes cannot wait for the
        # lock: if another writer committed in between, SQLite fails at once with
        # "database is locked" (SQLITE_BUSY_SNAPSHOT) regardless of busy_timeout.
        # Write transactions therefore take the write lock at BEGIN, where the
        # busy timeout applies; read-only ones stay deferred and never block.
        if conn.get_execution_options().get(WRITE_TRANSACTION_OPTION):
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            conn.exec_driver_sql("BEGIN")


__all__ = ["WRITE_TRANSACTION_OPTION", "make_engine", "resolve_url"]

"""Alembic environment for the fedplat store.

Normally driven by :func:`fedplat.store.schema.migrate`, which passes the engine in
``config.attributes["engine"]``. From the command line (``alembic -c
fedplat/store/alembic.ini upgrade head``) the URL comes from ``-x url=...``, then
``$FEDPLAT_STORE_URL``, then ``sqlalchemy.url`` in the ini file.
"""

from __future__ import annotations

import logging.config
import os

from alembic import context
from sqlalchemy import Connection, Engine, text

from fedplat.store.engine import WRITE_TRANSACTION_OPTION, make_engine
from fedplat.store.models import Base

config = context.config
# Arbitrary constant identifying "fedplat schema migration" among advisory locks.
_PG_MIGRATION_LOCK_KEY = 0x6665_6470_6C61_7400  # "fedplat\0"
target_metadata = Base.metadata

# Only configure logging when run from an ini file: a programmatic migration
# inside the coordinator must not replace the application's logging setup.
if config.config_file_name is not None and "engine" not in config.attributes:
    logging.config.fileConfig(config.config_file_name, disable_existing_loggers=False)


def _url() -> str:
    url = (
        context.get_x_argument(as_dictionary=True).get("url")
        or os.environ.get("FEDPLAT_STORE_URL")
        or config.get_main_option("sqlalchemy.url")
    )
    if not url:
        raise RuntimeError(
            "no database URL: pass -x url=..., set FEDPLAT_STORE_URL, "
            "or set sqlalchemy.url"
        )
    return url


def run_migrations_offline() -> None:
    """Emit the migration SQL to stdout instead of running it."""
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _sqlite_foreign_keys(connection: Connection, on: bool) -> None:
    """Switch SQLite's foreign-key enforcement on the raw connection.

    Batch mode rebuilds a table by copying it and dropping the original; with
    enforcement on, that DROP TABLE deletes every row first and its ON DELETE
    CASCADE empties the child tables (rebuilding ``clients`` would delete every
    participation). The pragma is a no-op inside a transaction, so it is set
    on the DBAPI connection, which runs in autocommit mode (engine.py), before
    SQLAlchemy begins one.
    """
    dbapi = connection.connection.dbapi_connection
    assert dbapi is not None
    cursor = dbapi.cursor()
    try:
        cursor.execute(f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")
    finally:
        cursor.close()


def _check_sqlite_foreign_keys(connection: Connection) -> None:
    # Enforcement was off while the tables were rebuilt: prove nothing dangles
    # before committing (raising rolls the whole migration back).
    broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
    if broken:
        raise RuntimeError(f"migration left dangling foreign keys: {broken[:5]}")


def run_migrations_online() -> None:
    """Run the migrations on a live connection."""
    given = config.attributes.get("engine")
    engine: Engine = given if isinstance(given, Engine) else make_engine(_url())
    try:
        # Take SQLite's write lock up front: two processes migrating the same
        # file must queue on the busy timeout instead of failing mid-migration.
        writer = engine.execution_options(**{WRITE_TRANSACTION_OPTION: True})
        with writer.connect() as connection:
            sqlite = connection.dialect.name == "sqlite"
            if sqlite:
                _sqlite_foreign_keys(connection, False)
            try:
                _migrate(connection, sqlite)
            finally:
                if sqlite:
                    # The connection goes back to the store's pool.
                    _sqlite_foreign_keys(connection, True)
    finally:
        if engine is not given:
            engine.dispose()


def _migrate(connection: Connection, sqlite: bool) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds the table.
        render_as_batch=sqlite,
        # SQLite's DDL is transactional once SQLAlchemy, not the sqlite3
        # module, emits BEGIN (engine.py); Alembic assumes otherwise and
        # would commit after each revision, leaving half-upgraded files.
        transactional_ddl=True,
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Serialise concurrent migrators (several services starting at
            # once); released at commit. SQLite's BEGIN IMMEDIATE already does.
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"),
                {"key": _PG_MIGRATION_LOCK_KEY},
            )
        context.run_migrations()
        if sqlite:
            _check_sqlite_foreign_keys(connection)


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()

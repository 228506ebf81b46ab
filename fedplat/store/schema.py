"""Programmatic Alembic: upgrade, downgrade and inspect the store's schema."""

from __future__ import annotations

import threading
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine
from sqlalchemy.engine import URL

from fedplat.store.engine import make_engine

#: Resolved from this file, not the working directory, so migrations run the same
#: from a checkout, an installed wheel, or a container.
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

# Alembic keeps the running migration's context in module globals
# (``alembic.context``), so two migrations in one process must not overlap.
# Across processes the database itself serialises them (see env.py).
_MIGRATION_LOCK = threading.Lock()


def alembic_config(engine: Engine | None = None) -> Config:
    """Build an Alembic configuration pointing at the packaged migrations.

    Parameters
    ----------
    engine
        When given, ``env.py`` runs on a connection of this engine (so SQLite
        pragmas and transaction handling of :func:`make_engine` apply).

    Returns
    -------
    Config
        A configuration without an ini file.
    """
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if engine is not None:
        config.attributes["engine"] = engine
        # Alembic interpolates "%" in option values; escape it for passwords.
        rendered = engine.url.render_as_string(hide_password=False)
        config.set_main_option("sqlalchemy.url", rendered.replace("%", "%%"))
    return config


def _run(url: str | URL | Engine, revision: str, *, down: bool) -> None:
    engine = url if isinstance(url, Engine) else make_engine(url)
    try:
        config = alembic_config(engine)
        with _MIGRATION_LOCK:
            if down:
                command.downgrade(config, revision)
            else:
                command.upgrade(config, revision)
    finally:
        if engine is not url:
            engine.dispose()


def migrate(url: str | URL | Engine, revision: str = "head") -> None:
    """Upgrade the database at ``url`` to ``revision`` (default: the latest).

    Parameters
    ----------
    url
        A SQLAlchemy URL, a plain SQLite path, or an existing engine.
    revision
        Alembic revision identifier.
    """
    _run(url, revision, down=False)


def downgrade(url: str | URL | Engine, revision: str = "base") -> None:
    """Downgrade the database at ``url`` to ``revision`` (default: empty).

    Parameters
    ----------
    url
        A SQLAlchemy URL, a plain SQLite path, or an existing engine.
    revision
        Alembic revision identifier; ``"base"`` drops every table.
    """
    _run(url, revision, down=True)


def head_revision() -> str | None:
    """Return the newest revision shipped with this package."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(engine: Engine) -> str | None:
    """Return the revision the database is at, or ``None`` if never migrated."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


__all__ = [
    "MIGRATIONS_DIR",
    "alembic_config",
    "current_revision",
    "downgrade",
    "head_revision",
    "migrate",
]

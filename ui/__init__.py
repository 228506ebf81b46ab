"""The fedplat monitor: a read-only Streamlit client of the store.

Start it with ``fedplat monitor --db URL`` (the ``ui`` extra installs Streamlit
and Altair). :mod:`fedplat.ui.data` shapes store records into frames,
:mod:`fedplat.ui.charts` draws them, and ``app.py`` with ``views/`` is the app.
This module imports neither Streamlit nor pandas, so the CLI can use it cheaply.
"""

from __future__ import annotations

from pathlib import Path

#: The Streamlit entry script (``streamlit run`` this file).
APP_PATH = Path(__file__).resolve().parent / "app.py"
#: Database URL (or SQLite path) of the store; ``fedplat monitor --db`` sets it.
DB_ENV = "FEDPLAT_MONITOR_DB"
#: Seconds between refreshes of live panels; ``fedplat monitor --refresh`` sets it.
REFRESH_ENV = "FEDPLAT_MONITOR_REFRESH"
#: A file holding the monitor's password (or its hash); set, every session must
#: sign in first. ``fedplat monitor --password-file`` sets it.
PASSWORD_FILE_ENV = "FEDPLAT_MONITOR_PASSWORD_FILE"


def sqlite_file(url: str) -> Path | None:
    """The file a SQLite store URL (or bare path) names; ``None`` for other
    databases and in-memory or ``file:`` URIs. Raises if the URL does not parse.

    Not the store's ``resolve_url``: that creates missing parent directories, and
    a read-only monitor pointed at a mistyped path must not leave folders behind.
    """
    if "://" not in url:
        return Path(url).expanduser()
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    database = parsed.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        return None
    return Path(database)


def display_url(url: str) -> str:
    """The store URL with any password masked, for logs and the sidebar."""
    if "://" not in url:  # a SQLite path holds no secret
        return url
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # malformed: opening it reports the error; hide it all
        return "<unparsable URL>"


__all__ = [
    "APP_PATH",
    "DB_ENV",
    "PASSWORD_FILE_ENV",
    "REFRESH_ENV",
    "display_url",
    "sqlite_file",
]

"""Streamlit glue shared by the monitor's pages: the store, cached queries, the run
picker and the live-refresh setting.

The monitor is a read-only client of the store. The :class:`~fedplat.store.Store`
is opened once per database URL with ``st.cache_resource`` and ``migrate=False``
(only the coordinator changes the schema); every query result is cached with
``st.cache_data(ttl=...)`` keyed by the URL, so many browser tabs polling the same
run cost one query per TTL, and live panels re-run inside ``st.fragment``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

import altair as alt
import pandas as pd
import streamlit as st
from fedplat.ui import DB_ENV, REFRESH_ENV, data, display_url, ledger
from sqlalchemy import Engine, inspect
from sqlalchemy.engine import make_url

from fedplat.store import (
    ClientRecord,
    EventRecord,
    LedgerEntryRecord,
    MetricRecord,
    RunRecord,
    Store,
    StoreError,
    current_revision,
    head_revision,
)
from fedplat.store.engine import make_engine

DEFAULT_REFRESH_S = 3.0


def _refresh_from_env() -> float:
    try:
        value = float(os.environ.get(REFRESH_ENV, DEFAULT_REFRESH_S))
    except ValueError:
        return DEFAULT_REFRESH_S
    return value if value > 0 else DEFAULT_REFRESH_S


REFRESH_S = _refresh_from_env()
# Polled data may be at most one refresh old; a shorter TTL would only add load
# when several sessions watch the same run.
TTL_S = REFRESH_S

LIVE_KEY = "fedplat_live"
RUN_KEY = "fedplat_run"


def database_url() -> str | None:
    """The store to read: ``--db`` after ``streamlit run app.py --``, else the
    ``FEDPLAT_MONITOR_DB`` environment variable."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--db")
    known, _ = parser.parse_known_args(sys.argv[1:])
    url = known.db or os.environ.get(DB_ENV)
    return url or None


@st.cache_resource(show_spinner=False)
def open_store(url: str) -> Store:
    """One read-only store per database for the whole server process."""
    return Store(url, migrate=False)


@st.cache_resource(show_spinner=False)
def open_engine(url: str) -> Engine:
    """An engine for schema introspection (which optional tables exist)."""
    return make_engine(url)


def _sqlite_file(url: str) -> Path | None:
    # Not resolve_url: it creates missing parent directories, and a read-only
    # monitor pointed at a mistyped path must not leave folders behind.
    if "://" not in url:
        return Path(url).expanduser()
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    database = parsed.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        return None
    return Path(database)


def store_or_stop() -> str:
    """Check the configured store is readable and return its URL.

    Stops the page with a message saying what is wrong otherwise: no URL given,
    a SQLite file that does not exist (opening it would create an empty one), a
    database the coordinator never migrated, or one at another schema revision
    than this monitor reads (its queries name every column of the head schema).
    """
    url = database_url()
    if url is None:
        st.error(
            "No database configured. Start the monitor with "
            "`fedplat monitor --db URL` (a SQLite path or a SQLAlchemy URL), "
            f"or set `{DB_ENV}`."
        )
        st.stop()
    assert url is not None  # st.stop() does not return
    try:
        path = _sqlite_file(url)
    except Exception as exc:
        st.error(f"Cannot parse the database URL {url!r}: {exc}")
        st.stop()
    if path is not None and not path.exists():
        st.error(
            f"No database at `{path}`. The coordinator creates it when it starts; "
            "check the path given to `fedplat monitor --db`."
        )
        st.stop()
    try:
        has_runs = inspect(open_engine(url)).has_table("runs")
    except Exception as exc:
        st.error(f"Cannot open the store at `{display_url(url)}`: {exc}")
        st.stop()
    if not has_runs:
        st.warning(
            f"The database at `{display_url(url)}` has no fedplat tables yet. "
            "They are created when a coordinator first starts on it."
        )
        st.stop()
    at, want = current_revision(open_engine(url)), head_revision()
    if at != want:
        st.warning(
            f"The database at `{display_url(url)}` is at schema revision `{at}`; "
            f"this monitor reads revision `{want}`. A coordinator of this fedplat "
            "version upgrades it when it opens it (`fedplat.store.migrate`); the "
            "monitor never changes the schema."
        )
        st.stop()
    return url


# --------------------------------------------------------------------------- #
# Cached queries (keyed by URL; results are detached records or frames)        #
# --------------------------------------------------------------------------- #


@st.cache_data(ttl=TTL_S, show_spinner=False)
def load_runs(url: str) -> pd.DataFrame:
    return data.runs_frame(open_store(url))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def load_run(url: str, run_id: str) -> RunRecord | None:
    return open_store(url).get_run(run_id)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def load_rounds(url: str, run_id: str) -> pd.DataFrame:
    store = open_store(url)
    return data.rounds_frame(
        store.list_rounds(run_id), store.list_participations(run_id)
    )


@st.cache_data(ttl=TTL_S, show_spinner=False)
def load_participations(url: str, run_id: str) -> pd.DataFrame:
    store = open_store(url)
    return data.participations_frame(
        store.list_participations(run_id),
        store.list_clients(run_id),
        store.list_contributions(run_id),
    )


@st.cache_data(ttl=TTL_S, show_spinner=False)
def load_contributions(url: str, run_id: str) -> ledger.Contributions:
    store = open_store(url)
    return ledger.contributions(
        store.list_clients(run_id),
        _ledger_entries(url, store, run_id),
        store.list_metrics(run_id),
    )


@st.cache_data(ttl=TTL_S, show_spinner=False)
def load_clients(url: str, run_id: str) -> pd.DataFrame:
    store = open_store(url)
    clients = store.list_clients(run_id)
    parts = data.participations_frame(
        store.list_participations(run_id), clients, store.list_contributions(run_id)
    )
    board = load_contributions(url, run_id).board
    return data.clients_frame(clients, parts, board)


def _ledger_entries(url: str, store: Store, run_id: str) -> list[LedgerEntryRecord]:
    # A database migrated before the ledger existed has no table to read.
    if ledger.missing_ledger_tables(open_engine(url)):
        return []
    return store.list_ledger_entries(run_id)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def load_client_records(url: str, run_id: str) -> list[ClientRecord]:
    return open_store(url).list_clients(run_id)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def load_metrics(url: str, run_id: str) -> list[MetricRecord]:
    return open_store(url).list_metrics(run_id)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def load_events(url: str, run_id: str, limit: int = 500) -> list[EventRecord]:
    return open_store(url).list_events(run_id, limit=limit)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def load_gossip_events(url: str, run_id: str) -> list[EventRecord]:
    # Graph changes are replayed from the start, so they are read without the
    # log's limit; they are few (one per disruption), unlike round events.
    events = open_store(url).list_events(run_id)
    return [e for e in events if e.kind.startswith("gossip_")]


@st.cache_data(ttl=TTL_S, show_spinner=False)
def load_ledger(url: str, run_id: str) -> tuple[ledger.LedgerCheck, pd.DataFrame]:
    """The ledger's verification and its entries (empty if there is none)."""
    store = open_store(url)
    check = ledger.verify_ledger(store, open_engine(url), run_id)
    return check, ledger.ledger_frame(_ledger_entries(url, store, run_id), check)


# --------------------------------------------------------------------------- #
# Widgets shared by the pages                                                  #
# --------------------------------------------------------------------------- #


def sidebar_settings(url: str | None) -> None:
    """The entry script's sidebar: which store, and whether panels refresh."""
    with st.sidebar:
        st.caption("Store (read-only)")
        st.code(display_url(url) if url else "not configured", language=None)
        st.toggle(
            f"Live refresh (every {REFRESH_S:g} s)",
            value=True,
            key=LIVE_KEY,
            help="Re-read the store periodically while this page is open.",
        )


def refresh_every() -> float | None:
    """``run_every`` for live fragments: the refresh period, or ``None`` if off."""
    return REFRESH_S if st.session_state.get(LIVE_KEY, True) else None


def live(body: Callable[[], None]) -> None:
    """Run ``body`` as a fragment that re-runs on its own every refresh period,
    so a live panel updates without re-running (and resetting) the whole page."""
    st.fragment(body, run_every=refresh_every())()


def pick_run(runs: pd.DataFrame, *, label: str = "Run") -> str:
    """A run picker in the sidebar; the choice survives page switches and is
    mirrored in the ``?run=`` query parameter so a page can be linked to.

    ``runs`` must be non-empty (callers show their empty state first).
    """
    ids = list(runs["run_id"])
    by_id = runs.set_index("run_id")
    wanted = st.query_params.get("run") or st.session_state.get(RUN_KEY)
    index = ids.index(wanted) if wanted in ids else 0

    def _label(run_id: str) -> str:
        row = by_id.loc[run_id]
        return f"{row['name']} · {row['status']} · {row['progress']}"

    choice = st.sidebar.selectbox(label, ids, index=index, format_func=_label)
    run_id = str(choice)
    st.session_state[RUN_KEY] = run_id
    if st.query_params.get("run") != run_id:
        st.query_params["run"] = run_id
    return run_id


# Left to size a chart itself, Streamlit fits it into less than the spec's height
# and a discrete y axis (heat map, one bar per client) collapses to a sliver; so
# charts get their spec's plot height plus room for the title and x axis.
CHART_MARGIN_PX = 90


def show(chart: alt.Chart | alt.LayerChart | alt.ConcatChart) -> None:
    """Draw an Altair chart at the full width and its declared height."""
    height = getattr(chart, "height", None)
    if isinstance(height, int):
        st.altair_chart(chart, width="stretch", height=height + CHART_MARGIN_PX)
    else:  # compound charts (concat) size their panels themselves
        st.altair_chart(chart)


def status_badge(status: str) -> str:
    """Markdown badge for a run/round status."""
    color = {
        "running": "blue",
        "completed": "green",
        "failed": "red",
        "pending": "gray",
        "open": "blue",
    }.get(status, "gray")
    return f":{color}-badge[{status}]"


def fail_softly(exc: StoreError) -> None:
    """Show a store error (e.g. the database went away) instead of a traceback."""
    st.error(f"Could not read the store: {exc}")


__all__ = [
    "DB_ENV",
    "REFRESH_ENV",
    "database_url",
    "display_url",
    "fail_softly",
    "live",
    "load_client_records",
    "load_clients",
    "load_contributions",
    "load_events",
    "load_gossip_events",
    "load_ledger",
    "load_metrics",
    "load_participations",
    "load_rounds",
    "load_run",
    "load_runs",
    "open_engine",
    "open_store",
    "pick_run",
    "refresh_every",
    "show",
    "sidebar_settings",
    "status_badge",
    "store_or_stop",
]

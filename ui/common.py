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
from datetime import UTC, datetime

import altair as alt
import pandas as pd
import streamlit as st
from fedplat.ui import (
    DB_ENV,
    REFRESH_ENV,
    audit,
    data,
    display_url,
    ledger,
    recorded,
    sqlite_file,
    status,
)
from fedplat.ui.clients import CLIENT_COLUMNS, clients_frame
from fedplat.ui.markup import clean, code, plain

from fedplat.store import (
    ClientRecord,
    EventRecord,
    MetricRecord,
    RunRecord,
    Store,
    StoreError,
    head_revision,
)
from fedplat.summary import LedgerCheck, RunSummary, ledger_check, run_summary

DEFAULT_REFRESH_S = 3.0
#: What a page says about a database without runs.
NO_RUNS = (
    "No runs in this database yet. Start one with "
    "`fedplat coordinator --config run.yaml`; it appears here as soon as the "
    "coordinator registers it."
)


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
        path = sqlite_file(url)
    except Exception as exc:
        # Neither the URL nor the parser's message (which quotes it): a URL that
        # does not parse may still hold a password.
        st.error(
            f"Cannot parse the database URL ({plain(type(exc).__name__)}); check "
            f"`fedplat monitor --db` or `{DB_ENV}`."
        )
        st.stop()
    if path is not None and not path.exists():
        st.error(
            f"No database at {code(path)}. The coordinator creates it when it "
            "starts; check the path given to `fedplat monitor --db`."
        )
        st.stop()
    shown = code(display_url(url))
    try:
        at = open_store(url).schema_revision()
    except StoreError as exc:
        st.error(f"Cannot open the store at {shown}: {plain(exc)}")
        st.stop()
    if at is None:
        st.warning(
            f"The database at {shown} has no fedplat tables yet. "
            "They are created when a coordinator first starts on it."
        )
        st.stop()
    want = head_revision()
    if at != want:
        st.warning(
            f"The database at {shown} is at schema revision {code(at)}; "
            f"this monitor reads revision {code(want)}. A coordinator of this fedplat "
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
def load_rank_names(url: str) -> list[str]:
    return recorded.rank_metric_names(open_store(url))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def load_best(url: str, metric: str, lowest: bool) -> pd.DataFrame:
    return recorded.best_by_run(open_store(url), metric, lowest)


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
        store.list_ledger_entries(run_id),
        store.list_metrics(run_id),
    )


@st.cache_data(ttl=TTL_S, show_spinner=False)
def load_run_view(url: str, run_id: str) -> status.RunView | None:
    """The run's displayed state (``None`` if the run is gone)."""
    store = open_store(url)
    run = store.get_run(run_id)
    if run is None:
        return None
    reason = data.failure_reason(run, store.list_events(run_id, limit=50))
    return status.run_view(run, datetime.now(UTC), reason)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def load_clients(url: str, run_id: str) -> pd.DataFrame:
    store = open_store(url)
    view = load_run_view(url, run_id)
    clients = store.list_clients(run_id)
    if view is None:
        return pd.DataFrame(columns=CLIENT_COLUMNS)
    parts = data.participations_frame(
        store.list_participations(run_id), clients, store.list_contributions(run_id)
    )
    board = load_contributions(url, run_id).board
    return clients_frame(clients, parts, board, run=view)


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
def load_audit(url: str, limit: int = 500) -> pd.DataFrame:
    """The newest control API calls (audit events of every run and none)."""
    store = open_store(url)
    names = {r.id: r.name for r in store.list_runs()}
    return audit.audit_frame(store.list_events(kind="audit", limit=limit), names)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def load_gossip_events(url: str, run_id: str) -> list[EventRecord]:
    # Graph changes are replayed from the start, so they are read without the
    # log's limit; they are few (one per disruption), unlike round events.
    events = open_store(url).list_events(run_id)
    return [e for e in events if e.kind.startswith("gossip_")]


@st.cache_data(ttl=TTL_S, show_spinner=False)
def load_ledger(url: str, run_id: str) -> tuple[LedgerCheck, pd.DataFrame]:
    """The ledger's verification and its entries (empty if there is none)."""
    store = open_store(url)
    check = ledger_check(store, run_id)
    entries = store.list_ledger_entries(run_id)
    return check, ledger.ledger_frame(entries, check, store.list_clients(run_id))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def load_summary(url: str, run_id: str) -> RunSummary:
    """The end-of-run summary (the data ``fedplat coordinator`` prints)."""
    check, _ = load_ledger(url, run_id)
    return run_summary(open_store(url), run_id, ledger=check)


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


def _page_of(mode: str) -> str:
    return "views/gossip.py" if mode == "gossip" else "views/run.py"


def _resolve(wanted: str, runs: pd.DataFrame) -> str | None:
    """The id of the run ``wanted`` names (an id, else a name) in ``runs``."""
    if wanted in set(runs["run_id"]):
        return wanted
    named = runs[runs["name"] == wanted]
    return str(named["run_id"].iloc[0]) if not named.empty else None


def _not_here(wanted: str, everything: pd.DataFrame | None, label: str) -> None:
    """Say that ``?run=`` names no run of this page, and where it is if elsewhere."""
    found = _resolve(wanted, everything) if everything is not None else None
    if found is None:
        st.warning(
            f"No run with the id or name {code(wanted)} in this store. "
            f"Choose one under {plain(label)} in the sidebar."
        )
        return
    assert everything is not None
    row = everything.set_index("run_id").loc[found]
    st.warning(
        f"Run {code(row['name'])} is a {plain(row['mode'])} run: it is shown on "
        f"another page. Choose a run under {plain(label)} in the sidebar, or:"
    )
    st.page_link(
        _page_of(str(row["mode"])),
        label=f"Open {code(row['name'])}",
        query_params={"run": found},
    )


def pick_run(
    runs: pd.DataFrame, *, label: str = "Run", everything: pd.DataFrame | None = None
) -> str:
    """A run picker in the sidebar; the choice survives page switches and is
    mirrored in the ``?run=`` query parameter so a page can be linked to.

    ``?run=`` takes a run's id or its name (names are unique in a store). One
    that names no run of ``runs`` (``data.runs_frame`` rows, already narrowed to
    the page's kind of run, non-empty: callers show their empty state first)
    stops the page with a message, saying where the run is if ``everything``
    (all runs) has it: a link must never open another run than it names.
    """
    ids = list(runs["run_id"])
    by_id = runs.set_index("run_id")
    asked = st.query_params.get("run")
    index: int | None
    if asked:
        found = _resolve(asked, runs)
        index = ids.index(found) if found is not None else None
    else:
        remembered = st.session_state.get(RUN_KEY)
        index = ids.index(remembered) if remembered in ids else 0

    def _label(run_id: str) -> str:
        # Names only: the sidebar is drawn when the page loads, not on the live
        # panel's refreshes, so a state here would go stale and contradict the
        # run's header ("running" beside "interrupted").
        # Select box options are drawn as text, not Markdown.
        return clean(by_id.loc[run_id, "name"])

    choice = st.sidebar.selectbox(
        label, ids, index=index, format_func=_label, placeholder="Choose a run"
    )
    if choice is None:
        _not_here(str(asked), everything, label)
        st.stop()
    run_id = str(choice)
    st.session_state[RUN_KEY] = run_id
    if asked not in (run_id, by_id.loc[run_id, "name"]):
        st.query_params["run"] = run_id
    return run_id


def federated_runs(url: str) -> pd.DataFrame | None:
    """The store's coordinator runs (gossip runs have a page of their own), or
    ``None`` after showing why there are none (or why the store failed)."""
    try:
        runs = load_runs(url)
    except StoreError as exc:
        fail_softly(exc)
        return None
    if runs.empty:
        st.info(NO_RUNS)
        return None
    federated = runs[runs["mode"] != "gossip"]
    if federated.empty:
        st.info("This database holds only gossip runs; they are on the Gossip page.")
        st.page_link(
            "views/gossip.py", label="Open the Gossip page", icon=":material/share:"
        )
        return None
    return federated


# Left to size a chart itself, Streamlit fits it into less than the spec's height
# and a discrete y axis (heat map, one bar per client) collapses to a sliver; so
# charts get their spec's plot height plus room for the title and x axis.
CHART_MARGIN_PX = 90


def show(
    chart: alt.Chart | alt.LayerChart | alt.ConcatChart | alt.FacetChart,
) -> None:
    """Draw an Altair chart at the full width and its declared height."""
    height = getattr(chart, "height", None)
    if isinstance(height, int):
        st.altair_chart(chart, width="stretch", height=height + CHART_MARGIN_PX)
    else:  # compound charts (concat, facet) size their panels themselves
        st.altair_chart(chart)


def run_badge(view: status.RunView) -> str:
    """Markdown badge of a run's displayed state ("waiting for clients: 3/8")."""
    return status.badge(view.state, view.label)


def run_title(name: str, view: status.RunView) -> None:
    """A run page's title line: the run's name (as stored) and its state."""
    st.markdown(f"## {code(name)} {run_badge(view)}")


def fail_softly(exc: StoreError) -> None:
    """Show a store error (e.g. the database went away) instead of a traceback;
    its message can quote stored text, so it is escaped."""
    st.error(f"Could not read the store: {plain(exc)}")


__all__ = [
    "DB_ENV",
    "NO_RUNS",
    "REFRESH_ENV",
    "database_url",
    "display_url",
    "fail_softly",
    "federated_runs",
    "load_best",
    "load_client_records",
    "load_clients",
    "load_contributions",
    "load_events",
    "load_gossip_events",
    "load_ledger",
    "load_metrics",
    "load_participations",
    "load_rank_names",
    "load_rounds",
    "load_run",
    "load_run_view",
    "load_runs",
    "load_summary",
    "open_store",
    "pick_run",
    "run_badge",
    "run_title",
    "show",
    "sidebar_settings",
    "store_or_stop",
]

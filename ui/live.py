"""Live panels: a page's panel re-runs on its own every refresh period while what
it shows can change, and is drawn once (from reads made after the end) when the
run it shows has ended."""

from __future__ import annotations

from collections.abc import Callable

import streamlit as st
from fedplat.ui import common

from fedplat.store import StoreError


def refresh_every() -> float | None:
    """``run_every`` for live fragments: the refresh period, or ``None`` if off."""
    return common.REFRESH_S if st.session_state.get(common.LIVE_KEY, True) else None


def live(body: Callable[[], None], *, ended: Callable[[], bool] | None = None) -> None:
    """Run ``body`` as a fragment that re-runs on its own every refresh period,
    so a live panel updates without re-running (and resetting) the whole page.

    ``ended`` says whether what the panel shows can still change (a completed or
    failed run cannot): then it is drawn once, not re-run, since every re-run
    greys the panel out for a moment. A panel that sees it end while refreshing
    re-runs the page once, which stops its timer.
    """
    if ended is not None and ended():
        st.fragment(body)()
        return

    def watched() -> None:
        body()
        if ended is not None and ended():
            st.rerun()

    st.fragment(watched, run_every=refresh_every())()


#: The cached loaders of one run's data; ``live_run`` empties them when it sees
#: the run end, so the last drawing is not made of reads from before the end.
RUN_LOADERS = (
    common.load_run,
    common.load_rounds,
    common.load_participations,
    common.load_contributions,
    common.load_run_view,
    common.load_clients,
    common.load_client_records,
    common.load_metrics,
    common.load_events,
    common.load_gossip_events,
    common.load_ledger,
    common.load_summary,
)
ENDED_KEY = "fedplat_seen_ended"


def live_run(body: Callable[[], None], url: str, run_id: str) -> None:
    """``live`` for a panel of one run: refreshed while the run goes on, drawn
    once when it has ended.

    Each loader's cache expires on its own clock, so the read that says "ended"
    can be newer than the ones the panel draws from (a page stuck at the round
    before the last). The first time a session sees the run ended, the cached
    reads are dropped, so its last drawing is made after the end.
    """

    def ended() -> bool:
        if not run_ended(url, run_id):
            return False
        seen: set[tuple[str, str]] = st.session_state.setdefault(ENDED_KEY, set())
        if (url, run_id) not in seen:
            seen.add((url, run_id))
            for loader in RUN_LOADERS:
                loader.clear()
        return True

    live(body, ended=ended)


def run_ended(url: str, run_id: str) -> bool:
    """Whether the run is over (completed, failed or gone): nothing to refresh.
    An interrupted run is not: its coordinator may be restarted."""
    try:
        view = common.load_run_view(url, run_id)
    except StoreError:
        return False  # the panel says what is wrong, and retries
    return view is None or view.ended


__all__ = ["RUN_LOADERS", "live", "live_run", "refresh_every", "run_ended"]

"""A run's event log through the control API (``StreamLog``): pages of events,
oldest first, and the follow loop that keeps a stream open while the run goes on.

A stream starts after ``after_id``, at the first event (``from_start``), or at
the ``tail``-th newest event. It sends what the store holds in pages of
:data:`PAGE`; with ``follow`` it then polls every :data:`POLL_SECONDS` until the
run has ended (one last poll after the end, for the events recorded with it),
its coordinator is gone (an interrupted run: nobody writes its log), the
service stops, or :data:`FOLLOW_SECONDS` have passed (the caller reopens with
the last id it saw). Why it ended is the stream's trailing metadata
:data:`LOG_END`.

Ids are given when an event is inserted, not when it commits: on PostgreSQL two
writers' events can become visible out of id order. Each read therefore starts
:data:`LATE_IDS` ids before the last one sent (never before the stream's start)
and skips the ids already sent, so an event committed late (within that many
later ids) is still sent, once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

from fedplat.control.audit import printable
from fedplat.proto import control_pb2 as pb
from fedplat.store import EventRecord, Store
from fedplat.ui.status import run_view

#: Events per store read (besides the late-commit window).
PAGE = 500
#: Events a stream starts with when it names no ``after_id`` and no ``tail``.
DEFAULT_TAIL = 100
MAX_TAIL = 10_000
#: How long one stream stays open (below the control server's connection age,
#: 3,600 s less its 10% jitter, so the stream, not the connection, ends it), and
#: how often a follower polls.
FOLLOW_SECONDS = 3000.0
POLL_SECONDS = 1.0
#: How far back each read looks for events committed out of id order.
LATE_IDS = 256
#: Trailing metadata of a log stream: why it ended.
LOG_END = "fedplat-log-end"


@dataclass(frozen=True)
class LogStart:
    """Where a stream starts: the run, and the id after which it sends events."""

    run_id: str
    after_id: int


def start_after(store: Store, run_id: str, after_id: int, tail: int) -> int:
    """The id to send events after: ``after_id``, or the one before the
    ``tail``-th newest event (``tail`` 0: :data:`DEFAULT_TAIL`)."""
    if after_id:
        return after_id
    nth = store.nth_newest_event_id(run_id, tail or DEFAULT_TAIL)
    return 0 if nth is None else nth - 1


def _message(e: EventRecord) -> pb.LogEvent:
    return pb.LogEvent(
        id=e.id,
        at_unix=e.created_at.timestamp(),
        round=e.round_number or 0,
        client=printable(e.client_id or ""),
        kind=printable(e.kind),
        level=printable(e.level),
        message=printable(e.message, 2_000),
    )


def _state(store: Store, run_id: str) -> str:
    """``ended`` (completed, failed or gone), ``interrupted`` (its coordinator
    stopped or died) or ``live``."""
    run = store.get_run(run_id)
    if run is None:
        return "ended"
    view = run_view(run, datetime.now(UTC))
    if view.ended:
        return "ended"
    return "interrupted" if view.state == "interrupted" else "live"


class _Window:
    """The ids sent that a read may meet again (the late-commit window)."""

    def __init__(self, after: int) -> None:
        self.start = after  # nothing at or below it is sent
        self.after = after  # the highest id sent (or the start)
        self.sent: set[int] = set()

    @property
    def low(self) -> int:
        return max(self.start, self.after - LATE_IDS)

    def fresh(self, page: list[EventRecord]) -> list[EventRecord]:
        out = [e for e in page if e.id not in self.sent and e.id > self.low]
        for e in out:
            self.sent.add(e.id)
            self.after = max(self.after, e.id)
        self.sent = {i for i in self.sent if i > self.low}
        return out


async def stream(
    store: Store,
    start: LogStart,
    follow: bool,
    *,
    poll: float = POLL_SECONDS,
    limit: float = FOLLOW_SECONDS,
    closing: asyncio.Event | None = None,
    end: list[str] | None = None,
) -> AsyncIterator[pb.LogEvent]:
    """The events of ``start.run_id`` after ``start.after_id`` (see the module
    docstring); store reads run in a worker thread. Why the stream ended is
    appended to ``end``: ``caught-up`` (not following), ``run-ended``,
    ``interrupted``, ``time-limit`` (reopen to go on) or ``closing``."""
    window, until = _Window(start.after_id), time.monotonic() + limit
    last_look = False
    while True:
        # The run's state is read before the page, so the page holds every
        # event recorded before the end.
        state = await asyncio.to_thread(_state, store, start.run_id) if follow else ""
        page = await asyncio.to_thread(
            store.events_after, start.run_id, window.low, PAGE + LATE_IDS
        )
        for e in window.fresh(page):
            yield _message(e)
        full = len(page) == PAGE + LATE_IDS  # more to send now
        if full:  # ...within the stream's life
            why = _why_cut(until, closing)
        else:
            why = _why_stop(follow, last_look, state, until, closing)
        if why is not None:
            if end is not None:
                end.append(why)
            return
        if full:
            continue
        last_look = state != "live" or (closing is not None and closing.is_set())
        if closing is None:
            await asyncio.sleep(poll)
        else:
            # A stop of the service wakes the follower at once.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(closing.wait(), poll)


def _why_stop(
    follow: bool,
    last_look: bool,
    state: str,
    until: float,
    closing: asyncio.Event | None,
) -> str | None:
    """Why a stream that has sent all it read ends now (``None``: it waits).

    A run seen ended (or its coordinator gone) gets one more read before the
    stream ends, for what was recorded with the end; when the service is
    stopping there is no more read to wait for.
    """
    if not follow:
        return "caught-up"
    closing_now = closing is not None and closing.is_set()
    if last_look or closing_now:
        if state == "ended":
            return "run-ended"
        if state == "interrupted" and last_look:
            return "interrupted"
        if closing_now:
            return "closing"
    return _why_cut(until, None)


def _why_cut(until: float, closing: asyncio.Event | None) -> str | None:
    """Why a stream ends before it has sent everything: the service stops, or
    its time is up (the caller reopens where it stopped)."""
    if closing is not None and closing.is_set():
        return "closing"
    if time.monotonic() >= until:
        return "time-limit"
    return None


__all__ = [
    "DEFAULT_TAIL",
    "LOG_END",
    "MAX_TAIL",
    "LogStart",
    "start_after",
    "stream",
]

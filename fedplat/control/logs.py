"""A run's event log through the control API (``StreamLog``): pages of events,
oldest first, and the follow loop that keeps a stream open while the run goes on.

A stream starts after ``after_id``, or at the ``tail``-th newest event. It sends
what the store holds in pages of :data:`PAGE`; with ``follow`` it then polls every
:data:`POLL_SECONDS` until the run has ended (one last poll after the end, for
the events recorded with it) or :data:`FOLLOW_SECONDS` have passed (the caller
reopens with the last id it saw). Followers hold slots of their own, so viewers
following logs cannot take the slots other calls need.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fedplat.control.audit import printable
from fedplat.proto import control_pb2 as pb
from fedplat.store import EventRecord, Store

#: Events per store read.
PAGE = 500
#: Events a stream starts with when it names no ``after_id`` and no ``tail``.
DEFAULT_TAIL = 100
MAX_TAIL = 100_000
#: How long one following stream stays open, and how often it polls.
FOLLOW_SECONDS = 3600.0
POLL_SECONDS = 1.0
ENDED = ("completed", "failed")
#: Trailing metadata of a log stream: why it ended (see :func:`stream`).
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


def _ended(store: Store, run_id: str) -> bool:
    run = store.get_run(run_id)
    return run is None or run.status in ENDED


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
    docstring); store reads run in a worker thread. ``closing`` set (the
    service is stopping) ends a follower after one last read. Why the stream
    ended is appended to ``end``: ``caught-up`` (not following), ``run-ended``,
    ``time-limit`` (reopen to go on) or ``closing``."""
    after, until = start.after_id, time.monotonic() + limit
    last_look = False
    while True:
        # Whether the run had ended is read before the page, so the page holds
        # every event recorded before the end.
        ended = follow and await asyncio.to_thread(_ended, store, start.run_id)
        page = await asyncio.to_thread(store.events_after, start.run_id, after, PAGE)
        for e in page:
            yield _message(e)
            after = e.id
        if len(page) == PAGE:
            continue
        why = _why_stop(follow, last_look, ended, until, closing)
        if why is not None:
            if end is not None:
                end.append(why)
            return
        last_look = ended or (closing is not None and closing.is_set())
        if closing is None:
            await asyncio.sleep(poll)
        else:
            # A stop of the service wakes the follower at once.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(closing.wait(), poll)


def _why_stop(
    follow: bool,
    last_look: bool,
    ended: bool,
    until: float,
    closing: asyncio.Event | None,
) -> str | None:
    """Why a stream that has sent everything ends now (``None``: it waits)."""
    if not follow:
        return "caught-up"
    if last_look:
        return "run-ended" if ended else "closing"
    if time.monotonic() >= until:
        return "time-limit"
    return None


__all__ = ["DEFAULT_TAIL", "LOG_END", "MAX_TAIL", "LogStart", "start_after", "stream"]

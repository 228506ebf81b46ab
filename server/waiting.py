"""The one waiting primitive of the coordinator, for threads and coroutines alike.

A long poll (a client waiting for its task, a secure-aggregation phase) and the
round driver all wait the same way: they take a :class:`Wakeup` from whoever
will wake them (:class:`Signal` wakes every taker, :class:`TaskWaiters` the
clients a new round selected), check the condition they wait for, then wait on
the wakeup. Taking it *before* checking means an event between the check and the
wait is never missed.

A wakeup can be waited on from a thread (the in-memory transport, the driver,
tests) or awaited from a coroutine (the gRPC server, where a waiting client
costs no thread). A poll loop is written once, as a generator that yields
``(wakeup, seconds)`` whenever it wants to wait and returns its answer
(:func:`run_sync`, :func:`run_async` drive it).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Generator, Iterable
from typing import TypeVar

T = TypeVar("T")

#: A poll loop: yields what to wait on and for how long, returns its answer.
Poll = Generator[tuple["Wakeup", float], None, T]


class Wakeup:
    """Set once; then every wait on it returns at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._futures: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def set(self) -> None:
        with self._lock:
            self._event.set()
            futures, self._futures = self._futures, []
        for loop, fut in futures:
            loop.call_soon_threadsafe(_resolve, fut)

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        """Block a thread until set (or ``timeout`` seconds); whether it was set."""
        return self._event.wait(max(0.0, timeout))

    async def wait_async(self, timeout: float) -> bool:
        """:meth:`wait` for a coroutine (no thread is held)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._event.is_set():
                return True
            self._futures.append((loop, fut))
        try:
            await asyncio.wait_for(fut, max(0.0, timeout))
        except TimeoutError:
            pass
        finally:
            with self._lock:
                if (loop, fut) in self._futures:
                    self._futures.remove((loop, fut))
        return self._event.is_set()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Signal:
    """Wakes every wakeup taken since the last :meth:`notify` (the driver's
    wake-up on answers and enrolments; secure-aggregation phases)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current = Wakeup()

    def wakeup(self) -> Wakeup:
        """The wakeup the next :meth:`notify` sets."""
        with self._lock:
            return self._current

    def notify(self) -> None:
        with self._lock:
            woken, self._current = self._current, Wakeup()
        woken.set()

    def wait(self, timeout: float) -> bool:
        """Wait for the next :meth:`notify` (a thread), at most ``timeout``."""
        return self.wakeup().wait(timeout)


class TaskWaiters:
    """Clients waiting for a task, woken one by one.

    A fleet of waiting clients must not all wake for every event: a new round
    wakes the clients it selected, the run's end wakes everyone, and nothing
    else wakes a waiting client at all (uploads and enrolments wake only the
    driver, through the board's :class:`Signal`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_client: dict[str, set[Wakeup]] = {}

    def notify(self, client_ids: Iterable[str] | None = None) -> None:
        """Wake the given clients' waiters (every waiter when None)."""
        with self._lock:
            if client_ids is None:
                woken = [w for ws in self._by_client.values() for w in ws]
                self._by_client.clear()
            else:
                woken = [w for cid in client_ids for w in self._by_client.pop(cid, ())]
        for w in woken:
            w.set()

    def register(self, client_id: str) -> Wakeup:
        """A wakeup set when ``client_id`` is notified. Register *before*
        checking for a task, so a task published in between is not missed."""
        w = Wakeup()
        with self._lock:
            self._by_client.setdefault(client_id, set()).add(w)
        return w

    def discard(self, client_id: str, w: Wakeup) -> None:
        with self._lock:
            ws = self._by_client.get(client_id)
            if ws is not None:
                ws.discard(w)
                if not ws:
                    del self._by_client[client_id]

    def waiting(self) -> int:
        """Registered waiters (for tests and the monitor's view of a fleet)."""
        with self._lock:
            return sum(len(ws) for ws in self._by_client.values())


def run_sync(poll: Poll[T]) -> T:
    """Drive a poll loop from a thread."""
    try:
        w, seconds = next(poll)
        while True:
            w.wait(seconds)
            w, seconds = poll.send(None)
    except StopIteration as done:
        return done.value


async def run_async(poll: Poll[T]) -> T:
    """Drive a poll loop from a coroutine."""
    try:
        w, seconds = next(poll)
        while True:
            await w.wait_async(seconds)
            w, seconds = poll.send(None)
    except StopIteration as done:
        return done.value


__all__ = ["Poll", "Signal", "TaskWaiters", "Wakeup", "run_async", "run_sync"]

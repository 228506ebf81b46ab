"""The task board: the open round's assignments, and waiting for them.

The round driver publishes a :class:`RoundState` (who was selected, each task id
and nonce, each client's row) and closes it; clients look up their task, or wait
for one. Waiting is a :class:`Signal` that wakes both kinds of waiter: threads
(the in-memory transport, tests) and asyncio tasks (the gRPC server, where a
waiting client costs no thread).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fedplat.server.accumulator import Accumulator

#: Closed task ids remembered for clear "round N is closed" answers (bounded).
MAX_CLOSED_TASKS = 100_000


class Signal:
    """A generation counter that wakes threads and coroutines when it moves."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.gen = 0
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = (
            set()
        )

    def notify(self) -> None:
        with self._cond:
            self.gen += 1
            self._cond.notify_all()
            waiters, self._waiters = self._waiters, set()
        for loop, fut in waiters:
            loop.call_soon_threadsafe(_resolve, fut)

    def wait(self, gen: int, timeout: float) -> int:
        """Block until the generation differs from ``gen`` (or timeout)."""
        end = time.monotonic() + timeout
        with self._cond:
            while self.gen == gen:
                left = end - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return self.gen

    async def wait_async(self, gen: int, timeout: float) -> int:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._cond:
            if self.gen != gen:
                return self.gen
            entry = (loop, fut)
            self._waiters.add(entry)
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            pass
        finally:
            with self._cond:
                self._waiters.discard(entry)
        return self.gen


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class TaskWaiters:
    """Clients waiting for a task, woken one by one.

    A fleet of waiting clients must not all wake for every event: a new round
    wakes the clients it selected, the run's end wakes everyone, and nothing
    else wakes a waiting client at all (uploads and enrolments wake only the
    driver, through :attr:`TaskBoard.signal`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_client: dict[
            str, set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]
        ] = {}

    def notify(self, client_ids: Iterable[str] | None = None) -> None:
        """Wake the given clients' waiters (every waiter when None)."""
        with self._lock:
            if client_ids is None:
                woken = [w for ws in self._by_client.values() for w in ws]
                self._by_client.clear()
            else:
                woken = [w for cid in client_ids for w in self._by_client.pop(cid, ())]
        for loop, fut in woken:
            loop.call_soon_threadsafe(_resolve, fut)

    def register(self, client_id: str) -> asyncio.Future[None]:
        """A future set when ``client_id`` is notified. Register *before*
        checking for a task, so a task published in between is not missed."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._lock:
            self._by_client.setdefault(client_id, set()).add((loop, fut))
        return fut

    async def wait(
        self, client_id: str, fut: asyncio.Future[None], timeout: float
    ) -> None:
        """Wait for a registered future (or the timeout); always unregisters."""
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            pass
        finally:
            self.discard(client_id, fut)

    def discard(self, client_id: str, fut: asyncio.Future[None]) -> None:
        with self._lock:
            ws = self._by_client.get(client_id)
            if ws is not None:
                ws.discard((fut.get_loop(), fut))
                if not ws:
                    del self._by_client[client_id]


@dataclass(frozen=True)
class Assignment:
    """One selected client's task in a round."""

    client_id: str
    name: str
    task_id: str
    nonce: bytes
    row: int  # place among the round's selected clients (enrolment order)
    seed: int  # the client's training seed this round


@dataclass
class Outcome:
    """What one selected client did in the round so far (written at close)."""

    status: str = "selected"
    bytes_up: int = 0
    bytes_down: int = 0
    num_examples: int = 0
    weight: float = 0.0
    duration_s: float | None = None
    train_loss: float | None = None
    reason: str | None = None
    downloaded_at: float | None = None
    clipped: bool = False
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class RoundState:
    number: int
    attempt: int
    opened_at: float
    deadline: float
    model_version: int
    assignments: dict[str, Assignment]
    accumulator: Accumulator
    num_live: int
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    answered: set[str] = field(default_factory=set)
    by_task: dict[str, Assignment] = field(default_factory=dict)
    # Secure aggregation's state (fedplat.server.secagg_round.SecAggRound).
    secagg: Any = None

    def __post_init__(self) -> None:
        self.by_task = {a.task_id: a for a in self.assignments.values()}
        self.outcomes = {cid: Outcome() for cid in self.assignments}


class TaskBoard:
    """The open round (if any), closed task ids, and the run's end."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        # The driver's wake-up (answers, enrolments); clients wait on ``waiters``.
        self.signal = Signal()
        self.waiters = TaskWaiters()
        self.round: RoundState | None = None
        self.finished = False
        # task id -> (round, client id) of closed tasks
        self._closed: OrderedDict[str, tuple[int, str]] = OrderedDict()

    def publish(self, state: RoundState) -> None:
        with self.lock:
            if self.round is not None:
                raise RuntimeError(f"round {self.round.number} is still open")
            self.round = state
        self.signal.notify()
        self.waiters.notify(state.assignments)

    def close(self) -> RoundState:
        """Take the open round off the board; its tasks are over."""
        with self.lock:
            state = self.round
            if state is None:
                raise RuntimeError("no open round")
            self.round = None
            for task_id, a in state.by_task.items():
                self._closed[task_id] = (state.number, a.client_id)
            while len(self._closed) > MAX_CLOSED_TASKS:
                self._closed.popitem(last=False)
        self.signal.notify()
        return state

    def finish(self) -> None:
        with self.lock:
            self.finished = True
        self.signal.notify()
        self.waiters.notify()

    def closed_round_of(self, task_id: str) -> int | None:
        with self.lock:
            hit = self._closed.get(task_id)
            return None if hit is None else hit[0]

    def task_round(self, client_id: str, task_id: str) -> int | None:
        """The round of ``task_id`` if it is (or was) ``client_id``'s task."""
        with self.lock:
            r = self.round
            if r is not None:
                a = r.by_task.get(task_id)
                if a is not None:
                    return r.number if a.client_id == client_id else None
            hit = self._closed.get(task_id)
            return hit[0] if hit is not None and hit[1] == client_id else None

    def assignment(self, client_id: str) -> tuple[RoundState, Assignment] | None:
        """The caller's open, unanswered task, if any."""
        with self.lock:
            r = self.round
            if r is None or client_id in r.answered:
                return None
            a = r.assignments.get(client_id)
            return None if a is None else (r, a)


__all__ = ["Assignment", "Outcome", "RoundState", "Signal", "TaskBoard"]

"""The task board: the open round (if any), closed task ids, and the run's end.

The round driver publishes a :class:`~fedplat.server.round.Round` and takes it
off the board when it closes; clients look up their task, or wait for one
(:mod:`fedplat.server.waiting`: the board's :class:`Signal` wakes the driver,
its :class:`TaskWaiters` the clients a new round selected).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from fedplat.server.round import Assignment, Round
from fedplat.server.waiting import Signal, TaskWaiters

#: Closed task ids remembered for clear "round N is closed" answers (bounded).
MAX_CLOSED_TASKS = 100_000


class TaskBoard:
    """The open round (if any), closed task ids, and the run's end."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        # The driver's wake-up (answers, enrolments); clients wait on ``waiters``.
        self.signal = Signal()
        self.waiters = TaskWaiters()
        self.round: Round | None = None
        self.finished = False
        # task id -> (round, client id) of closed tasks
        self._closed: OrderedDict[str, tuple[int, str]] = OrderedDict()

    def publish(self, state: Round) -> None:
        with self.lock:
            if self.round is not None:
                raise RuntimeError(f"round {self.round.number} is still open")
            self.round = state
        self.signal.notify()
        self.waiters.notify(state.assignments)

    def close(self) -> Round:
        """Take the open round off the board and seal it: its tasks are over,
        and no answer or row write changes it any more."""
        with self.lock:
            state = self.round
            if state is None:
                raise RuntimeError("no open round")
            self.round = None
            for task_id, a in state.by_task.items():
                self._closed[task_id] = (state.number, a.client_id)
            while len(self._closed) > MAX_CLOSED_TASKS:
                self._closed.popitem(last=False)
        state.seal()
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

    def assignment(self, client_id: str) -> tuple[Round, Assignment] | None:
        """The caller's open, unanswered task, if any."""
        with self.lock:
            r = self.round
            a = None if r is None else r.open_task(client_id)
            return None if r is None or a is None else (r, a)


__all__ = ["TaskBoard"]

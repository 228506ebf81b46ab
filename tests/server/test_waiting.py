"""The one waiting primitive (:mod:`fedplat.server.waiting`): wakeups waited on
from threads and coroutines alike, and a poll loop written once and driven both
ways."""

from __future__ import annotations

import asyncio
import threading
import time

from fedplat.server.waiting import (
    Poll,
    Signal,
    TaskWaiters,
    Wakeup,
    run_async,
    run_sync,
)


def test_a_wakeup_wakes_a_thread_and_a_coroutine() -> None:
    w = Wakeup()
    assert not w.wait(0.01)
    woken: list[bool] = []
    t = threading.Thread(target=lambda: woken.append(w.wait(10)))
    t.start()

    async def main() -> bool:
        waiting = asyncio.ensure_future(w.wait_async(10))
        await asyncio.sleep(0.05)
        threading.Timer(0.05, w.set).start()  # set from another thread
        return await waiting

    assert asyncio.run(main()) is True
    t.join(5)
    assert woken == [True]
    assert w.wait(0) and asyncio.run(w.wait_async(0))  # set stays set


def test_a_wakeup_times_out() -> None:
    t0 = time.monotonic()
    assert asyncio.run(Wakeup().wait_async(0.05)) is False
    assert Wakeup().wait(0.05) is False
    assert time.monotonic() - t0 < 5


def test_a_signal_wakes_what_was_taken_before_it() -> None:
    s = Signal()
    before = s.wakeup()
    s.notify()
    after = s.wakeup()
    assert before.is_set() and not after.is_set()
    s.notify()
    assert after.is_set()


def test_task_waiters_wake_only_the_clients_named() -> None:
    tw = TaskWaiters()
    a, b = tw.register("a"), tw.register("b")
    assert tw.waiting() == 2
    tw.notify(["a"])
    assert a.is_set() and not b.is_set()
    tw.discard("b", b)
    assert tw.waiting() == 0
    c = tw.register("c")
    tw.notify()  # the run's end: everyone
    assert c.is_set()


def _countdown(sig: Signal, until: list[int]) -> Poll[str]:
    """Waits (a wakeup per wait) until ``until`` holds a value."""
    waits = 0
    while True:
        w = sig.wakeup()
        if until:
            return f"got {until[0]} after {waits} waits"
        waits += 1
        yield w, 5.0


def test_one_poll_loop_driven_from_a_thread_and_a_coroutine() -> None:
    for drive in ("sync", "async"):
        sig, box = Signal(), []

        def later(sig: Signal = sig, box: list[int] = box) -> None:
            box.append(7)
            sig.notify()

        threading.Timer(0.05, later).start()
        poll = _countdown(sig, box)
        out = run_sync(poll) if drive == "sync" else asyncio.run(run_async(poll))
        assert out == "got 7 after 1 waits", drive

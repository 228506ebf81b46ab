"""KeyedBuckets: one token bucket per key, at most max_keys remembered."""

from __future__ import annotations

from fedplat.transport.limits import KeyedBuckets


def test_each_key_has_its_own_burst_and_the_oldest_is_forgotten() -> None:
    now = [0.0]
    b = KeyedBuckets(rate=1.0, burst=2, clock=lambda: now[0], max_keys=2)
    assert [b.take("a"), b.take("a"), b.take("a")] == [True, True, False]
    assert b.take("b") and b.take("b") and not b.take("b")
    now[0] = 1.0  # one token back for each
    assert b.take("a") and not b.take("a")
    # A third key forgets the oldest ("a"), which then starts full again.
    assert b.take("c")
    assert b.take("a") and b.take("a")
    unbounded = KeyedBuckets(rate=1.0, burst=1, clock=lambda: now[0])
    assert all(unbounded.take(str(i)) for i in range(1000))
    assert not unbounded.take("0")

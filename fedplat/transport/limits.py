"""What any one caller may cost a service: calls in flight, and log lines.

:class:`StreamSlots` bounds the calls in flight per caller and in total, so a
few callers holding streams open cannot take every slot (the handlers also time
out idle streams). :class:`RefusalLog` counts refused calls by kind and logs at
most one line per kind per interval, so a flood of bad calls cannot flood the
log. :class:`TokenBucket` bounds a rate (enrolments, refusal records, audit
entries of one caller). :func:`read_one` reads a unary call served as a
stream within a deadline, so a caller that never sends its request cannot hold
a slot.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from fedplat.proto.streams import Malformed
from fedplat.protocol.errors import InvalidArgument, ResourceExhausted

__all__ = ["KeyedBuckets", "RefusalLog", "StreamSlots", "TokenBucket", "read_one"]


class TokenBucket:
    """At most ``burst`` events at once, ``rate`` per second sustained."""

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate = rate
        self.burst = float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def take(self, n: float = 1.0) -> bool:
        """Spend ``n`` tokens if available (refilled by elapsed time)."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= n:
            self._tokens -= n
            return True
        return False


class KeyedBuckets:
    """One :class:`TokenBucket` per key (a caller, a kind), made on first use;
    at most ``max_keys`` remembered (the oldest forgotten first; ``None``: no
    bound, for keys that are bounded elsewhere). Not thread-safe: callers that
    share it hold their own lock."""

    def __init__(
        self,
        rate: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int | None = None,
    ) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self.max_keys = max_keys
        self._buckets: dict[str, TokenBucket] = {}

    def take(self, key: str) -> bool:
        """Spend one token of ``key``'s bucket (see :meth:`TokenBucket.take`)."""
        bucket = self._buckets.get(key)
        if bucket is None:
            if self.max_keys is not None and len(self._buckets) >= self.max_keys:
                self._buckets.pop(next(iter(self._buckets)))
            bucket = TokenBucket(self.rate, self.burst, self._clock)
            self._buckets[key] = bucket
        return bucket.take()


class StreamSlots:
    """Counting limits on calls in flight.

    Parameters
    ----------
    per_caller : int
        Calls one caller (a certificate's node id, or a remote host without
        TLS) may have in flight.
    total : int
        Calls in flight from everyone.
    """

    def __init__(self, per_caller: int, total: int) -> None:
        if per_caller < 1 or total < per_caller:
            raise ValueError("need 1 <= per_caller <= total")
        self.per_caller = per_caller
        self.total = total
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}
        self._count = 0

    @contextmanager
    def hold(self, caller: str) -> Iterator[None]:
        """One slot for ``caller`` while the block runs (or ``RESOURCE_EXHAUSTED``)."""
        with self._lock:
            mine = self._held.get(caller, 0)
            if mine >= self.per_caller:
                raise ResourceExhausted(
                    f"{caller} already has {mine} calls in flight "
                    f"(limit {self.per_caller} per caller)"
                )
            if self._count >= self.total:
                raise ResourceExhausted(
                    f"{self._count} calls in flight (limit {self.total}); retry later"
                )
            self._held[caller] = mine + 1
            self._count += 1
        try:
            yield
        finally:
            with self._lock:
                self._count -= 1
                left = self._held[caller] - 1
                if left:
                    self._held[caller] = left
                else:
                    del self._held[caller]

    def in_flight(self) -> int:
        with self._lock:
            return self._count


class RefusalLog:
    """Counts refusals by kind; one log line per kind per ``interval_s``.

    Parameters
    ----------
    log : logging.Logger
    interval_s : float
    clock : callable
        Monotonic clock (injectable for tests).
    """

    def __init__(
        self,
        log: logging.Logger,
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = log
        self.interval_s = interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._last_line: dict[str, float] = {}
        self._quiet: dict[str, int] = {}

    def refuse(self, kind: str, reason: str, caller: str) -> None:
        """Count one refusal of ``kind`` (``"push:permission_denied"``)."""
        now = self.clock()
        with self._lock:
            self._counts[kind] = self._counts.get(kind, 0) + 1
            last = self._last_line.get(kind)
            if last is not None and now - last < self.interval_s:
                self._quiet[kind] = self._quiet.get(kind, 0) + 1
                return
            self._last_line[kind] = now
            quiet = self._quiet.pop(kind, 0)
        more = f" (+{quiet} more of this kind in the last interval)" if quiet else ""
        self.log.warning("refused %s from %s: %s%s", kind, caller, reason, more)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


async def read_one(it: AsyncIterator[Any], seconds: float, rpc: str) -> Any:
    """The one request of a unary call served as a stream, within ``seconds``."""
    try:
        msg = await asyncio.wait_for(anext(it), seconds)
    except StopAsyncIteration:
        raise InvalidArgument(f"{rpc} needs a request message") from None
    except TimeoutError:
        raise ResourceExhausted(
            f"{rpc} request did not arrive within {seconds:g} s"
        ) from None
    if isinstance(msg, Malformed):
        raise InvalidArgument(msg.reason)
    return msg

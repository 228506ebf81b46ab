"""A token bucket: at most ``burst`` events at once, ``rate`` per second sustained."""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
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

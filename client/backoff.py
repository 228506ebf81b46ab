"""Exponential backoff with full jitter (AWS architecture blog, "Exponential Backoff
And Jitter", 2015): ``delay = uniform(0, min(cap, base * 2**attempt))``. Full jitter
spreads reconnect storms after a coordinator restart better than equal jitter."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    base: float = 0.5
    cap: float = 30.0
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        if self.base <= 0 or self.cap < self.base:
            raise ValueError("backoff needs 0 < base <= cap")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based)."""
        return self.rng.uniform(0.0, min(self.cap, self.base * (2 ** min(attempt, 30))))

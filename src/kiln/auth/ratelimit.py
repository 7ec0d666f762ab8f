"""A token bucket per caller (access key or job token), in memory of this server process."""

from __future__ import annotations

import math
import threading
import time


class RateLimiter:
    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self._buckets: dict[str, tuple[float, float]] = {}  # caller → (tokens, last refill)
        self._lock = threading.Lock()

    def acquire(self, caller: str) -> float:
        """0 when the request may go ahead, else the seconds to wait before the next one would."""
        if self.rate <= 0:
            return 0.0
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(caller, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - last) * self.rate)
            if tokens >= 1.0:
                self._buckets[caller] = (tokens - 1.0, now)
                return 0.0
            self._buckets[caller] = (tokens, now)
            if len(self._buckets) > 100_000:
                self._buckets.clear()
            return (1.0 - tokens) / self.rate

    @staticmethod
    def retry_after(wait: float) -> str:
        return str(max(1, math.ceil(wait)))

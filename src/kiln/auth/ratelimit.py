"""A token bucket per caller (access key or job token), in memory of this server process.

Several servers on one database share each caller's limit: each enforces ``1 / servers`` of the rate and of the
burst (``share``), where ``servers`` is the number of live servers the database records (kiln.tasks.presence,
refreshed in the background). A caller whose requests a load balancer spreads evenly gets about the configured
rate in total, with no database round trip per request. The price: a caller whose requests all reach one server
gets only its share there, and while the count is catching up (a server started or died within the last few
heartbeats) the total is off by at most one server's share (docs/deployment.md).
"""

from __future__ import annotations

import math
import threading
import time


class RateLimiter:
    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate  # the configured totals, for every server together
        self.burst = max(1, burst)
        self.servers = 1
        self._rate = rate  # this server's share of them
        self._burst = float(self.burst)
        self._buckets: dict[str, tuple[float, float]] = {}  # caller → (tokens, last refill)
        self._lock = threading.Lock()

    def share(self, servers: int) -> None:
        """Enforce ``1 / servers`` of the rate and the burst from now on (at least one request of burst). A
        bucket holding more than the new burst is cut down to it at its next request."""
        if servers < 1:
            raise ValueError(f"servers: at least 1, not {servers}")
        with self._lock:
            self.servers = servers
            self._rate = self.rate / servers
            self._burst = max(1.0, self.burst / servers)

    def acquire(self, caller: str) -> float:
        """0 when the request may go ahead, else the seconds to wait before the next one would."""
        if self.rate <= 0:
            return 0.0
        now = time.monotonic()
        with self._lock:
            rate, burst = self._rate, self._burst
            tokens, last = self._buckets.get(caller, (burst, now))
            tokens = min(burst, tokens + (now - last) * rate)
            if tokens >= 1.0:
                self._buckets[caller] = (tokens - 1.0, now)
                return 0.0
            self._buckets[caller] = (tokens, now)
            if len(self._buckets) > 100_000:
                self._buckets.clear()
            return (1.0 - tokens) / rate

    @staticmethod
    def retry_after(wait: float) -> str:
        return str(max(1, math.ceil(wait)))

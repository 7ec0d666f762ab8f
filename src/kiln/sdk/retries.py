"""When the SDK sends a request again by itself, and how long it waits between tries (docs/idempotency.md).

Only a request that is safe to repeat is retried: a read (GET, HEAD), or a create sent with an ``Idempotency-Key``,
whose repeat the server answers with what the first one created. It is retried after the connection failed or was
lost (refused, reset, a read that timed out: the server may or may not have acted) or after a 502, 503 or 504 (a
proxy or the server could not answer now), with exponential backoff and jitter, until ``total`` seconds have passed
since the first try; then the last failure is what the caller gets. Every try is signed anew (a fresh date and
nonce: the server refuses a nonce twice) and a create keeps its key.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import httpx

RETRY_STATUSES = frozenset({502, 503, 504})
SAFE_METHODS = frozenset({"GET", "HEAD"})
# A connection refused, reset or closed before the answer, a timeout: the server may be restarting. Not a request
# this client cannot build or send (a bad URL, a protocol error of its own), which fails the same way every time.
RETRY_ERRORS: tuple[type[httpx.TransportError], ...] = (
    httpx.TimeoutException,
    httpx.NetworkError,
    httpx.RemoteProtocolError,
)
# The connection was never made: nothing may listen at the address at all (kiln.sdk.reached).
CONNECT_ERRORS: tuple[type[httpx.TransportError], ...] = (httpx.ConnectError, httpx.ConnectTimeout)


@dataclass(frozen=True)
class RetryPolicy:
    """Retry for up to ``total`` seconds (0: never), waiting ``first`` seconds after the first failure, twice as
    long after each next one up to ``longest``, each wait jittered down to half (so that clients that failed
    together do not come back together)."""

    total: float = 60.0
    first: float = 0.2
    longest: float = 5.0

    def start(self) -> RetryClock:
        return RetryClock(self, time.monotonic() + self.total)


@dataclass
class RetryClock:
    """The retries of one call: ``wait`` sleeps before the next try, or says there is none left."""

    policy: RetryPolicy
    deadline: float
    tries: int = 0

    def shorten(self, seconds: float, since: float) -> None:
        """End the retries ``seconds`` after ``since`` (a monotonic time), if that is sooner."""
        self.deadline = min(self.deadline, since + seconds)

    def wait(self, retry_after: float | None = None) -> bool:
        """Sleep until the next try and return True, or return False at once when the call's time is up.
        ``retry_after``: what the server asked for (a 503's Retry-After), when it is longer than the backoff."""
        left = self.deadline - time.monotonic()
        if self.policy.total <= 0 or left <= 0:
            return False
        backoff = min(self.policy.longest, self.policy.first * 2**self.tries) * random.uniform(0.5, 1.0)
        self.tries += 1
        time.sleep(min(left, max(backoff, retry_after or 0.0)))
        return True


def retry_after(response: httpx.Response) -> float | None:
    """A response's Retry-After in seconds (the delay form; an HTTP date is not used by Kiln), or None."""
    value = response.headers.get("retry-after", "")
    try:
        return max(0.0, float(value))
    except ValueError:
        return None

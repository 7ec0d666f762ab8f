"""A canary's rollout policy and its pure decision: advance the canary's share, promote it, roll it back, or wait.

The figures it judges are per model version, as the router counts them: requests, errors and a latency histogram
with fixed buckets (``VersionStats``: bounded whatever the traffic, never a list of samples), taken over a window
(the current step's, as the difference of two snapshots: ``minus``).

The serving task (kiln.tasks.serving) asks ``decide`` at each pass with the canary's and the stable version's
figures since the canary's share last changed:

- fewer than ``min_requests`` canary predicts in the window: wait (no verdict on too few);
- a bound broken — the canary's error rate above ``max_error_rate``, or its p99 above ``max_p99_ms`` — and the canary
  worse than the stable version over the same window (a stable version as bad says the cause is not the canary:
  an overloaded machine, a burst of bad inputs): roll back;
- otherwise, once ``step_wait`` seconds passed at this share: the next step above the share, promote at 100.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Latency buckets' upper bounds in seconds: 0.1 ms times 1.25^i, to about 2 minutes (64 buckets, +inf after).
BUCKET_BOUNDS: tuple[float, ...] = tuple(0.0001 * 1.25**i for i in range(64))
RATE_WINDOW = 60  # seconds of per-second counts a version keeps for its request rate


class RolloutPolicy(BaseModel):
    """How a canary advances on its own (``steps``, ``step_wait``) and when it is rolled back (the bounds)."""

    model_config = ConfigDict(extra="forbid")

    max_error_rate: float | None = Field(
        None, ge=0.0, le=1.0, description="Roll back when the canary's error rate (0 to 1) is above this."
    )
    max_p99_ms: float | None = Field(
        None, gt=0.0, le=3_600_000.0, description="Roll back when the canary's p99 latency (ms) is above this."
    )
    min_requests: int = Field(100, ge=1, le=10_000_000, strict=True, description="No verdict on fewer predicts.")
    steps: list[Annotated[int, Field(ge=1, le=100, strict=True)]] = Field(
        default_factory=list,
        max_length=20,
        description="Shares (percent, rising) the canary advances through; 100 promotes it. Empty: the share "
        "stays where it was set, and only the bounds act (a rollback).",
    )
    step_wait: float = Field(60.0, ge=0.0, le=7 * 86400.0, description="Seconds at a share before the next step.")

    @field_validator("steps")
    @classmethod
    def _steps(cls, value: list[int]) -> list[int]:
        if any(not isinstance(x, int) or isinstance(x, bool) or not 1 <= x <= 100 for x in value):
            raise ValueError("steps are percentages from 1 to 100")
        if any(b <= a for a, b in itertools.pairwise(value)):
            raise ValueError("steps rise: each above the one before")
        return value


@dataclass
class VersionStats:
    """What a model version answered: counts, total seconds, a fixed-bucket latency histogram, and per-second
    request counts over the last ``RATE_WINDOW`` seconds (for its rate)."""

    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(BUCKET_BOUNDS) + 1))
    recent: list[int] = field(default_factory=lambda: [0] * RATE_WINDOW)
    recent_at: int = 0  # the whole second (monotonic) recent's last slot counts

    def observe(self, seconds: float, error: bool, now: float) -> None:
        self.requests += 1
        self.errors += int(error)
        self.seconds += seconds
        self.buckets[_bucket(seconds)] += 1
        self._roll(int(now))
        self.recent[self.recent_at % RATE_WINDOW] += 1

    def _roll(self, second: int) -> None:
        if second <= self.recent_at:
            return
        for s in range(max(self.recent_at + 1, second - RATE_WINDOW + 1), second + 1):
            self.recent[s % RATE_WINDOW] = 0
        self.recent_at = second

    def rate(self, now: float) -> float:
        """Requests per second over the last ``RATE_WINDOW`` seconds."""
        copy = self.copy()
        copy._roll(int(now))
        return sum(copy.recent) / RATE_WINDOW

    def copy(self) -> VersionStats:
        return VersionStats(
            self.requests, self.errors, self.seconds, list(self.buckets), list(self.recent), self.recent_at
        )

    def minus(self, before: VersionStats) -> VersionStats:
        """What was answered since ``before`` (a snapshot of these same figures)."""
        return VersionStats(
            self.requests - before.requests,
            self.errors - before.errors,
            self.seconds - before.seconds,
            [a - b for a, b in zip(self.buckets, before.buckets, strict=True)],
        )

    def to_json(self) -> dict[str, Any]:
        """Its counts and histogram, as a server publishes them for the others (not its per-second rate)."""
        return {"requests": self.requests, "errors": self.errors, "seconds": self.seconds, "buckets": self.buckets}

    @classmethod
    def from_json(cls, data: Any) -> VersionStats:
        """Another server's published figures; empty ones where they are malformed."""
        try:
            buckets = [int(x) for x in data["buckets"]]
            if len(buckets) != len(BUCKET_BOUNDS) + 1:
                return cls()
            return cls(int(data["requests"]), int(data["errors"]), float(data["seconds"]), buckets)
        except (KeyError, TypeError, ValueError):
            return cls()

    @property
    def negative(self) -> bool:
        """A window with a count below zero: a server's figures it began with are gone (it restarted, or left)."""
        return self.requests < 0 or self.errors < 0 or any(b < 0 for b in self.buckets)

    def plus(self, other: VersionStats) -> VersionStats:
        return VersionStats(
            self.requests + other.requests,
            self.errors + other.errors,
            self.seconds + other.seconds,
            [a + b for a, b in zip(self.buckets, other.buckets, strict=True)],
        )

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests else None

    @property
    def mean_ms(self) -> float | None:
        return 1000 * self.seconds / self.requests if self.requests else None

    def percentile_ms(self, q: float) -> float | None:
        """The ``q`` (0 to 1) latency percentile in ms, linear within its bucket (within 25 % of the true one)."""
        total = sum(self.buckets)
        if total <= 0:
            return None
        rank = q * total
        seen = 0
        for i, count in enumerate(self.buckets):
            if count and seen + count >= rank:
                low = BUCKET_BOUNDS[i - 1] if i > 0 else 0.0
                high = BUCKET_BOUNDS[i] if i < len(BUCKET_BOUNDS) else BUCKET_BOUNDS[-1]
                return 1000 * (low + (high - low) * max(0.0, rank - seen) / count)
            seen += count
        return 1000 * BUCKET_BOUNDS[-1]


def _bucket(seconds: float) -> int:
    if seconds <= BUCKET_BOUNDS[0]:
        return 0
    i = math.ceil(math.log(seconds / BUCKET_BOUNDS[0], 1.25) - 1e-9)
    return min(max(i, 0), len(BUCKET_BOUNDS))


@dataclass(frozen=True)
class Decision:
    action: Literal["wait", "advance", "promote", "rollback"]
    weight: int = 0  # the new share (advance)
    why: str = ""


def _broken(policy: RolloutPolicy, canary: VersionStats, stable: VersionStats) -> str | None:
    """Why the canary broke a bound (and did worse than the stable version over the same window), or None."""
    rate, stable_rate = canary.error_rate or 0.0, stable.error_rate
    limit = policy.max_error_rate
    if limit is not None and rate > limit and (stable_rate is None or rate > stable_rate):
        compared = f" (stable {stable_rate:.1%})" if stable_rate is not None else ""
        return f"error rate {rate:.1%} over {canary.requests} predicts{compared}, above the {limit:.1%} allowed"
    p99, stable_p99 = canary.percentile_ms(0.99), stable.percentile_ms(0.99)
    bound = policy.max_p99_ms
    if bound is not None and p99 is not None and p99 > bound and (stable_p99 is None or p99 > stable_p99):
        compared = f" (stable {stable_p99:.1f} ms)" if stable_p99 is not None else ""
        return f"p99 {p99:.1f} ms over {canary.requests} predicts{compared}, above the {bound:g} ms allowed"
    return None


def decide(policy: RolloutPolicy, weight: int, canary: VersionStats, stable: VersionStats, waited: float) -> Decision:
    """What to do with a canary at ``weight`` percent, given both versions' figures since the share last changed
    and the seconds since then."""
    if canary.requests < policy.min_requests:
        return Decision("wait", weight, f"{canary.requests} of {policy.min_requests} predicts before a verdict")
    why = _broken(policy, canary, stable)
    if why is not None:
        return Decision("rollback", 0, why)
    following = [step for step in policy.steps if step > weight]
    if not following:
        return Decision("wait", weight, "within its bounds; no step above its share")
    if waited < policy.step_wait:
        return Decision("wait", weight, f"within its bounds; the next step after {policy.step_wait:g}s at {weight}%")
    rate = canary.error_rate or 0.0
    figures = f"error rate {rate:.1%}"
    if (p99 := canary.percentile_ms(0.99)) is not None:
        figures += f", p99 {p99:.1f} ms"
    figures += f" over {canary.requests} predicts"
    if following[0] >= 100:
        return Decision("promote", 100, f"{figures}: within its bounds at every step")
    return Decision("advance", following[0], f"{figures}: within its bounds at {weight}%")

"""Pure parsing of command-line values: durations (``30d``, ``1h30m``), points in time (``2h`` ago, ISO-8601) and
quota limits (``unlimited``, ``128G``). Errors are ValueErrors whose message says what is accepted."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kiln.domain import durations
from kiln.sdk.tenancy import QUOTA_FIELDS, quota_value

UNLIMITED = frozenset({"unlimited", "none", "null"})

DURATION_HINT = durations.EXAMPLES
TIME_HINT = f"a duration ago ({DURATION_HINT}) or an ISO-8601 time such as 2026-01-31T09:00 or 2026-01-31T09:00Z"


def parse_duration(text: str) -> timedelta:
    """The one grammar of ``kiln.domain.durations``: ``45s``, ``90m``, ``12h``, ``30d``, ``2w``, combinations like
    ``1d12h``; a plain number is seconds."""
    seconds = durations.parse_duration(text)
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise durations.DurationError(f"{text!r} is out of range for a duration") from None


def parse_datetime(text: str) -> datetime:
    """An ISO-8601 date or time; without a zone it is local time. The result is aware (UTC)."""
    stripped = text.strip()
    try:
        value = datetime.fromisoformat(stripped[:-1] + "+00:00" if stripped[-1:] in ("z", "Z") else stripped)
    except ValueError:
        raise ValueError(f"not an ISO-8601 time: {text!r}") from None
    return value.astimezone(UTC)  # a naive value is read as local time


def parse_time(text: str, now: datetime | None = None) -> datetime:
    """A point in time for --since/--until: ``now``, a duration ago (``2h``, ``7d``), or an ISO-8601 time."""
    now = now or datetime.now(UTC)
    if text.strip().lower() == "now":
        return now
    try:
        return now - parse_duration(text)
    except (ValueError, OverflowError):  # before the year 1: not a time either
        pass
    try:
        return parse_datetime(text)
    except ValueError:
        raise ValueError(f"not a time: {text!r} ({TIME_HINT})") from None


def parse_expiry(text: str, now: datetime | None = None) -> tuple[float | None, datetime | None]:
    """--expires: ``(seconds, None)`` for a duration from now (``30d``), ``(None, time)`` for an ISO-8601 time."""
    try:
        return parse_duration(text).total_seconds(), None
    except ValueError:
        pass
    try:
        when = parse_datetime(text)
    except ValueError:
        raise ValueError(
            f"not an expiry: {text!r} (a duration from now, {DURATION_HINT}, or an ISO-8601 time)"
        ) from None
    if when <= (now or datetime.now(UTC)):
        raise ValueError(f"expiry {text!r} is in the past")
    return None, when


def parse_quota_limit(field: str, text: str) -> int | float | None:
    """One quota flag: ``unlimited`` → None; ``memory``/``storage`` take sizes (``128G``, ``1T``); ``gpus`` and
    ``count`` whole numbers; ``cpus`` a number."""
    if field not in QUOTA_FIELDS:
        raise ValueError(f"unknown quota field {field!r}")
    if text.strip().lower() in UNLIMITED:
        return None
    try:
        return quota_value(field, text.strip())
    except ValueError as exc:
        if field in ("memory", "storage"):
            raise ValueError(f"not a size: {text!r} (use e.g. 128G, 512Mi, 1T, or 'unlimited')") from None
        raise ValueError(f"{exc} (or 'unlimited')") from None

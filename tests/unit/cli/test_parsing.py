"""Pure parsing of CLI values: --expires, --since/--until and quota limits."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from kiln.cli.parsing import parse_datetime, parse_duration, parse_expiry, parse_quota_limit, parse_time

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("45s", 45),
        ("90m", 5400),
        ("12h", 43200),
        ("30d", 30 * 86400),
        ("2w", 14 * 86400),
        ("1d12h", 36 * 3600),
        ("1h30m", 5400),
        ("1.5h", 5400),
        (" 2D ", 2 * 86400),
        ("600", 600),
    ],
)
def test_durations(text, seconds):
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "d", "3 days", "1y", "-5m", "0", "0s", "h1", "1h-30m", "2026-01-01"])
def test_bad_durations_say_what_is_accepted(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_iso_times_are_utc_and_naive_ones_local():
    assert parse_datetime("2026-01-31T09:00:00Z") == datetime(2026, 1, 31, 9, tzinfo=UTC)
    assert parse_datetime("2026-01-31T10:00+01:00") == datetime(2026, 1, 31, 9, tzinfo=UTC)
    naive = parse_datetime("2026-01-31T09:00")
    assert naive == datetime(2026, 1, 31, 9).astimezone().astimezone(UTC)
    assert naive.tzinfo is UTC
    assert parse_datetime("2026-01-31") == datetime(2026, 1, 31).astimezone().astimezone(UTC)
    with pytest.raises(ValueError, match="ISO-8601"):
        parse_datetime("yesterday")


def test_since_is_a_duration_ago_or_a_time():
    assert parse_time("1h", NOW) == NOW - timedelta(hours=1)
    assert parse_time("2d", NOW) == NOW - timedelta(days=2)
    assert parse_time("now", NOW) == NOW
    assert parse_time("2026-02-01T00:00Z", NOW) == datetime(2026, 2, 1, tzinfo=UTC)
    assert parse_time("2026-02-01T01:00+01:00", NOW) == datetime(2026, 2, 1, tzinfo=UTC)
    with pytest.raises(ValueError, match="not a time"):
        parse_time("last week", NOW)


def test_expiry_is_a_duration_from_now_or_a_future_time():
    assert parse_expiry("30d", NOW) == (30 * 86400, None)
    assert parse_expiry("12h", NOW) == (43200, None)
    later = parse_expiry("2026-06-01T00:00:00Z", NOW)
    assert later == (None, datetime(2026, 6, 1, tzinfo=UTC))
    assert parse_expiry("2026-06-01T02:00:00+02:00", NOW)[1] == datetime(2026, 6, 1, tzinfo=UTC)
    with pytest.raises(ValueError, match="in the past"):
        parse_expiry("2026-01-01T00:00Z", NOW)
    with pytest.raises(ValueError, match="not an expiry"):
        parse_expiry("forever", NOW)


@pytest.mark.parametrize(
    ("field", "text", "value"),
    [
        ("gpus", "4", 4),
        ("gpus", "0", 0),
        ("count", "10", 10),
        ("cpus", "8", 8.0),
        ("cpus", "2.5", 2.5),
        ("memory", "128G", 128 * 1024**3),
        ("memory", "512Mi", 512 * 1024**2),
        ("storage", "1T", 1024**4),
        ("storage", "1000", 1000),
        ("gpus", "unlimited", None),
        ("memory", "Unlimited", None),
        ("count", " none ", None),
    ],
)
def test_quota_limits(field, text, value):
    parsed = parse_quota_limit(field, text)
    assert parsed == value
    assert type(parsed) is type(value)


@pytest.mark.parametrize(
    ("field", "text"),
    [
        ("gpus", "-1"),
        ("gpus", "1.5"),
        ("gpus", "many"),
        ("count", "2G"),
        ("cpus", "-0.5"),
        ("cpus", "nan"),
        ("cpus", "inf"),
        ("memory", "lots"),
        ("storage", "-1T"),
        ("disks", "4"),
    ],
)
def test_bad_quota_limits(field, text):
    with pytest.raises(ValueError):
        parse_quota_limit(field, text)

"""One duration grammar (kiln.domain.durations) for a job's timeout and the CLI's --since, --until, --expires."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kiln.cli.parsing import parse_expiry, parse_time
from kiln.domain.durations import DurationError, parse_duration
from kiln.domain.spec import JobSpec

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
HINT = "(e.g. 90s, 15m, 2h, 1d, 1h30m)"


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("90", 90.0),
        ("90s", 90.0),
        ("15m", 900.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("1w", 604800.0),
        ("1h30m", 5400.0),
        ("1d12h", 129600.0),
        ("1h30m15s", 5415.0),
        ("1.5h", 5400.0),
        (" 1h 30m ", 5400.0),
        ("2D", 172800.0),
        (90, 90.0),
        (1.5, 1.5),
    ],
)
def test_durations(value: Any, seconds: float) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1x", f"timeout: '1x' is not a duration {HINT}"),
        ("", f"timeout: '' is not a duration {HINT}"),
        ("1y", f"timeout: '1y' is not a duration {HINT}"),
        ("-5", f"timeout: '-5' is not a duration {HINT}"),
        ("h", f"timeout: 'h' is not a duration {HINT}"),
        ("1h30", f"timeout: '1h30' is not a duration {HINT}"),  # 1h30s or 1h30m: say which
        ("3 days", f"timeout: '3 days' is not a duration {HINT}"),
        ("0", f"timeout: '0' is not a positive duration {HINT}"),
        ("0s", f"timeout: '0s' is not a positive duration {HINT}"),
        (0, f"timeout: 0 is not a positive duration {HINT}"),
        (-3, f"timeout: -3 is not a positive duration {HINT}"),
        (float("nan"), f"timeout: nan is not a positive duration {HINT}"),
        (float("inf"), "timeout: inf is out of range for a duration"),
        (10**400, "timeout: a number out of range for a duration"),
        (True, f"timeout: True is not a duration {HINT}"),
        ([1], f"timeout: [1] is not a duration {HINT}"),
        ("9" * 40, "timeout: not a duration: longer than 32 characters"),
    ],
)
def test_bad_durations_name_the_field_and_say_what_a_duration_is(value: Any, message: str) -> None:
    with pytest.raises(DurationError) as info:
        parse_duration(value, "timeout")
    assert str(info.value) == message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("text", ["90", "90s", "15m", "2h", "1d", "1w", "1h30m", "1d12h", "1.5h"])
def test_the_spec_the_cli_since_and_expires_read_a_duration_alike(text: str) -> None:
    seconds = parse_duration(text)
    assert JobSpec.model_validate({"command": "true", "timeout": text}).timeout == seconds
    assert parse_time(text, NOW) == NOW - timedelta(seconds=seconds)
    assert parse_expiry(text, NOW) == (seconds, None)


@pytest.mark.parametrize("text", ["1x", "1y", "1h30", "0"])
def test_the_spec_the_cli_since_and_expires_refuse_a_non_duration_alike(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        JobSpec.model_validate({"command": "true", "timeout": text})
    with pytest.raises(ValueError, match="not a time"):
        parse_time(text, NOW)
    with pytest.raises(ValueError, match="not an expiry"):
        parse_expiry(text, NOW)


def test_a_duration_before_the_year_one_is_not_a_time() -> None:
    with pytest.raises(ValueError, match="not a time"):
        parse_time("99999999w", NOW)

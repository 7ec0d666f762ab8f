"""The log line format and the shim's own copy of it."""

from __future__ import annotations

import calendar
import time

import pytest

from kiln.injob import logline, shim

T = calendar.timegm((2026, 11, 30, 12, 34, 56)) + 0.25


def test_format_line_layout() -> None:
    assert logline.format_line("O", b"hello world\n", now=T) == b"2026-11-30T12:34:56.250000Z O hello world\n"
    assert logline.format_line("E", b"oops", now=T) == b"2026-11-30T12:34:56.250000Z E oops\n"


def test_trailing_newlines_are_stripped_to_exactly_one() -> None:
    assert logline.format_line("K", b"x\n\n\n", now=T).endswith(b" K x\n")
    assert logline.format_line("K", b"", now=T) == b"2026-11-30T12:34:56.250000Z K \n"


@pytest.mark.parametrize(
    ("now", "stamp"),
    [
        (0.0, "1970-01-01T00:00:00.000000Z"),
        (1.5, "1970-01-01T00:00:01.500000Z"),
        (calendar.timegm((2024, 2, 29, 23, 59, 59)) + 0.999999, "2024-02-29T23:59:59.999999Z"),
    ],
)
def test_timestamp(now: float, stamp: str) -> None:
    assert logline.timestamp(now) == stamp


def test_timestamp_defaults_to_now() -> None:
    before = time.time()
    stamp = logline.timestamp()
    after = time.time()
    parsed = calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) + float("0" + stamp[19:-1])
    assert before - 1e-6 <= parsed <= after + 1e-6


@pytest.mark.parametrize(
    ("stream", "text"),
    [
        ("O", "hello"),
        ("E", "Traceback (most recent call last):"),
        ("K", "restarting"),
        ("O", "  indented  x"),
        ("O", ""),
    ],
)
def test_round_trip(stream: str, text: str) -> None:
    line = logline.format_line(stream, text.encode(), now=T).decode()
    assert logline.parse_line(line) == ("2026-11-30T12:34:56.250000Z", stream, text)


@pytest.mark.parametrize(
    ("line", "parsed"),
    [
        ("2026-11-30T00:00:00.000000Z O a b c\n", ("2026-11-30T00:00:00.000000Z", "O", "a b c")),
        ("2026-11-30T00:00:00.000000Z E\n", ("2026-11-30T00:00:00.000000Z", "E", "")),
        ("just some text\n", ("", "O", "just some text")),
        ("one", ("", "O", "one")),
        ("", ("", "O", "")),
        ("t XX text", ("", "O", "t XX text")),
    ],
)
def test_parse_line_is_tolerant(line: str, parsed: tuple[str, str, str]) -> None:
    assert logline.parse_line(line) == parsed


@pytest.mark.parametrize(
    "now",
    [0.0, 1.5, T, 1_700_000_000.123456, 1_799_999_999.999999, 1_234_567_890.000001, 4_102_444_799.5],
)
@pytest.mark.parametrize("text", [b"hello\n", b"", b"\xff\xfe binary", b"a\nb\n\n", "ünïcode ✓".encode()])
@pytest.mark.parametrize("stream", ["O", "E", "K"])
def test_shim_copy_is_byte_identical(now: float, text: bytes, stream: str) -> None:
    assert shim.format_line(stream, text, now) == logline.format_line(stream, text, now)
    assert shim.timestamp(now) == logline.timestamp(now)


def test_shim_copy_defaults_to_now_too() -> None:
    line = shim.format_line("O", b"x")
    stamp, stream, text = logline.parse_line(line.decode())
    assert (stream, text) == ("O", "x")
    assert abs(calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) - time.time()) < 5

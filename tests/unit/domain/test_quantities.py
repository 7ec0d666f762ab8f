"""Memory quantities: what users write (2G, 512Mi) and how it is shown back."""

from __future__ import annotations

from typing import Any

import pytest

from kiln.domain.quantities import format_memory, parse_memory

KI, MI, GI, TI = 1024, 1024**2, 1024**3, 1024**4


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2G", 2 * GI),
        ("2g", 2 * GI),
        ("2GB", 2 * GI),
        ("2Gi", 2 * GI),
        ("2GiB", 2 * GI),
        ("512Mi", 512 * MI),
        ("512M", 512 * MI),
        ("512m", 512 * MI),
        ("1k", KI),
        ("1Ki", KI),
        ("1T", TI),
        ("1.5Gi", int(1.5 * GI)),
        ("0.5G", GI // 2),
        ("100", 100),
        ("100b", 100),
        (" 2 Gi ", 2 * GI),
        (1234, 1234),
        (12.9, 12),
        (0, 0),
    ],
)
def test_parse_memory(text: str | int | float, expected: int) -> None:
    assert parse_memory(text) == expected


@pytest.mark.parametrize("bad", ["", "lots", "G", "2X", "2 G B", "-1G", "1e9", "1,5G", "0x10"])
def test_parse_memory_rejects_text_naming_it(bad: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_memory(bad)
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize("bad", [-1, -0.5, True, False])
def test_parse_memory_rejects_negative_numbers_and_bools(bad: Any) -> None:
    with pytest.raises(ValueError):
        parse_memory(bad)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0B"),
        (512, "512B"),
        (KI, "1Ki"),
        (1536, "1.5Ki"),
        (512 * MI, "512Mi"),
        (2 * GI, "2Gi"),
        (int(1.5 * GI), "1.5Gi"),
        (3 * TI, "3Ti"),
    ],
)
def test_format_memory(n: int, text: str) -> None:
    assert format_memory(n) == text


@pytest.mark.parametrize("n", [KI, 7 * MI, 2 * GI, 5 * TI])
def test_format_then_parse_round_trips_whole_units(n: int) -> None:
    assert parse_memory(format_memory(n)) == n

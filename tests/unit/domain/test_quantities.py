"""Quantities: what users write (2G, 512Mi) and how sizes and measured values are shown back to them."""

from __future__ import annotations

from typing import Any

import pytest

from kiln.domain.quantities import format_bytes, format_cpus, format_memory, format_number, millicores, parse_memory
from kiln.injob import units

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


SIZES = [
    (0, "0 B"),
    (512, "512 B"),
    (1023, "1023 B"),
    (KI, "1 KiB"),
    (1536, "1.5 KiB"),
    (MI - 1, "1 MiB"),  # 1023.999 KiB rounds up a unit, not to "1024 KiB"
    (512 * MI, "512 MiB"),
    (99_717_100, "95.1 MiB"),  # system/rss_bytes as `kiln metrics` showed it: 9.97171e+07
    (251_117_568, "239.5 MiB"),
    (200 * MI, "200 MiB"),
    (2 * GI, "2 GiB"),
    (int(1.5 * GI), "1.5 GiB"),
    (3 * TI, "3 TiB"),
    (5 * 1024**6, "5 EiB"),
    (-2 * KI, "-2 KiB"),
    (12.7, "13 B"),
]


@pytest.mark.parametrize(("n", "text"), SIZES)
def test_format_bytes(n: float, text: str) -> None:
    assert format_bytes(n) == text
    assert format_memory(n) == text  # the older name: the same formatter


@pytest.mark.parametrize(("n", "text"), SIZES)
def test_the_shims_copy_formats_sizes_the_same(n: float, text: str) -> None:
    # The shim (standard library only) writes the limits' messages with its own copy.
    assert units.human(n) == text


@pytest.mark.parametrize("n", [KI, 7 * MI, 2 * GI, 5 * TI])
def test_format_then_parse_round_trips_whole_units(n: int) -> None:
    assert parse_memory(format_bytes(n)) == n


@pytest.mark.parametrize(
    ("x", "text"),
    [
        (0.0, "0"),
        (0.0123, "0.0123"),
        (0.5, "0.5"),
        (3.0, "3"),
        (12345.67, "12345.7"),
        (123456.7, "123457"),
        (1234567.8, "1234568"),  # %g: 1.23457e+06
        (99717100.0, "99717100"),  # %g: 9.97171e+07
        (-12345678.9, "-12345679"),
        (0.00001234, "1.234e-05"),  # tiny values keep the exponent
        (1e20, "1e+20"),
        (7, "7"),
        (12345678901234567, "12345678901234567"),  # an int (a step) as it is
        (float("nan"), "nan"),
        (float("-inf"), "-inf"),
    ],
)
def test_format_number(x: float, text: str) -> None:
    assert format_number(x) == text


@pytest.mark.parametrize(
    ("cpus", "expected"),
    [
        (0.1, 100),
        (0.3, 300),
        (0.1 * 3, 300),
        (2, 2000),
        (1.5, 1500),
        (0.0001, 1),
        (0.0015, 2),
        (1e-9, 1),
        (4096, 4_096_000),
    ],
)
def test_millicores(cpus: float, expected: int) -> None:
    assert millicores(cpus) == expected


@pytest.mark.parametrize(
    ("millicores_", "text"),
    [(100, "0.1"), (2000, "2"), (1250, "1.25"), (1, "0.001"), (0, "0"), (-500, "-0.5"), (4_096_000, "4096")],
)
def test_format_cpus(millicores_: int, text: str) -> None:
    assert format_cpus(millicores_) == text


def test_a_hundred_tenths_are_ten_cpus_exactly() -> None:
    assert sum(0.1 for _ in range(100)) != 10  # the residue floats leave
    assert format_cpus(sum(millicores(0.1) for _ in range(100))) == "10"


def test_letters_a_case_insensitive_match_takes_for_units_are_read_as_those_units() -> None:
    """Python's case-insensitive match takes U+0131 (a dotless i) for i and a KELVIN SIGN for k: such a text is the unit
    it matched as, never a KeyError (it was a 500 from the API)."""
    from kiln.domain.quantities import parse_memory

    assert parse_memory("2k\u0131") == parse_memory("2Ki") == 2048
    assert parse_memory("2\u212a") == 2048

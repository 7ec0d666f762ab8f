"""Parsing of resource quantities such as ``2G``, ``512Mi`` or ``1.5``."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "k": 1000,
    "m": 1000**2,
    "g": 1000**3,
    "t": 1000**4,
    "ki": 1024,
    "mi": 1024**2,
    "gi": 1024**3,
    "ti": 1024**4,
}
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*$", re.IGNORECASE)


def parse_memory(value: str | int | float) -> int:
    """Bytes in a memory quantity. ``2G`` and ``2GB`` are 2·1024³ (as users mean it), ``2Gi`` likewise;
    plain numbers are bytes.

    Raises ValueError naming the text when it is not a quantity.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a memory quantity: {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"memory must not be negative: {value!r}")
        return int(value)
    match = _MEMORY.match(value)
    if not match:
        raise ValueError(f"not a memory quantity: {value!r} (use e.g. 512M, 2G, 1.5Gi)")
    number = float(match.group(1))
    unit = (match.group(2) or "").lower()
    # Users write 2G meaning 2 GiB; treat decimal and binary suffixes alike, as docker and most schedulers do.
    multiplier = _UNITS[unit if unit.endswith("i") or unit == "" else unit + "i"]
    return int(number * multiplier)


def format_memory(n: int) -> str:
    for unit, size in (("Ti", 1024**4), ("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
        if n >= size:
            value = n / size
            return f"{value:.1f}{unit}" if value % 1 else f"{int(value)}{unit}"
    return f"{n}B"

"""Resource quantities: parsing what people write (``2G``, ``512Mi``, ``1.5``) and showing sizes and measured
values back to them (``format_bytes``, ``format_number``)."""

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


_BINARY_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def format_bytes(n: float) -> str:
    """A byte count for people: ``512 B``, ``1.5 KiB``, ``239.5 MiB``, ``2 GiB`` (binary units, one decimal unless
    it is ``.0``). The one formatter for sizes wherever a person reads them; JSON and API fields keep bytes.
    ``parse_memory`` reads the text back. The shim, standard library only, carries a copy
    (``kiln.runtime.units.human``); a test keeps the two equal."""
    if n != n or n in (float("inf"), float("-inf")):
        return f"{n} B"
    sign, n = ("-", -n) if n < 0 else ("", n)
    if round(n) < 1024:
        return f"{sign}{n:.0f} B"
    unit = 0
    n /= 1024
    while round(n, 1) >= 1024 and unit < len(_BINARY_UNITS) - 1:  # 1023.96 KiB shows as 1 MiB, not 1024.0 KiB
        n /= 1024
        unit += 1
    return f"{sign}{n:.1f}".removesuffix(".0") + f" {_BINARY_UNITS[unit]}"


format_memory = format_bytes  # what memory, disk and storage sizes were shown with: the same formatter


def format_number(x: float) -> str:
    """A measured value for people: six significant digits like ``%g``, but with no exponent for everyday
    magnitudes (``0.0123``, ``12345.7``, ``99717100``); only below 0.0001 or from 10¹⁵ up does ``%g``'s
    scientific notation return (``1.2e-05``). Whole numbers print without a decimal point; ints as they are."""
    if isinstance(x, int) or x != x or x in (float("inf"), float("-inf")):
        return str(x)
    if 1e6 <= abs(x) < 1e15:  # where %g writes 1.23457e+06: the whole number instead
        return f"{x:.0f}"
    return f"{x:.6g}"

"""Resource quantities: parsing what people write (``2G``, ``512Mi``, ``1.5``) and showing sizes and measured
values back to them (``format_bytes``, ``format_number``); CPUs as whole millicores (``millicores``,
``format_cpus``), the unit the scheduler and the quotas count in."""

from __future__ import annotations

import math
import re

MILLI = 1000  # millicores per CPU

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
    unit = match.group(2) or ""
    # Users write 2G meaning 2 GiB; treat decimal and binary suffixes alike, as docker and most schedulers do.
    # The unit's letters are read as the match read them: case-insensitive matching also takes a KELVIN SIGN for
    # k and U+0131 (a dotless i) for i, which .lower() keeps as they are (a KeyError, a 500, before).
    multiplier = _UNITS[unit[:1].lower().replace("\u212a", "k") + "i" if unit else ""]
    return int(number * multiplier)


_BINARY_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def format_bytes(n: float) -> str:
    """A byte count for people: ``512 B``, ``1.5 KiB``, ``239.5 MiB``, ``2 GiB`` (binary units, one decimal unless
    it is ``.0``). The one formatter for sizes wherever a person reads them; JSON and API fields keep bytes.
    ``parse_memory`` reads the text back. The shim, standard library only, carries a copy
    (``kiln.injob.units.human``); a test keeps the two equal."""
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


def millicores(cpus: float) -> int:
    """CPUs as people write them (``0.1``, ``2``) in whole millicores, the unit the scheduler and the quotas count
    in (as Kubernetes does), so 100 jobs of 0.1 CPU fill exactly 10 CPUs with no residue. A fraction of a millicore
    rounds up (Kubernetes' rule): a job asking 0.0001 CPU holds 1m, never nothing. Float noise (0.1 * 3 is
    0.30000000000000004) is taken off before rounding up."""
    return math.ceil(round(cpus * MILLI, 6))


def format_cpus(millicores: int) -> str:
    """Millicores as CPUs as people write them: ``100`` → ``0.1``, ``2000`` → ``2``, ``1250`` → ``1.25``. Exact
    (no float on the way), so a count never reads ``1.16851e-14``."""
    sign, n = ("-", -millicores) if millicores < 0 else ("", millicores)
    whole, part = divmod(n, MILLI)
    return f"{sign}{whole}" + (f".{part:03d}".rstrip("0") if part else "")

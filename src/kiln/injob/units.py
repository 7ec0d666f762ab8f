"""Sizes for people in the job's log and in its events (``239.5 MiB``, ``2 GiB``).

Standard library only, like the shim that loads it (as ``kiln.injob.units`` in the package, or as a plain module
from this file's directory when the shim runs as a script). It is a copy of ``kiln.domain.quantities.format_bytes``,
which the server and the CLI use; a test keeps the two equal.
"""

from __future__ import annotations

_BINARY_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def human(n: float) -> str:
    """``512 B``, ``1.5 KiB``, ``239.5 MiB``, ``2 GiB``: binary units, one decimal unless it is ``.0``."""
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

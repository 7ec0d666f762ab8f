"""One grammar for durations, wherever one is written: a job's ``timeout`` (``kiln.yaml``, the API, the SDK,
``kiln run --timeout``) and the CLI's ``--since``/``--until`` (a duration ago) and ``--expires`` (a duration from
now).

A duration is a number of seconds (``90``, ``1.5``) or numbers with units — ``w`` weeks, ``d`` days, ``h`` hours,
``m`` minutes, ``s`` seconds — in any combination (``90s``, ``15m``, ``2h``, ``1d``, ``1h30m``, ``1d12h``). Case and
spaces do not matter; it is positive. The result is seconds (a float), which is what job specs store.
"""

from __future__ import annotations

import math
import re

from kiln.domain import limits

UNIT_SECONDS = {"w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1}
EXAMPLES = "e.g. 90s, 15m, 2h, 1d, 1h30m"
_NUMBER = r"\d+(?:\.\d+)?"
_PLAIN = re.compile(rf"{_NUMBER}")
_WITH_UNITS = re.compile(rf"(?:{_NUMBER}[wdhms])+")
_PART = re.compile(rf"({_NUMBER})([wdhms])")


class DurationError(ValueError):
    """Not a duration; the message quotes the value and gives examples (and names the field, when given one)."""


def parse_duration(value: str | int | float, field: str | None = None) -> float:
    """Seconds in ``value``: a number (seconds) or a text such as ``"90"``, ``"90s"``, ``"15m"``, ``"2h"``,
    ``"1d"``, ``"2w"``, ``"1h30m"``. Raises DurationError (a ValueError) whose message starts with ``field: ``
    when a field is named: ``timeout: '1x' is not a duration (e.g. 90s, 15m, 2h, 1d, 1h30m)``."""
    where = f"{field}: " if field else ""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise DurationError(f"{where}{value!r} is not a duration ({EXAMPLES})")
    if isinstance(value, str):
        if len(value) > limits.MAX_QUANTITY_LENGTH:
            raise DurationError(f"{where}not a duration: longer than {limits.MAX_QUANTITY_LENGTH} characters")
        compact = "".join(value.split()).lower()
        if _PLAIN.fullmatch(compact):
            seconds = float(compact)
        elif _WITH_UNITS.fullmatch(compact):
            seconds = sum(float(n) * UNIT_SECONDS[unit] for n, unit in _PART.findall(compact))
        else:
            raise DurationError(f"{where}{value!r} is not a duration ({EXAMPLES})")
    else:
        try:
            seconds = float(value)
        except OverflowError:
            raise DurationError(f"{where}a number out of range for a duration") from None
    if math.isnan(seconds) or seconds <= 0:
        raise DurationError(f"{where}{value!r} is not a positive duration ({EXAMPLES})")
    if math.isinf(seconds):
        raise DurationError(f"{where}{value!r} is out of range for a duration")
    return seconds


def format_duration(seconds: float) -> str:
    """``90`` → ``1m30s``, ``7200`` → ``2h``, ``0.5`` → ``0.5s``: as parse_duration reads it back."""
    if seconds < 60 and seconds != int(seconds):
        return f"{seconds:g}s"
    rest = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(parts) or "0s"

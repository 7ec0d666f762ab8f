"""Spool lines as the ingester and the HTTP route read them: one JSON object per line, a point
(``{"t", "s", "w", "m", "src"}``) or an event (``{"event", "message", "w"}``), parsed into the rows the writer
(``metrics_store``) takes. Malformed lines are counted, never raised.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

MAX_NAME = 200
MAX_WORKER = 64
SOURCES = frozenset({"sdk", "log", "tb", "sys", "api"})
NONFINITE = {"nan": "nan", "+nan": "nan", "-nan": "nan", "inf": "inf", "+inf": "inf", "infinity": "inf"}
NONFINITE |= {"+infinity": "inf", "-inf": "-inf", "-infinity": "-inf"}
INT64 = 2**63

# A point as the writer takes it: (worker, name, source, step, time, value, text).
Row = tuple[str, str, str, int | None, float, float | None, str | None]


class Columns:
    """One series' points of a batch, column by column, in the order they came: what the writer inserts. The
    parser appends to the columns directly (no tuple per point, no regrouping afterwards: most of a batch's
    Python cost)."""

    __slots__ = ("source", "steps", "texts", "times", "values")

    def __init__(self, source: str) -> None:
        self.source = source  # the series' first point's (it decides a new series' source)
        self.steps: list[int | None] = []
        self.times: list[float] = []
        self.values: list[float | None] = []  # finite numbers; None where the point is text or non-finite
        self.texts: list[str | None] = []  # text and "nan"/"inf"/"-inf"; None where ``values`` has the number

    def __len__(self) -> int:
        return len(self.times)


@dataclass
class Parsed:
    """A batch: its points by series, ``(worker, name)`` → :class:`Columns`, in the order the series first
    appear."""

    series: dict[tuple[str, str], Columns] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (member, reason, message)
    errors: int = 0
    first_error: str = ""
    long_lines: int = 0  # lines skipped for being longer than the job's metrics.limits.line
    refused: int = 0  # points of series the job's budget refused as they were parsed (``parse_lines(admit=)``)

    def error(self, why: str) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = why

    @property
    def count(self) -> int:
        """The batch's points."""
        return sum(len(c) for c in self.series.values())

    def add(self, row: Row) -> None:
        """One point, for writers that have rows (MLflow's log-batch)."""
        worker, name, source, step, t, value, text = row
        columns = self.series.get((worker, name))
        if columns is None:
            columns = self.series[(worker, name)] = Columns(source)
        columns.steps.append(step)
        columns.times.append(t)
        columns.values.append(value)
        columns.texts.append(text)

    @classmethod
    def of(cls, rows: list[Row]) -> Parsed:
        parsed = cls()
        for row in rows:
            parsed.add(row)
        return parsed

    @property
    def points(self) -> list[Row]:
        """Every point as a row, series by series (for reading a batch; the writer takes the columns)."""
        return [
            (worker, name, c.source, step, t, value, text)
            for (worker, name), c in self.series.items()
            for step, t, value, text in zip(c.steps, c.times, c.values, c.texts, strict=True)
        ]


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        try:
            return float(value)
        except OverflowError:  # an integer beyond a double
            return math.inf if value > 0 else -math.inf
    return None


def _loads(line: bytes) -> Any:
    """One spool line's JSON value; ValueError where it is not JSON. orjson reads a line as the SDK and the shim
    write it (a third of the standard decoder's time); what it refuses and the standard library takes (NaN and
    Infinity literals, integers beyond 64 bits, lone surrogates, bytes that are not UTF-8, read as U+FFFD) gets
    the standard library's verdict, so that both read the same lines alike."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return json.loads(line.decode("utf-8", errors="replace"))


def parse_lines(
    data: bytes | str,
    parsed: Parsed | None = None,
    max_line: int | None = None,
    admit: Callable[[tuple[str, str]], bool] | None = None,
) -> Parsed:
    """Parse complete spool lines (points and events). Malformed lines and unusable names are counted and
    skipped, never raised. Values: numbers (finite ones in ``value``; NaN and ±inf, as numbers or as the strings
    "nan"/"inf"/"-inf", in ``text``), other strings in ``text``. ``max_line``: a longer line (bytes) is skipped,
    counted as malformed and in ``long_lines``, never parsed. ``admit``: whether a series not in ``parsed`` yet
    is taken (a job at its series limit: only those it has); the points of the others are counted in ``refused``,
    and cost no columns."""
    parsed = parsed or Parsed()
    raw = data.encode("utf-8", errors="surrogatepass") if isinstance(data, str) else data
    series = parsed.series
    # Per series, the four columns' append methods (looked up once per series, not once per point).
    appends: dict[tuple[str, str], tuple[Any, Any, Any, Any]] = {
        key: (c.steps.append, c.times.append, c.values.append, c.texts.append) for key, c in series.items()
    }
    for line in raw.split(b"\n"):
        if max_line is not None and len(line) > max_line:
            parsed.error(f"a line over {max_line} bytes (metrics.limits.line)")
            parsed.long_lines += 1
            continue
        try:
            obj = _loads(line)
        except (ValueError, RecursionError):
            if not line.strip():
                continue
            parsed.error("not JSON")
            continue
        if type(obj) is not dict:
            parsed.error("not a JSON object")
            continue
        worker = obj.get("w") or "worker0"
        if type(worker) is not str or len(worker) > MAX_WORKER:
            parsed.error("bad member 'w'")
            continue
        if "event" in obj:
            reason, message = obj.get("event"), obj.get("message", "")
            if not isinstance(reason, str) or not reason or len(reason) > 64 or not isinstance(message, str):
                parsed.error("bad event")
                continue
            parsed.events.append((worker, reason, message[:4000]))
            continue
        metrics = obj.get("m")
        t = obj.get("t")
        if type(t) is not float:
            t = _number(t)
        step = obj.get("s")
        if type(metrics) is not dict or t is None or t - t != 0.0:  # t finite (NaN and ±inf give NaN)
            parsed.error("a point needs 'm' (an object) and 't' (a number)")
            continue
        if step is not None and (type(step) is not int or not -INT64 <= step < INT64):
            parsed.error("'s' must be an integer or null")
            continue
        src = obj.get("src") or "sdk"
        if src not in SOURCES:
            src = "sdk"
        for name, raw_value in metrics.items():
            if not 0 < len(name) <= MAX_NAME:
                parsed.error("metric name empty or longer than 200 characters")
                continue
            kind = type(raw_value)
            value: float | None = None
            text: str | None = None
            if kind is float:
                if raw_value - raw_value == 0.0:  # finite (NaN and the infinities give NaN)
                    value = raw_value
                else:
                    text = str(raw_value)
            elif kind is int or kind is bool:
                try:
                    value = float(raw_value)
                except OverflowError:  # an integer beyond a double: the infinity of its sign
                    text = "inf" if raw_value > 0 else "-inf"
            elif kind is str:
                text = NONFINITE.get(raw_value.strip().lower()) or raw_value[:10000]
            else:
                parsed.error(f"metric {name[:40]!r}: value is neither a number nor a string")
                continue
            key = (worker, name)
            put = appends.get(key)
            if put is None:
                if admit is not None and not admit(key):
                    parsed.refused += 1
                    continue
                columns = series[key] = Columns(src)
                put = appends[key] = (
                    columns.steps.append,
                    columns.times.append,
                    columns.values.append,
                    columns.texts.append,
                )
            put[0](step)
            put[1](t)
            put[2](value)
            put[3](text)
    return parsed


def complete_lines(data: bytes) -> int:
    """How many leading bytes of ``data`` are complete lines (up to and including the last newline)."""
    return data.rfind(b"\n") + 1

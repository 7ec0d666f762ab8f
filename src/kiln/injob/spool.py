"""Spool files: the lines the server's ingester reads, and their writer.

Standard library only, like ``extract`` (which loads it; see there). One writer per file, named
``<src>-a<attempt>-<member>.jsonl``; every line is complete when it lands (batched ``O_APPEND`` writes).
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import re
import time
from collections.abc import Callable
from typing import Any

MAX_NAME = 200
MAX_TEXT = 1000  # a text metric's value is cut here
# A point waits at most this long in the shim before the server can read it: a tuning study's pruner judges each
# reported step, and every tenth of a second a trial runs on after its verdict is an epoch it wastes (0.5 s made
# pruned trials of the digits benchmark run 3 to 6 epochs past their verdict).
FLUSH_SECONDS = 0.1
FLUSH_POINTS = 1000

Number = float
Value = float | str


def clean_name(name: str) -> str:
    return name[:MAX_NAME]


def clean_value(value: Value) -> Value:
    """Finite floats stay numbers; NaN and infinities become the text metrics "nan", "inf", "-inf"."""
    if isinstance(value, str):
        return value[:MAX_TEXT]
    value = float(value)
    if math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


# One encoder for every line (json.dumps with options builds a new one per call).
_ENCODE = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode


def _clean(metrics: dict[str, Value]) -> dict[str, Value]:
    """The metrics as a line carries them; most points (finite floats, short names) are taken as they are."""
    for name, value in metrics.items():
        if type(value) is not float or not math.isfinite(value) or len(name) > MAX_NAME:
            return {clean_name(k): clean_value(v) for k, v in metrics.items()}
    return metrics


def encode_point(t: float, step: int | None, member: str, metrics: dict[str, Value], src: str) -> bytes:
    return _ENCODE({"t": t, "s": step, "w": member, "m": _clean(metrics), "src": src}).encode() + b"\n"


def encode_event(t: float, reason: str, message: str, member: str) -> bytes:
    return _ENCODE({"t": t, "event": reason, "message": message[:2000], "w": member}).encode() + b"\n"


def safe_member(member: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", member) or "worker0"


def spool_path(directory: str, src: str, attempt: object, member: str) -> str:
    return os.path.join(directory, f"{src}-a{attempt}-{safe_member(member)}.jsonl")


class Watch:
    """The spec's ``metrics.watch``: shell-style patterns of names (without regard to case) whose points are sent
    on at once rather than with the next batch."""

    def __init__(self, patterns: object = ()) -> None:
        self.patterns = tuple(str(p).lower() for p in patterns or ()) if isinstance(patterns, list | tuple) else ()
        self.cache: dict[str, bool] = {}

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def any(self, names: object) -> bool:
        for name in names:  # type: ignore[attr-defined]
            hit = self.cache.get(name)
            if hit is None:
                hit = any(fnmatch.fnmatchcase(name.lower(), p) for p in self.patterns)
                if len(self.cache) < 10_000:
                    self.cache[name] = hit
            if hit:
                return True
        return False


class Spool:
    """One writer's spool file. Points are buffered, merged per (step, time) and appended in batches: every
    batch is one ``os.write`` of complete lines on an ``O_APPEND`` fd. A write error (a full disk) drops the
    batch and, if it can, leaves one event saying so; it never raises.

    ``watch``: a point naming a watched metric makes the buffer due at once, and ``on_watched`` is called after
    the batch holding it is written (the shim wakes the server's ingester with it)."""

    def __init__(
        self,
        path: str,
        member: str,
        src: str,
        flush_seconds: float = FLUSH_SECONDS,
        flush_points: int = FLUSH_POINTS,
        clock: Callable[[], float] = time.monotonic,
        watch: Watch | None = None,
        on_watched: Callable[[], None] | None = None,
    ) -> None:
        self.path = path
        self.watch = watch or Watch()
        self.on_watched = on_watched
        self.watched = False  # a watched metric's point is in the buffer
        self.member = member
        self.src = src
        self.flush_seconds = flush_seconds
        self.flush_points = flush_points
        self.clock = clock
        self.fd = -1
        self.items: list[Any] = []  # [t, step, metrics] lists (points) or bytes (encoded events), in order
        self.points = 0
        self.last_flush = clock()
        self.failing = False  # the last write failed: the next good write starts with a newline
        self.dropped = 0
        self.writes = 0

    def add(self, t: float, step: int | None, metrics: dict[str, Value]) -> None:
        """Queue a point; merged into the previous one when it has the same step, is within a second of it
        and names other metrics (so that one step's metrics printed together make one line)."""
        if not metrics:
            return
        last = self.items[-1] if self.items else None
        if (
            isinstance(last, list)
            and last[1] == step
            and abs(t - last[0]) <= 1.0
            and len(last[2]) < 1000
            and not any(k in last[2] for k in metrics)
        ):
            last[2].update(metrics)
        else:
            self.items.append([t, step, dict(metrics)])
        self.points += len(metrics)
        if self.watch and not self.watched and self.watch.any(metrics):
            self.watched = True

    def event(self, reason: str, message: str, t: float | None = None) -> None:
        self.items.append(encode_event(time.time() if t is None else t, reason, message, self.member))

    def due(self) -> bool:
        if not self.items:
            return False
        return self.watched or self.points >= self.flush_points or self.clock() - self.last_flush >= self.flush_seconds

    def flush(self) -> None:
        items, self.items, self.points = self.items, [], 0
        watched, self.watched = self.watched, False
        self.last_flush = self.clock()
        if not items:
            return
        lines: list[bytes] = []
        for item in items:
            if isinstance(item, bytes):
                lines.append(item)
            else:
                try:
                    lines.append(encode_point(item[0], item[1], self.member, item[2], self.src))
                except (TypeError, ValueError):
                    continue
        # Batches stay well under the size where a regular file's write could come back short.
        for start in range(0, len(lines), 2000):
            self._write(b"".join(lines[start : start + 2000]), len(lines[start : start + 2000]))
        if watched and self.on_watched is not None:
            try:
                self.on_watched()
            except Exception:
                pass  # a wake-up only: the server reads the file at its next pass anyway

    def _write(self, data: bytes, count: int) -> None:
        try:
            if self.fd < 0:
                # O_NOFOLLOW: the job can write this directory; a link it left here must not redirect the shim.
                self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o640)
            if self.failing:
                data = b"\n" + data  # ends whatever a failed write left half written
            view = memoryview(data)
            while view:
                written = os.write(self.fd, view)
                view = view[written:]
            self.writes += 1
            self.failing = False
        except OSError as exc:
            first = not self.failing
            self.failing = True
            self.dropped += count
            if first and self.fd >= 0:
                note = encode_event(time.time(), "MetricsDropped", f"metrics lost: {exc}", self.member)
                try:
                    os.write(self.fd, b"\n" + note)
                except OSError:
                    pass

    def close(self) -> None:
        self.flush()
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1

"""Metrics from a job without code changes: log extraction, TensorBoard event files and system samples.

Standard library only: the shim imports this (only when its config has ``"metrics"``) and runs it as
``python -I -S``. Everything here ends up as lines in *spool files* in the job's metrics directory, which the
server's ingester reads (complete lines only). One writer per file, named ``<src>-a<attempt>-<member>.jsonl``:

- points: ``{"t": 1764505801.25, "s": 120, "w": "worker0", "m": {"loss": 0.31}, "src": "log"}``
- events: ``{"t": 1764505801.25, "event": "MetricsLagging", "message": "...", "w": "worker0"}``

The pieces are pure and unit-tested on their own: ``recognize`` (built-in recognition of progress lines),
``Extractor`` (built-in plus custom patterns over a stream of lines, with carried-over steps and lookahead
windows), ``Spool`` (batched appends). ``Metrics`` runs them as daemon threads next to the shim's main loop:
a log tail (reading the job's log file at its own pace, so a flood only makes extraction lag), a TensorBoard
poller and a system sampler.
"""

from __future__ import annotations

import calendar
import json
import math
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

MAX_LINE = 65536  # longer log lines are cut here before extraction
MAX_NAME = 200
MAX_TEXT = 1000  # a text metric's value is cut here
LAG_BYTES = 8 * 1024 * 1024  # backlog of unread log that makes extraction "lagging"
CAUGHT_UP_BYTES = 1024 * 1024  # ... and below which it has caught up again
FLUSH_SECONDS = 0.5
FLUSH_POINTS = 1000
DRAIN_SECONDS = 5.0  # how long the exit record waits for the drain of what is left of the log
DRAIN_LIMIT_SECONDS = 600.0  # how long the drain goes on after it (marked by a draining-* file); then it gives up
DRAINING_PREFIX = "draining-"  # the marker file: "draining-a<attempt>-<member>" in the metrics directory
IDLE_WINDOW_SECONDS = 2.0  # with no new log line for this long, pending lookahead windows are matched as they are
READ_CHUNK = 128 * 1024
BUSY_BYTES = 1024 * 1024  # a backlog this big means the job is printing fast: extraction backs off more

Number = float
Value = float | str
Point = tuple[float, int | None, dict[str, Value]]


# -- encoding -----------------------------------------------------------------------------------------------


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


def encode_point(t: float, step: int | None, member: str, metrics: dict[str, Value], src: str) -> bytes:
    m = {clean_name(k): clean_value(v) for k, v in metrics.items()}
    line = {"t": t, "s": step, "w": member, "m": m, "src": src}
    return json.dumps(line, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode() + b"\n"


def encode_event(t: float, reason: str, message: str, member: str) -> bytes:
    line = {"t": t, "event": reason, "message": message[:2000], "w": member}
    return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def safe_member(member: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", member) or "worker0"


def spool_path(directory: str, src: str, attempt: object, member: str) -> str:
    return os.path.join(directory, f"{src}-a{attempt}-{safe_member(member)}.jsonl")


class Spool:
    """One writer's spool file. Points are buffered, merged per (step, time) and appended in batches: every
    batch is one ``os.write`` of complete lines on an ``O_APPEND`` fd. A write error (a full disk) drops the
    batch and, if it can, leaves one event saying so; it never raises."""

    def __init__(
        self,
        path: str,
        member: str,
        src: str,
        flush_seconds: float = FLUSH_SECONDS,
        flush_points: int = FLUSH_POINTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
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

    def event(self, reason: str, message: str, t: float | None = None) -> None:
        self.items.append(encode_event(time.time() if t is None else t, reason, message, self.member))

    def due(self) -> bool:
        if not self.items:
            return False
        return self.points >= self.flush_points or self.clock() - self.last_flush >= self.flush_seconds

    def flush(self) -> None:
        items, self.items, self.points = self.items, [], 0
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

    def _write(self, data: bytes, count: int) -> None:
        try:
            if self.fd < 0:
                self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
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


# -- built-in recognition -----------------------------------------------------------------------------------

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?%?|[-+]?(?i:nan|inf(?:inity)?)(?![\w.])"
# A key: a word starting with a letter or "_" (checked right after its first character to be the start of a
# word, which keeps the scan linear), optionally a second word ("Train Loss"); the words are possessive.
_KEY = r"(?>[A-Za-z_])(?<![\w./-].)[\w./-]*+(?:[ ][A-Za-z][\w./-]*+)?"
_NEXT_KEY = r"['\"]?[A-Za-z_][\w./-]*+(?:[ ][A-Za-z][\w./-]*+)?['\"]?(?:\s*=|:\s)"
# What may follow a value: the end, a delimiter, or whitespace and then a non-word character or the next key.
_AFTER = rf"(?=\s*$|[,;](?!\d)|\s*[|)\]}}'\"]|\.(?:\s|$)|\s+(?:[^\sA-Za-z0-9_]|{_NEXT_KEY}))"
PAIR = re.compile(rf"(?P<key>{_KEY})(?P<sep>\s*=\s*|:\s+|:)(?P<val>{_NUMBER}){_AFTER}")
# Quoted keys ({'loss': 0.5} as Python prints a dict) lose their quotes before PAIR runs.
_QUOTED_KEY = re.compile(r"(['\"])([A-Za-z_][\w./-]*(?: [A-Za-z][\w./-]*)?)\1(?=\s*(?:=|:\s))")
_FLOATISH = re.compile(r"[.eEnN]")
MARKER = re.compile(
    r"(?i)(?<![\w./-])(?P<key>global[_ ]step|step|epoch|iteration|iter)"
    r"\s*(?:[:=#]\s*)?\[?\s*(?P<val>\d+)(?:\s*/\s*\d+)?\s*\]?(?![\w.%/])"
)
_HINT = re.compile(r"[=:]|(?i:step|epoch|iter)")
_HINT_BYTES = re.compile(rb"[=:]|(?i:step|epoch|iter)")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
STEP_PRIORITY = {"global_step": 0, "step": 1, "iteration": 2, "iter": 3, "epoch": 4}


def _key_name(key: str) -> str:
    return key.lower().replace(" ", "_")


def parse_number(text: str) -> float | None:
    """A number token as a float ("91%" → 91.0, "3e-4", "nan"); None when the text is not one number."""
    s = text.strip()
    if s.endswith("%"):
        s = s[:-1]
    if not s or len(s) > 100:
        return None
    try:
        return float(s)
    except ValueError:
        return None


def clean_text(text: str) -> str:
    """What a terminal would show of a line: the last carriage-return segment, without ANSI escapes."""
    if "\r" in text:
        parts = [p for p in text.split("\r") if p.strip()]
        text = parts[-1] if parts else ""
    if _CONTROL.search(text):
        text = _ANSI.sub("", text)
    return text


# A line that is nothing but ``key=number`` tokens separated by blanks (``step=120 loss=0.31 lr=0.001``, the
# commonest progress line) is split instead of scanned: the same result as PAIR and MARKER, several times faster.
_PLAIN_LINE = re.compile(r"[ \t]*(?:[A-Za-z_]\w*=[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?:[ \t]+|$))+")
_MARKER_NAMES = {"global_step", "step", "epoch", "iteration", "iter"}


def _recognize_plain(text: str) -> tuple[int | None, dict[str, float | str]]:
    metrics: dict[str, float | str] = {}
    markers: list[tuple[int, int, int, str]] = []  # (priority, value, position, name)
    for position, token in enumerate(text.split()):
        key, _, val = token.partition("=")
        name = key.lower()
        if name in _MARKER_NAMES and val.isdigit():
            markers.append((STEP_PRIORITY[name], int(val), position, name))
        else:
            number = float(val)
            metrics[name] = number if math.isfinite(number) else clean_value(number)
    if not markers:
        return None, metrics
    markers.sort()
    for _, value, _, name in markers[1:]:
        if name != markers[0][3]:
            metrics.setdefault(name, float(value))
    return markers[0][1], metrics


def recognize(text: str) -> tuple[int | None, dict[str, float | str]]:
    """Built-in recognition of one progress line: (step marker or None, metrics).

    ``key=value`` / ``key: value`` pairs whose key looks like an identifier (or two words, ``Train Loss: 0.5``,
    with a colon) and whose value is a number token on its own; step/epoch/iteration markers give the step.
    A line with both a step and an epoch keeps the epoch as a metric.
    """
    if _PLAIN_LINE.fullmatch(text):
        return _recognize_plain(text)
    return _recognize_scan(text)


def _recognize_scan(text: str) -> tuple[int | None, dict[str, float | str]]:
    if not _HINT.search(text):
        return None, {}
    if "'" in text or '"' in text:
        text = _QUOTED_KEY.sub(r"\2", text)
    markers: list[tuple[int, int, int, int, str]] = []  # (priority, value, start, end, name)
    lower = text.lower()
    if "step" in lower or "epoch" in lower or "iter" in lower:
        for m in MARKER.finditer(text):
            name = _key_name(m.group("key"))
            markers.append((STEP_PRIORITY.get(name, 9), int(m.group("val")), m.start(), m.end(), name))
    metrics: dict[str, float | str] = {}
    if "=" not in text and ":" not in text:
        return (min(markers)[1] if markers else None), metrics
    for m in PAIR.finditer(text):
        start, end = m.span()
        if markers and any(start < mend and mstart < end for _, _, mstart, mend, _ in markers):
            continue  # the pair is a step marker ("step=120", "Train Epoch: 1")
        key, sep, val = m.group("key"), m.group("sep"), m.group("val")
        if " " in key and "=" in sep:
            key = key.rsplit(" ", 1)[1]  # "a b=1": only "b" is the key
        key = key.rstrip("./-")
        if sep == ":" and not _FLOATISH.search(val):
            continue  # "host:8080" is no metric; "loss:0.25" is
        number = parse_number(val)
        if number is None:
            continue
        metrics[_key_name(key)] = number if math.isfinite(number) else clean_value(number)
    step = None
    if markers:
        markers.sort()
        step = markers[0][1]
        for _, value, _, _, name in markers[1:]:
            if name != markers[0][4]:
                metrics.setdefault(name, float(value))
    return step, metrics


# -- the extractor ------------------------------------------------------------------------------------------


class Pattern:
    def __init__(self, index: int, spec: dict) -> None:
        self.index = index
        self.source = str(spec.get("regex") or "")
        self.regex = re.compile(self.source)
        lines = spec.get("lines") or 1
        self.lines = max(1, min(20, int(lines)))
        groups = set(self.regex.groupindex)
        step = spec.get("step")
        if step:
            self.step_group = str(step) if str(step) in groups else None
        else:
            self.step_group = next((g for g in ("step", "epoch", "iteration", "iter") if g in groups), None)
        self.enabled = True

    def label(self) -> str:
        return f"pattern {self.index + 1} ({self.source[:80]!r})"


class _Stream:
    """Per-process state (a multi-process worker's lines carry ``[rank] ``): the carried step and the lines
    still waiting for their lookahead windows."""

    def __init__(self, patterns: list[Pattern]) -> None:
        self.step: int | None = None
        self.count = 0  # index of the next line
        self.lines: deque[tuple[int, float, str, int | None]] = deque()  # (index, t, text, step at that line)
        self.next_start = [0] * len(patterns)
        self.last_line = time.monotonic()


_RANK = re.compile(r"^\[(\d+)\] ")


class Extractor:
    """Turns log lines into points: built-in recognition plus custom patterns (with lookahead windows)."""

    def __init__(
        self,
        builtin: bool = True,
        patterns: Iterable[dict] = (),
        on_event: Callable[[str, str], None] | None = None,
    ) -> None:
        self.builtin = builtin
        self.on_event = on_event or (lambda reason, message: None)
        self.patterns: list[Pattern] = []
        for i, spec in enumerate(patterns or ()):
            try:
                self.patterns.append(Pattern(i, spec))
            except (re.error, TypeError, ValueError, OverflowError) as exc:
                self.on_event("MetricsExtractionError", f"pattern {i + 1}: invalid: {exc}; it is ignored")
        self.max_lines = max((p.lines for p in self.patterns), default=1)
        self.streams: dict[str, _Stream] = {}
        self.reported: set[tuple[int, str]] = set()

    def feed(self, t: float, text: str) -> list[Point]:
        """One line of the job's output (without its log prefix); returns the points it completes."""
        if len(text) > MAX_LINE:
            text = text[:MAX_LINE]
        key = ""
        if text.startswith("["):
            m = _RANK.match(text)
            if m:
                key, text = m.group(1), text[m.end() :]
        text = clean_text(text)
        stream = self.streams.get(key)
        if stream is None:
            stream = self.streams[key] = _Stream(self.patterns)
        stream.last_line = time.monotonic()
        out: list[Point] = []
        if self.builtin:
            try:
                step, metrics = recognize(text)
            except Exception:  # never let one odd line stop extraction
                step, metrics = None, {}
            if step is not None:
                stream.step = step
            if metrics:
                out.append((t, stream.step, metrics))
        if self.patterns:
            stream.lines.append((stream.count, t, text, stream.step))
            stream.count += 1
            self._windows(stream, out, final=False)
        return out

    def flush(self, idle_only: bool = False) -> list[Point]:
        """Match the windows still waiting for lines with what there is (at the end, or after a quiet spell)."""
        out: list[Point] = []
        now = time.monotonic()
        for stream in self.streams.values():
            if stream.lines and (not idle_only or now - stream.last_line >= IDLE_WINDOW_SECONDS):
                self._windows(stream, out, final=True)
        return out

    def _windows(self, stream: _Stream, out: list[Point], final: bool) -> None:
        last = stream.count - 1
        lines = stream.lines
        first_index = lines[0][0] if lines else stream.count
        for n, pattern in enumerate(self.patterns):
            while stream.next_start[n] <= last and (final or stream.next_start[n] + pattern.lines - 1 <= last):
                start = stream.next_start[n]
                stream.next_start[n] += 1
                if not pattern.enabled or start < first_index:
                    continue
                offset = start - first_index
                window = [lines[i] for i in range(offset, min(len(lines), offset + pattern.lines))]
                self._match(pattern, window, stream, out)
        keep = min(stream.next_start) if stream.next_start else stream.count
        while lines and lines[0][0] < keep:
            lines.popleft()

    def _match(
        self, pattern: Pattern, window: list[tuple[int, float, str, int | None]], stream: _Stream, out: list[Point]
    ) -> None:
        first = window[0][2]
        text = "\n".join(line[2] for line in window) if len(window) > 1 else first
        t, carried = window[0][1], window[0][3]
        try:
            for m in pattern.regex.finditer(text):
                if m.start() > len(first):
                    break
                if m.end() == m.start():
                    continue
                step = carried
                metrics: dict[str, Value] = {}
                for group, raw in m.groupdict().items():
                    if raw is None:
                        continue
                    if group == pattern.step_group:
                        value = parse_number(raw)
                        if value is not None and math.isfinite(value) and value == int(value):
                            step = int(value)
                            stream.step = step
                        else:
                            self._report(
                                pattern, group, f"the step group {group!r} matched {raw[:80]!r}, not an integer"
                            )
                        continue
                    number = parse_number(raw)
                    if number is None:
                        metrics[group] = raw.strip()[:MAX_TEXT]
                        self._report(
                            pattern, group, f"group {group!r} matched {raw[:80]!r}, not a number: kept as text"
                        )
                    else:
                        metrics[group] = clean_value(number)
                if metrics:
                    out.append((t, step, metrics))
        except Exception as exc:  # a pattern that fails at run time is switched off, once
            pattern.enabled = False
            self.on_event(
                "MetricsExtractionError", f"{pattern.label()} failed ({type(exc).__name__}: {exc}); it is switched off"
            )

    def _report(self, pattern: Pattern, group: str, message: str) -> None:
        if (pattern.index, group) not in self.reported:
            self.reported.add((pattern.index, group))
            self.on_event("MetricsExtractionError", f"{pattern.label()}: {message}")


# -- the job's log ------------------------------------------------------------------------------------------

_time_cache: dict[str, float] = {}


def log_time(stamp: str) -> float | None:
    """``2026-11-30T12:30:01.123456Z`` → epoch seconds (the shim's log timestamp)."""
    base = stamp[:19]
    seconds = _time_cache.get(base)
    if seconds is None:
        try:
            seconds = float(calendar.timegm(time.strptime(base, "%Y-%m-%dT%H:%M:%S")))
        except ValueError:
            return None
        if len(_time_cache) > 4:
            _time_cache.clear()
        _time_cache[base] = seconds
    frac = stamp[20:26]
    return seconds + int(frac) / 1e6 if frac.isdigit() else seconds


class LogTail:
    """Reads the job's log file from an offset, picks this member's O/E lines and feeds the extractor."""

    def __init__(self, path: str, offset: int, member_tag: str, extractor: Extractor, spool: Spool) -> None:
        self.path = path
        self.pos = offset
        self.tag = member_tag.encode()
        self.extractor = extractor
        self.spool = spool
        self.fd = -1
        self.partial = b""
        self.skipping = False  # inside a line longer than MAX_LINE: the rest of it is dropped
        self.lagging = False
        self.lag_bytes = LAG_BYTES

    def size(self) -> int:
        try:
            return os.stat(self.path).st_size
        except OSError:
            return self.pos

    def read_chunk(self, limit: int = READ_CHUNK) -> int:
        """Process up to ``limit`` bytes of new log; returns how many were read (0: nothing new)."""
        if self.fd < 0:
            try:
                self.fd = os.open(self.path, os.O_RDONLY)
            except OSError:
                return 0
        try:
            data = os.pread(self.fd, limit, self.pos)
        except OSError:
            return 0
        if not data:
            return 0
        self.pos += len(data)
        lines = data.split(b"\n")
        tail = lines.pop()
        if lines:
            first = lines[0]
            if self.skipping:
                lines[0] = b""
                self.skipping = False
            else:
                lines[0] = self.partial + first
            self.partial = b""
            for line in lines:
                if line:
                    self.line(line)
        if self.skipping:
            return len(data)
        self.partial += tail
        if len(self.partial) > MAX_LINE + 100:
            self.line(self.partial[: MAX_LINE + 100])
            self.partial = b""
            self.skipping = True
        return len(data)

    def line(self, raw: bytes) -> None:
        parts = raw.split(b" ", 2)
        if len(parts) < 3:
            return
        stream, _, member = parts[1].partition(b"@")
        if member != self.tag or stream not in (b"O", b"E"):
            return
        if not self.extractor.patterns and not _HINT_BYTES.search(parts[2]):
            return  # nothing built-in recognition could take (most lines of a flood)
        t = log_time(parts[0].decode("ascii", "replace")) or time.time()
        text = parts[2][: MAX_LINE + 100].decode("utf-8", "replace")
        for pt, step, metrics in self.extractor.feed(t, text):
            self.spool.add(pt, step, metrics)

    def check_lag(self) -> int:
        """Write MetricsLagging / MetricsCaughtUp as the backlog crosses the thresholds; returns the backlog."""
        backlog = self.size() - self.pos
        if not self.lagging and backlog > self.lag_bytes:
            self.lagging = True
            self.spool.event(
                "MetricsLagging",
                f"metrics extraction is {backlog / 1048576:.1f} MiB behind the log; it catches up at its own pace",
            )
        elif self.lagging and backlog < min(CAUGHT_UP_BYTES, self.lag_bytes // 2):
            self.lagging = False
            self.spool.event("MetricsCaughtUp", "metrics extraction caught up with the log")
        return backlog

    def finish(self) -> None:
        if self.partial and not self.skipping:
            self.line(self.partial)
        self.partial = b""
        for t, step, metrics in self.extractor.flush():
            self.spool.add(t, step, metrics)
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


# -- system metrics -----------------------------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _proc_stat(pid: int) -> tuple[int, int, int] | None:
    """(utime + stime ticks, start time ticks, rss pages) of a process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        fields = stat[stat.rfind(b")") + 2 :].split()
        return int(fields[11]) + int(fields[12]), int(fields[19]), int(fields[21])
    except (OSError, IndexError, ValueError):
        return None


class Nvml:
    """The few NVML calls needed, through ctypes; ``load()`` is None where there is no NVIDIA driver."""

    def __init__(self, lib: Any) -> None:
        import ctypes

        self.ctypes = ctypes
        self.lib = lib

        class Utilization(ctypes.Structure):
            _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]

        class Memory(ctypes.Structure):
            _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

        self.Utilization = Utilization
        self.Memory = Memory
        self.handles: dict[str, Any] = {}

    @classmethod
    def load(cls) -> Nvml | None:
        try:
            import ctypes

            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return None
        except (OSError, AttributeError):
            return None
        return cls(lib)

    def handle(self, device: str) -> Any:
        if device in self.handles:
            return self.handles[device]
        ctypes = self.ctypes
        handle = ctypes.c_void_p()
        if device.isdigit():
            rc = self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(int(device)), ctypes.byref(handle))
        else:
            rc = self.lib.nvmlDeviceGetHandleByUUID(ctypes.c_char_p(device.encode()), ctypes.byref(handle))
        self.handles[device] = handle if rc == 0 else None
        return self.handles[device]

    def sample(self, device: str) -> dict[str, float]:
        out: dict[str, float] = {}
        handle = self.handle(device)
        if handle is None:
            return out
        util = self.Utilization()
        if self.lib.nvmlDeviceGetUtilizationRates(handle, self.ctypes.byref(util)) == 0:
            out["util_percent"] = float(util.gpu)
        memory = self.Memory()
        if self.lib.nvmlDeviceGetMemoryInfo(handle, self.ctypes.byref(memory)) == 0:
            out["memory_bytes"] = float(memory.used)
        return out


def visible_gpus(env: dict) -> list[str]:
    value = str(env.get("CUDA_VISIBLE_DEVICES") or "").strip()
    if not value or value in ("-1", "NoDevFiles", "none"):
        return []
    return [d.strip() for d in value.split(",") if d.strip()]


class SystemSampler:
    """CPU (percent of one core, summed over the job's processes), RSS and per-GPU utilisation and memory."""

    def __init__(self, tree: Callable[[], list[int]], gpus: list[str], nvml: Nvml | None = None) -> None:
        self.tree = tree
        self.gpus = gpus
        self.nvml = nvml
        self.prev: dict[tuple[int, int], int] = {}  # (pid, start ticks) → cpu ticks at the previous sample
        self.prev_time: float | None = None

    def sample(self) -> dict[str, float]:
        now = time.monotonic()
        ticks: dict[tuple[int, int], int] = {}
        rss = 0
        for pid in self.tree():
            stat = _proc_stat(pid)
            if stat is not None:
                ticks[(pid, stat[1])] = stat[0]
                rss += stat[2] * PAGE_SIZE
        out: dict[str, float] = {"system/rss_bytes": float(rss)}
        if self.prev_time is not None and now > self.prev_time:
            used = sum(value - self.prev.get(key, 0) for key, value in ticks.items())
            out["system/cpu_percent"] = round(max(0.0, used / CLK_TCK / (now - self.prev_time) * 100.0), 2)
        self.prev, self.prev_time = ticks, now
        if self.nvml is not None:
            for i, device in enumerate(self.gpus):
                try:
                    for name, value in self.nvml.sample(device).items():
                        out[f"system/gpu{i}/{name}"] = value
                except Exception:
                    pass
        return out


# -- running it next to the shim ----------------------------------------------------------------------------


def _tbreader() -> Any:
    if __package__:
        from kiln.runtime import tbreader
    else:
        import tbreader  # type: ignore[no-redef]  # run by the shim as a script: its directory is on sys.path
    return tbreader


class Metrics:
    """The shim's metrics threads for one attempt, from ``cfg["metrics"]``:
    ``{"dir", "builtin", "patterns", "tensorboard_dir", "system", "system_interval"}``."""

    def __init__(self, cfg: dict, tree: Callable[[], list[int]], log_offset: int) -> None:
        mc = cfg["metrics"]
        self.dir = str(mc["dir"])
        self.attempt = cfg.get("attempt", 1)
        self.member = cfg.get("log_tag") or "worker0"
        self.cfg = cfg
        self.mc = mc
        self.tree = tree
        self.log_offset = log_offset
        self.stop_event = threading.Event()
        self.deadline = float("inf")  # when stopping: the drain ends here (monotonic)
        self.threads: list[threading.Thread] = []
        self.tail: LogTail | None = None

    def spool(self, src: str) -> Spool:
        return Spool(spool_path(self.dir, src, self.attempt, self.member), self.member, src)

    def start(self) -> None:
        try:
            os.makedirs(self.dir, exist_ok=True)
        except OSError:
            pass
        mc = self.mc
        if mc.get("builtin", True) or mc.get("patterns"):
            self._thread("kiln-metrics-log", self._run_log)
        if mc.get("tensorboard_dir"):
            self._thread("kiln-metrics-tb", self._run_tb)
        if mc.get("system"):
            self._thread("kiln-metrics-sys", self._run_sys)

    def _thread(self, name: str, target: Callable[[], None]) -> None:
        def run() -> None:
            try:
                target()
            except BaseException:
                pass  # metrics never take the shim down

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

    def stop(self, timeout: float = DRAIN_SECONDS, limit: float = DRAIN_LIMIT_SECONDS) -> bool:
        """Ask the threads to drain what is left and stop; they give up ``limit`` seconds from now (what is still
        unread then is reported lost). Waits at most ``timeout`` seconds; True when they are done by then (else
        ``wait`` waits for the rest)."""
        start = time.monotonic()
        self.deadline = start + max(timeout, limit)
        self.stop_event.set()
        for thread in self.threads:
            thread.join(max(0.0, start + timeout - time.monotonic()))
        return not any(thread.is_alive() for thread in self.threads)

    def wait(self) -> None:
        """After ``stop``: until the drain ends (by its deadline, whatever happens)."""
        for thread in self.threads:
            thread.join(max(0.0, self.deadline + 0.5 - time.monotonic()))

    def draining_marker(self) -> str:
        """The file that tells the server's ingester this attempt's spool files are still growing after its
        exit record (the drain goes on); removed when the drain ends."""
        return os.path.join(self.dir, f"{DRAINING_PREFIX}a{self.attempt}-{safe_member(self.member)}")

    # -- the threads --

    def _run_log(self) -> None:
        mc = self.mc
        spool = self.spool("log")
        extractor = Extractor(bool(mc.get("builtin", True)), mc.get("patterns") or (), on_event=spool.event)
        tail = self.tail = LogTail(
            self.cfg["log_path"], self.log_offset, self.cfg.get("log_tag") or "", extractor, spool
        )
        if isinstance(mc.get("lag_bytes"), int):
            tail.lag_bytes = mc["lag_bytes"]
        stopping_at: int | None = None  # the log's size when the stop came: the drain reads up to there
        last_size = tail.size()
        try:
            while True:
                if stopping_at is None and self.stop_event.is_set():
                    stopping_at = tail.size()
                if stopping_at is not None:
                    if tail.pos >= stopping_at:
                        break
                    if time.monotonic() >= self.deadline:
                        left = stopping_at - tail.pos
                        spool.event(
                            "MetricsIncomplete",
                            f"the attempt ended with {left} bytes of its log not yet read for metrics; "
                            "their metrics are lost",
                        )
                        break
                began = time.monotonic()
                got = tail.read_chunk()
                backlog = tail.check_lag()
                printing = tail.pos + backlog > last_size  # the job's output is still coming in
                last_size = tail.pos + backlog
                if spool.due():
                    spool.flush()
                if got:
                    if stopping_at is None and printing:
                        # Leave the interpreter to the shim's main loop, which copies the job's output: more so
                        # while the job floods the log (extraction cannot keep up then anyway). Not when the job
                        # has gone quiet (nothing to copy) nor when draining.
                        share = 2.0 if backlog > BUSY_BYTES else 0.25
                        time.sleep(min(0.05, (time.monotonic() - began) * share))
                    continue
                for t, step, metrics in extractor.flush(idle_only=True):
                    spool.add(t, step, metrics)
                if stopping_at is None:
                    self.stop_event.wait(0.2)
        finally:
            tail.finish()
            if tail.lagging and tail.pos >= tail.size():
                spool.event("MetricsCaughtUp", "metrics extraction caught up with the log")
            spool.close()

    def _run_tb(self) -> None:
        tbreader = _tbreader()
        root = str(self.mc["tensorboard_dir"])
        if not os.path.isabs(root):
            root = os.path.join(self.cfg.get("work_dir") or ".", root)
        spool = self.spool("tb")
        follower = tbreader.DirectoryFollower(root)
        reported: set[str] = set()
        try:
            while True:
                final = self.stop_event.is_set()
                for wall_time, step, name, value in follower.poll(rescan=True, deadline=self.deadline):
                    spool.add(wall_time, step, {name: value})
                for path, problem in follower.problems():
                    if path not in reported:
                        reported.add(path)
                        spool.event("MetricsExtractionError", f"TensorBoard file {path}: {problem}")
                spool.flush()
                if final:
                    break
                self.stop_event.wait(1.0)
        finally:
            spool.close()

    def _run_sys(self) -> None:
        interval = self.mc.get("system_interval") or 5.0
        try:
            interval = max(0.1, float(interval))
        except (TypeError, ValueError):
            interval = 5.0
        gpus = visible_gpus(self.cfg.get("env") or {})
        sampler = SystemSampler(self.tree, gpus, Nvml.load() if gpus else None)
        spool = self.spool("sys")
        try:
            sampler.sample()  # the baseline for the CPU figure
            while not self.stop_event.wait(interval):
                values = sampler.sample()
                spool.add(time.time(), None, dict(values))
                spool.flush()
        finally:
            spool.close()

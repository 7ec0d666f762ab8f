"""Metrics from log lines: built-in recognition of progress lines (``recognize``) and the ``Extractor``, which
adds custom patterns over a stream of lines, with carried-over steps and lookahead windows.

Standard library only, like ``extract`` (which loads it; see there).
"""

from __future__ import annotations

import fnmatch
import math
import re
import time
from collections import deque
from collections.abc import Callable, Iterable

if __package__:
    from kiln.injob.spool import MAX_TEXT, Value, clean_value
else:  # run by the shim as a script: its directory is on sys.path
    from spool import MAX_TEXT, Value, clean_value  # type: ignore[no-redef]

MAX_LINE = 65536  # longer log lines are cut here before extraction
IDLE_WINDOW_SECONDS = 2.0  # with no new log line for this long, pending lookahead windows are matched as they are

Point = tuple[float, int | None, dict[str, Value]]


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
# Numbers a training script prints that say who or which run it is, not how training goes: a DDP script's
# `rank=0 world_size=2`, a process id, a seed. Each is a constant of its process; as metrics they would only add a
# flat line per worker. Built-in recognition leaves them out unless the spec's ``metrics.include`` names them.
NOT_METRICS = frozenset(
    {"rank", "global_rank", "local_rank", "node_rank", "group_rank", "world_size", "local_world_size", "pid", "seed"}
)
# A second step marker on a line is a metric only when it is the epoch (``Epoch [3/10], Step [100/600]``: step 100,
# epoch 3), as W&B and TensorBoard users log it to plot against; a second counter (``iter 50`` of an epoch next to
# ``global_step 250``) is a position, not a measurement.
SECONDARY_METRIC_MARKERS = frozenset({"epoch"})


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
        if name != markers[0][3] and name in SECONDARY_METRIC_MARKERS:
            metrics.setdefault(name, float(value))
    return markers[0][1], metrics


def recognize(text: str, skip: frozenset[str] = NOT_METRICS) -> tuple[int | None, dict[str, float | str]]:
    """Built-in recognition of one progress line: (step marker or None, metrics).

    ``key=value`` / ``key: value`` pairs whose key looks like an identifier (or two words, ``Train Loss: 0.5``,
    with a colon) and whose value is a number token on its own; step/epoch/iteration markers give the step.
    A line with both a step and an epoch keeps the epoch as a metric. Names in ``skip`` (by default the
    well-known non-metrics: ``rank``, ``world_size``, ``pid``, ``seed``, ...) are left out.
    """
    step, metrics = _recognize_plain(text) if _PLAIN_LINE.fullmatch(text) else _recognize_scan(text)
    if skip and not skip.isdisjoint(metrics):
        metrics = {name: value for name, value in metrics.items() if name not in skip}
    return step, metrics


class NameFilter:
    """Which names extraction from the log keeps: the spec's ``metrics.include`` and ``metrics.exclude``, lists of
    shell-style patterns (``loss``, ``val_*``, ``train/*``) matched without regard to case. With ``include``, only
    the names it matches are kept (the well-known non-metrics too, where it names them); without it, every name
    but the well-known non-metrics. ``exclude`` then drops what it matches."""

    def __init__(self, include: Iterable[str] = (), exclude: Iterable[str] = ()) -> None:
        self.include = tuple(str(p).lower() for p in include or ())
        self.exclude = tuple(str(p).lower() for p in exclude or ())
        # What built-in recognition leaves out before the patterns are looked at.
        self.skip = NOT_METRICS - {n for n in NOT_METRICS if self._matches(n, self.include)}
        self.active = bool(self.include or self.exclude)
        self.cache: dict[str, bool] = {}

    @staticmethod
    def _matches(name: str, patterns: tuple[str, ...]) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in patterns)

    def keeps(self, name: str) -> bool:
        kept = self.cache.get(name)
        if kept is None:
            lower = name.lower()
            kept = (not self.include or self._matches(lower, self.include)) and not self._matches(lower, self.exclude)
            if len(self.cache) < 10_000:  # a job printing ever new names must not grow this without end
                self.cache[name] = kept
        return kept

    def apply(self, metrics: dict[str, Value]) -> dict[str, Value]:
        if not self.active or not metrics:
            return metrics
        return {name: value for name, value in metrics.items() if self.keeps(name)}


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
            if name != markers[0][4] and name in SECONDARY_METRIC_MARKERS:
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
        include: Iterable[str] = (),
        exclude: Iterable[str] = (),
    ) -> None:
        self.builtin = builtin
        self.names = NameFilter(include, exclude)
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
                step, found = recognize(text, self.names.skip)
            except Exception:  # never let one odd line stop extraction
                step, found = None, {}
            if step is not None:
                stream.step = step
            metrics = self.names.apply(found)
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
                metrics = self.names.apply(metrics)
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

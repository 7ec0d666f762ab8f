"""Metrics ingestion: the spool-line parser, the batched writer and the background thread that tails the spool
files of jobs (``$KILN_HOME/jobs/<job_id>/metrics/*.jsonl``).

Exactly once: a batch's points and the new byte offset of every file it came from are committed in one
transaction (``metric_cursors``), so a server that stops anywhere resumes from the last committed offset.
Fair: every pass reads at most ``max_bytes_per_file`` from each file in turn (round robin), so a job that floods
metrics only delays the others by one slice. Only complete lines are consumed; a partial last line is read when
its newline has arrived.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import repeat
from json.scanner import make_scanner
from operator import itemgetter
from pathlib import Path
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    Connection,
    Float,
    Integer,
    Table,
    Text,
    and_,
    bindparam,
    case,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects import postgresql, sqlite

from kiln.db.models import Job, JobEvent, MetricChunk, MetricCursor, MetricPoint, MetricSeries, utcnow
from kiln.db.session import Database
from kiln.domain.states import TERMINAL_STATES, JobState

log = logging.getLogger(__name__)

SERIES = cast(Table, MetricSeries.__table__)
POINTS = cast(Table, MetricPoint.__table__)
CHUNKS = cast(Table, MetricChunk.__table__)
CURSORS = cast(Table, MetricCursor.__table__)
EVENTS = cast(Table, JobEvent.__table__)

CHUNK = 128  # points per M4 chunk summary (metric_chunks)
INSERT_ROWS = 150  # points per INSERT statement on SQLite (900 parameters: under the old limit of 999)
MAX_NAME = 200
MAX_WORKER = 64
SOURCES = frozenset({"sdk", "log", "tb", "sys", "api"})
NONFINITE = {"nan": "nan", "+nan": "nan", "-nan": "nan", "inf": "inf", "+inf": "inf", "infinity": "inf"}
NONFINITE |= {"+infinity": "inf", "-inf": "-inf", "-infinity": "-inf"}
INT64 = 2**63
SPOOL_ERROR = "MetricsSpoolError"
ACTIVE = [str(JobState.STARTING), str(JobState.RUNNING), str(JobState.RESTARTING)]
RECENT_AT_START = timedelta(days=7)  # at start, jobs that ended this recently are drained too
DRAINING_PREFIX = "draining-"  # a shim's marker: its spool files still grow after its exit record
DRAINING_STALE_SECONDS = 3700.0  # ... for at most this long (the shim's longest drain, 3600 s, and slack)
BUSY_POINTS = 5000  # a pass that stored at least this many points (a backlog) is followed by the next one soon
BUSY_WAIT = 0.05  # (rather than after the interval): long enough for what arrives meanwhile to make a batch

# A point as the writer takes it: (worker, name, source, step, time, value, text).
Row = tuple[str, str, str, int | None, float, float | None, str | None]


@dataclass
class Parsed:
    points: list[Row] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (member, reason, message)
    errors: int = 0
    first_error: str = ""

    def error(self, why: str) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = why


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        try:
            return float(value)
        except OverflowError:  # an integer beyond a double
            return math.inf if value > 0 else -math.inf
    return None


# The decoder's own scanner, without json.loads' wrapping around it.
_SCAN: Any = make_scanner(json.JSONDecoder())  # type: ignore[arg-type]


def parse_lines(data: bytes | str, parsed: Parsed | None = None) -> Parsed:
    """Parse complete spool lines (points and events). Malformed lines and unusable names are counted and
    skipped, never raised. Values: numbers (finite ones in ``value``; NaN and ±inf, as numbers or as the strings
    "nan"/"inf"/"-inf", in ``text``), other strings in ``text``."""
    parsed = parsed or Parsed()
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    loads, scan = json.loads, _SCAN
    append = parsed.points.append
    for line in text.split("\n"):
        # A line as the SDK writes it is one JSON value with nothing around it: the scanner alone reads it (half
        # the cost of json.loads). Anything else (whitespace around it, trailing data, not JSON) gets json.loads'
        # own verdict.
        try:
            obj, end = scan(line, 0)
            if end != len(line):
                raise ValueError
        except (StopIteration, ValueError, RecursionError):
            if not line.strip():
                continue
            try:
                obj = loads(line)
            except (ValueError, RecursionError):
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
        for name, raw in metrics.items():
            if not 0 < len(name) <= MAX_NAME:
                parsed.error("metric name empty or longer than 200 characters")
                continue
            kind = type(raw)
            if kind is float:
                if raw - raw == 0.0:  # finite (NaN and the infinities give NaN)
                    append((worker, name, src, step, t, raw, None))
                else:
                    append((worker, name, src, step, t, None, str(raw)))
            elif kind is int or kind is bool:
                try:
                    number = float(raw)
                except OverflowError:  # an integer beyond a double: the infinity of its sign
                    append((worker, name, src, step, t, None, "inf" if raw > 0 else "-inf"))
                    continue
                append((worker, name, src, step, t, number, None))
            elif kind is str:
                special = NONFINITE.get(raw.strip().lower())
                append((worker, name, src, step, t, None, special or raw[:10000]))
            else:
                parsed.error(f"metric {name[:40]!r}: value is neither a number nor a string")
    return parsed


def complete_lines(data: bytes) -> int:
    """How many leading bytes of ``data`` are complete lines (up to and including the last newline)."""
    return data.rfind(b"\n") + 1


def _is_scalar(row: Row) -> bool:
    return row[5] is not None or (row[6] is not None and row[6] in ("nan", "inf", "-inf"))


@dataclass
class CursorUpdate:
    job_id: str
    file: str
    offset: int
    errors: int  # new malformed lines in this batch
    first_error: str = ""


@dataclass
class _FileState:
    offset: int = 0
    errors: int = 0
    reported: bool = False


class MetricsStore:
    """Writes parsed batches: series (created on first sight), points, chunk summaries, cursors and events, all
    in one transaction per batch. Shared by the ingester thread and the HTTP route."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._series: dict[tuple[str, str, str], tuple[int, str]] = {}  # (job, worker, name) -> (id, axis)
        self._lock = threading.Lock()
        self._merge_stmt: Any = None  # the chunk-merging upsert, built on first use
        self.points_ingested = 0  # since start, both paths (Prometheus)

    def _dialect_insert(self, table: Table) -> Any:
        return postgresql.insert(table) if self.db.dialect == "postgresql" else sqlite.insert(table)

    def write(
        self,
        batches: Iterable[tuple[str, Parsed, bool]],
        cursors: Sequence[CursorUpdate] = (),
        files: dict[tuple[str, str], _FileState] | None = None,
    ) -> int:
        """Store ``(job_id, parsed, is_gang)`` batches and advance ``cursors``, atomically. Returns the points
        stored. ``files`` (the ingester's cursor cache) is updated after the commit."""
        batches = list(batches)
        with self._lock, self.db.transaction() as s:
            conn = s.connection()
            new_series: dict[tuple[str, str, str], tuple[int, str]] = {}
            stored = 0
            for job_id, parsed, gang in batches:
                if parsed.points:
                    stored += self._write_points(conn, job_id, parsed.points, new_series)
                if parsed.events:
                    now = utcnow()
                    conn.execute(
                        insert(EVENTS),
                        [
                            {
                                "job_id": job_id,
                                "time": now,
                                "reason": reason[:64],
                                "message": f"[{member}] {message}" if gang else message,
                            }
                            for member, reason, message in parsed.events
                        ],
                    )
            reported: list[tuple[str, str, int]] = []
            for cur in cursors:
                state = files.get((cur.job_id, cur.file)) if files is not None else None
                total = (state.errors if state else 0) + cur.errors
                report = total > 0 and not (state and state.reported)
                self._advance(conn, cur, total, report or bool(state and state.reported))
                if report:
                    reported.append((cur.job_id, cur.file, total))
                    conn.execute(
                        insert(EVENTS),
                        {
                            "job_id": cur.job_id,
                            "time": utcnow(),
                            "reason": SPOOL_ERROR,
                            "message": f"{cur.file}: {total} malformed line(s) skipped"
                            + (f" (first: {cur.first_error})" if cur.first_error else ""),
                        },
                    )
        # Committed: now the caches may learn what the database knows.
        self._series.update(new_series)
        if files is not None:
            for cur in cursors:
                state = files.setdefault((cur.job_id, cur.file), _FileState())
                state.offset = cur.offset
                state.errors += cur.errors
                if any(r[0] == cur.job_id and r[1] == cur.file for r in reported):
                    state.reported = True
        self.points_ingested += stored
        return stored

    def _advance(self, conn: Connection, cur: CursorUpdate, errors: int, reported: bool) -> None:
        row = {
            "job_id": cur.job_id,
            "file": cur.file,
            "offset": cur.offset,
            "errors": errors,
            "reported": reported,
            "updated_at": utcnow(),
        }
        stmt = self._dialect_insert(CURSORS).values(row)
        conn.execute(
            stmt.on_conflict_do_update(
                index_elements=["job_id", "file"],
                set_={k: stmt.excluded[k] for k in ("offset", "errors", "reported", "updated_at")},
            )
        )

    def _series_ids(
        self,
        conn: Connection,
        job_id: str,
        groups: dict[tuple[str, str], list[Row]],
        new_series: dict[tuple[str, str, str], tuple[int, str]],
    ) -> dict[tuple[str, str], tuple[int, str]]:
        found: dict[tuple[str, str], tuple[int, str]] = {}
        missing: list[tuple[str, str]] = []
        for key in groups:
            full = (job_id, *key)
            hit = self._series.get(full) or new_series.get(full)
            if hit is not None:
                found[key] = hit
            else:
                missing.append(key)
        if missing:
            now = utcnow()
            values = []
            for worker, name in missing:
                first = groups[(worker, name)][0]  # the series' first point decides its kind, source and axis
                values.append(
                    {
                        "job_id": job_id,
                        "worker": worker,
                        "name": name,
                        "kind": "scalar" if _is_scalar(first) else "text",
                        "source": first[2],
                        "axis": "step" if first[3] is not None else "time",
                        "count": 0,
                        "created_at": now,
                    }
                )
            conn.execute(self._dialect_insert(SERIES).on_conflict_do_nothing(), values)
            c = SERIES.c
            for start in range(0, len(missing), 500):
                part = missing[start : start + 500]
                result = conn.execute(
                    select(c.id, c.worker, c.name, c.axis).where(
                        c.job_id == job_id,
                        or_(*[and_(c.worker == w, c.name == n) for w, n in part]),
                    )
                )
                for sid, worker, name, axis in result:
                    found[(worker, name)] = (sid, axis)
                    new_series[(job_id, worker, name)] = (sid, axis)
        return found

    def _write_points(
        self,
        conn: Connection,
        job_id: str,
        rows: list[Row],
        new_series: dict[tuple[str, str, str], tuple[int, str]],
    ) -> int:
        """A job's points: each series' running totals advanced (which also hands out the points' ``seq``), the
        points inserted and the chunk summaries merged. Column lists per series, so that the per-point work is
        done by C builtins (list comprehensions, min/max/index over slices, slice assignment); the series update
        is one statement built once (no SQL compiled per series per batch)."""
        groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
        for key, row in zip(map(_KEY, rows), rows, strict=True):
            groups[key].append(row)
        ids = self._series_ids(conn, job_id, groups, new_series)
        columns: list[tuple[int, int, list[Any], list[Any], list[Any], list[Any]]] = []
        chunks: list[dict[str, Any]] = []
        for key, group in groups.items():
            sid, axis = ids[key]
            n = len(group)
            steps: list[Any] = [r[3] for r in group]
            times: list[Any] = [r[4] for r in group]
            values: list[Any] = [r[5] for r in group]
            texts: list[Any] = [r[6] for r in group]
            all_finite = None not in values
            finite = values if all_finite else [v for v in values if v is not None]
            all_steps = None not in steps
            first_step = steps[0] if all_steps else next((x for x in steps if x is not None), None)
            last = group[-1]
            count = conn.execute(
                _SERIES_UPDATE,
                {
                    "p_sid": sid,
                    "p_n": n,
                    "p_first_step": first_step,
                    "p_last_step": last[3],
                    "p_time": last[4],
                    "p_value": last[5],
                    "p_text": last[6],
                    "p_low": min(finite) if finite else None,
                    "p_high": max(finite) if finite else None,
                },
            ).scalar_one()
            seq = count - n
            columns.append((sid, seq, steps, times, values, texts))
            if not finite:
                continue
            by_step = axis == "step"
            if all_finite and (all_steps or not by_step):  # every point is summarised: contiguous slices
                xs = list(map(float, steps)) if by_step else times
                _chunk_rows(chunks, sid, seq, xs, times, values, None)
            else:
                keep = [i for i in range(n) if values[i] is not None and (not by_step or steps[i] is not None)]
                xs = [float(steps[i]) for i in keep] if by_step else [times[i] for i in keep]
                seqs = [seq + i for i in keep]
                _chunk_rows(chunks, sid, seq, xs, [times[i] for i in keep], [values[i] for i in keep], seqs)
        if columns:
            self._insert_points(conn, columns)
        if chunks:
            self._merge_chunks(conn, chunks)
        return len(rows)

    def _insert_points(
        self, conn: Connection, columns: list[tuple[int, int, list[Any], list[Any], list[Any], list[Any]]]
    ) -> None:
        """The points of a batch, ``(series_id, first seq, steps, times, values, texts)`` per series, straight
        through the driver in the open transaction: thousands of rows, and building SQLAlchemy parameters per row
        would cost more than the insert. COPY on PostgreSQL; on SQLite ``INSERT_ROWS`` rows per statement, whose
        parameters are slices of one flat list (half the cost of a statement per row)."""
        names = "series_id, seq, step, time, value, text"
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            if self.db.dialect == "postgresql":
                with cursor.copy(f"COPY metric_points ({names}) FROM STDIN") as copy:
                    for sid, seq, steps, times, values, texts in columns:
                        for row in zip(repeat(sid), range(seq, seq + len(steps)), steps, times, values, texts):
                            copy.write_row(row)
                return
            total = sum(len(c[2]) for c in columns)
            flat: list[Any] = [None] * (6 * total)
            start = 0
            for sid, seq, steps, times, values, texts in columns:
                n = len(steps)
                end = start + 6 * n
                flat[start:end:6] = [sid] * n
                flat[start + 1 : end : 6] = range(seq, seq + n)
                flat[start + 2 : end : 6] = steps
                flat[start + 3 : end : 6] = times
                flat[start + 4 : end : 6] = values
                flat[start + 5 : end : 6] = texts
                start = end
            one = "(?, ?, ?, ?, ?, ?)"
            many = 6 * (total - total % INSERT_ROWS)
            width = 6 * INSERT_ROWS
            if many:
                sql = f"INSERT INTO metric_points ({names}) VALUES {', '.join([one] * INSERT_ROWS)}"
                cursor.executemany(sql, cast(Sequence[Any], (flat[i : i + width] for i in range(0, many, width))))
            if many < len(flat):
                sql = f"INSERT INTO metric_points ({names}) VALUES {one}"
                cursor.executemany(sql, cast(Sequence[Any], (flat[i : i + 6] for i in range(many, len(flat), 6))))
        finally:
            cursor.close()

    def _merge_chunks(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        stmt = self._merge_stmt
        if stmt is None:
            insert_ = self._dialect_insert(CHUNKS)
            t, e = CHUNKS.c, insert_.excluded

            def pick(which: str, better: Any) -> dict[str, Any]:
                return {f"{which}_{f}": case((better, e[f"{which}_{f}"]), else_=t[f"{which}_{f}"]) for f in "xtv"}

            merged = {
                "count": t.count + e.count,
                **pick("first", e.first_x < t.first_x),
                **pick("last", e.last_x >= t.last_x),
                **pick("min", e.min_v < t.min_v),
                **pick("max", e.max_v > t.max_v),
            }
            stmt = self._merge_stmt = insert_.on_conflict_do_update(index_elements=["series_id", "chunk"], set_=merged)
        conn.execute(stmt, rows)


_KEY = itemgetter(0, 1)  # a row's series within its job: (worker, name)


def _series_update() -> Any:
    """Advance a series' running totals by a batch of its points and return its new count (the batch's points
    take the ``seq`` numbers below it): one statement, built once, with bound parameters."""
    c = SERIES.c
    low = sql_cast(bindparam("p_low", type_=Float), Float)  # typed: a NULL parameter is fine on PostgreSQL
    high = sql_cast(bindparam("p_high", type_=Float), Float)
    return (
        update(SERIES)
        .where(c.id == bindparam("p_sid", type_=Integer))
        .values(
            count=c.count + bindparam("p_n", type_=BigInteger),
            first_step=func.coalesce(c.first_step, sql_cast(bindparam("p_first_step", type_=BigInteger), BigInteger)),
            last_step=func.coalesce(sql_cast(bindparam("p_last_step", type_=BigInteger), BigInteger), c.last_step),
            last_time=bindparam("p_time", type_=Float),
            last_value=bindparam("p_value", type_=Float),
            last_text=bindparam("p_text", type_=Text),
            min_value=case(
                (low.is_(None), c.min_value),
                (or_(c.min_value.is_(None), low < c.min_value), low),
                else_=c.min_value,
            ),
            max_value=case(
                (high.is_(None), c.max_value),
                (or_(c.max_value.is_(None), high > c.max_value), high),
                else_=c.max_value,
            ),
        )
        .returning(c.count)
    )


_SERIES_UPDATE = _series_update()


def _chunk_rows(
    out: list[dict[str, Any]],
    sid: int,
    seq: int,
    xs: list[float],
    ts: list[float],
    vs: list[float],
    seqs: list[int] | None,
) -> None:
    """The M4 summaries of the summarised points of one series in one batch (finite values with an x), one per
    chunk (``seq // CHUNK``) they fall in. ``seqs`` are their seq numbers; None when they are the contiguous
    ``seq, seq + 1, ...``. Per chunk: the first point by x (the earliest of equal ones), the last by x (the
    latest), the lowest and the highest value (the earliest of equal ones), as a point-by-point scan would."""
    n = len(vs)
    i = 0
    while i < n:
        chunk = (seq + i if seqs is None else seqs[i]) // CHUNK
        end = (chunk + 1) * CHUNK
        j = min(n, end - seq) if seqs is None else bisect_left(seqs, end, i)
        x, t, v = xs[i:j], ts[i:j], vs[i:j]
        first = x.index(min(x))
        high_x = max(x)
        last = len(x) - 1 - x[::-1].index(high_x) if x[-1] != high_x else len(x) - 1
        low = v.index(min(v))
        high = v.index(max(v))
        out.append(
            {
                "series_id": sid,
                "chunk": chunk,
                "count": j - i,
                "first_x": x[first],
                "first_t": t[first],
                "first_v": v[first],
                "last_x": x[last],
                "last_t": t[last],
                "last_v": v[last],
                "min_x": x[low],
                "min_t": t[low],
                "min_v": v[low],
                "max_x": x[high],
                "max_t": t[high],
                "max_v": v[high],
            }
        )
        i = j


@dataclass
class _Job:
    id: str
    terminal: bool
    gang: bool


class MetricsIngester:
    """The background thread: every ``interval`` seconds, drain the spool files of running jobs and of jobs that
    ended (or stopped running) until their files are fully consumed."""

    def __init__(
        self,
        db: Database,
        store: MetricsStore,
        jobs_dir: Path,
        *,
        interval: float = 0.25,
        max_bytes_per_file: int = 1024 * 1024,
        batch_points: int = 20_000,
    ) -> None:
        self.db = db
        self.store = store
        self.jobs_dir = jobs_dir
        self.interval = interval
        self.max_bytes_per_file = max_bytes_per_file
        self.batch_points = batch_points
        self._files: dict[tuple[str, str], _FileState] = {}
        self._known_jobs: set[str] = set()  # jobs whose cursors were loaded
        self._draining: dict[str, _Job] = {}  # stopped running; drained, then forgotten
        self._done: dict[str, float] = {}  # ended and drained (monotonic time): not looked at again
        self._running: set[str] = set()
        self._since: Any = None  # ended jobs are looked for from here on
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pass_lock = threading.Lock()
        self.passes = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kiln-metrics-ingest", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            stored = 0
            try:
                stored = self.ingest_now()
            except Exception:
                log.exception("metrics ingestion pass failed; retrying")
            # A pass that found a backlog is followed at once by the next: what was written while it ran is
            # waiting already (a job logging fast would otherwise wait an interval per pass).
            self._stop.wait(BUSY_WAIT if stored >= BUSY_POINTS else self.interval)

    # -- one pass -------------------------------------------------------------------------------------

    def _candidates(self) -> list[_Job]:
        now = utcnow()
        since = self._since if self._since is not None else now - RECENT_AT_START
        self._since = now - timedelta(minutes=2)
        with self.db.read() as s:
            rows = s.execute(
                select(Job.id, Job.state, Job.workers).where(
                    or_(
                        Job.state.in_(ACTIVE),
                        and_(Job.state.in_([str(x) for x in TERMINAL_STATES]), Job.finished_at > since),
                    )
                )
            ).all()
        running = set()
        jobs: dict[str, _Job] = {}
        for job_id, state, workers in rows:
            terminal = JobState(state) in TERMINAL_STATES
            job = _Job(job_id, terminal, (workers or 1) > 1)
            if terminal:
                if job_id in self._done:
                    continue
                if job_id in self._running or job_id not in self._draining:
                    self._draining[job_id] = job
                else:
                    self._draining[job_id].terminal = True
            else:
                running.add(job_id)
                jobs[job_id] = job
        for job_id in self._running - running:  # stopped running without ending (preempted, restarting)
            self._draining.setdefault(job_id, _Job(job_id, False, False))
        self._running = running
        for job_id, job in self._draining.items():
            jobs.setdefault(job_id, job)
        return list(jobs.values())

    def _load_cursors(self, job_id: str) -> None:
        if job_id in self._known_jobs:
            return
        with self.db.read() as s:
            for file, offset, errors, reported in s.execute(
                select(MetricCursor.file, MetricCursor.offset, MetricCursor.errors, MetricCursor.reported).where(
                    MetricCursor.job_id == job_id
                )
            ):
                self._files[(job_id, file)] = _FileState(offset, errors, reported)
        self._known_jobs.add(job_id)

    def ingest_now(self) -> int:
        """One pass: read every candidate file to its last complete line, in round-robin slices, in large
        batches. Returns the points stored."""
        with self._pass_lock:
            return self._pass()

    def _pass(self) -> int:
        self.passes += 1
        jobs = self._candidates()
        work: list[tuple[_Job, str, Path, int]] = []  # (job, file name, path, size)
        for job in jobs:
            directory = self.jobs_dir / job.id / "metrics"
            try:
                entries = [e for e in os.scandir(directory) if e.name.endswith(".jsonl") and e.is_file()]
            except (FileNotFoundError, NotADirectoryError):
                entries = []
            if entries:
                self._load_cursors(job.id)
            for entry in entries:
                size = entry.stat().st_size
                state = self._files.get((job.id, entry.name))
                if state is None or size != state.offset:
                    work.append((job, entry.name, Path(entry.path), size))
        stored = 0
        pending: list[tuple[str, Parsed, bool]] = []
        cursors: list[CursorUpdate] = []
        points = 0
        active = work
        while active:
            still: list[tuple[_Job, str, Path, int]] = []
            for item in active:
                job, name, path, size = item
                state = self._files.get((job.id, name)) or _FileState()
                offset = state.offset
                for cur in cursors:  # already read in this batch but not committed yet
                    if cur.job_id == job.id and cur.file == name:
                        offset = cur.offset
                if size < offset:  # replaced or truncated: start again
                    offset = 0
                chunk, advanced = self._read(path, offset)
                if advanced == 0:
                    continue
                parsed = parse_lines(chunk)
                pending.append((job.id, parsed, job.gang))
                _merge_cursor(cursors, CursorUpdate(job.id, name, offset + advanced, parsed.errors, parsed.first_error))
                points += len(parsed.points)
                if offset + advanced < size:
                    still.append(item)
                if points >= self.batch_points:
                    stored += self.store.write(pending, cursors, self._files)
                    pending, cursors, points = [], [], 0
            active = still
        if pending or cursors:
            stored += self.store.write(pending, cursors, self._files)
        self._forget_drained()
        return stored

    def _read(self, path: Path, offset: int) -> tuple[bytes, int]:
        """(complete lines from offset, bytes consumed). A line longer than a slice is read whole (if its newline
        has arrived) and then skipped by the parser as malformed if it is."""
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read(self.max_bytes_per_file)
                end = complete_lines(data)
                while end == 0 and len(data) >= self.max_bytes_per_file and len(data) < 64 * 1024 * 1024:
                    more = fh.read(self.max_bytes_per_file)
                    if not more:
                        break
                    data += more
                    end = complete_lines(data)
        except OSError:
            return b"", 0
        return data[:end], end

    def _forget_drained(self) -> None:
        """Jobs that stopped running and whose files are consumed (up to a partial line that will never end)."""
        old = time.monotonic() - 600  # ended jobs are looked for at most 2 minutes after their end
        for job_id in [j for j, at in self._done.items() if at < old]:
            del self._done[job_id]
        for job_id in list(self._draining):
            if job_id in self._running:
                self._draining.pop(job_id)
                continue
            directory = self.jobs_dir / job_id / "metrics"
            drained = True
            try:
                for entry in os.scandir(directory):
                    if entry.name.startswith(DRAINING_PREFIX):
                        # A shim still extracting metrics from a flooded log after its exit record (or one that
                        # died doing it: the marker is ignored once older than the shim's longest drain).
                        if time.time() - entry.stat().st_mtime < DRAINING_STALE_SECONDS:
                            drained = False
                            break
                    elif entry.name.endswith(".jsonl"):
                        state = self._files.get((job_id, entry.name))
                        offset = state.offset if state else 0
                        size = entry.stat().st_size
                        if size > offset and _has_newline(Path(entry.path), offset):
                            drained = False
                            break
            except (FileNotFoundError, NotADirectoryError):
                pass
            if drained:
                job = self._draining.pop(job_id)
                if job.terminal:
                    self._done[job_id] = time.monotonic()
                self._known_jobs.discard(job_id)
                for key in [k for k in self._files if k[0] == job_id]:
                    del self._files[key]


def _merge_cursor(cursors: list[CursorUpdate], new: CursorUpdate) -> None:
    for cur in cursors:
        if cur.job_id == new.job_id and cur.file == new.file:
            cur.offset = new.offset
            cur.errors += new.errors
            cur.first_error = cur.first_error or new.first_error
            return
    cursors.append(new)


def _has_newline(path: Path, offset: int) -> bool:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            while block := fh.read(1024 * 1024):
                if b"\n" in block:
                    return True
    except OSError:
        return False
    return False

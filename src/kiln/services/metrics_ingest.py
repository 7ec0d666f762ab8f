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
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

from sqlalchemy import BigInteger, Connection, Float, Table, and_, case, insert, literal, or_, select, update
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
MAX_NAME = 200
MAX_WORKER = 64
SOURCES = frozenset({"sdk", "log", "tb", "sys", "api"})
NONFINITE = {"nan": "nan", "+nan": "nan", "-nan": "nan", "inf": "inf", "+inf": "inf", "infinity": "inf"}
NONFINITE |= {"+infinity": "inf", "-inf": "-inf", "-infinity": "-inf"}
INT64 = 2**63
SPOOL_ERROR = "MetricsSpoolError"
ACTIVE = [str(JobState.STARTING), str(JobState.RUNNING), str(JobState.RESTARTING)]
RECENT_AT_START = timedelta(days=7)  # at start, jobs that ended this recently are drained too

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
        return float(value)
    return None


def parse_lines(data: bytes | str, parsed: Parsed | None = None) -> Parsed:
    """Parse complete spool lines (points and events). Malformed lines and unusable names are counted and
    skipped, never raised. Values: numbers (finite ones in ``value``; NaN and ±inf, as numbers or as the strings
    "nan"/"inf"/"-inf", in ``text``), other strings in ``text``."""
    parsed = parsed or Parsed()
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    loads = json.loads
    for line in text.split("\n"):
        if not line.strip():
            continue
        try:
            obj = loads(line)
        except ValueError:
            parsed.error("not JSON")
            continue
        if not isinstance(obj, dict):
            parsed.error("not a JSON object")
            continue
        worker = obj.get("w") or "worker0"
        if not isinstance(worker, str) or len(worker) > MAX_WORKER:
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
        t = _number(obj.get("t"))
        step = obj.get("s")
        if not isinstance(metrics, dict) or t is None or not math.isfinite(t):
            parsed.error("a point needs 'm' (an object) and 't' (a number)")
            continue
        if step is not None and (not isinstance(step, int) or isinstance(step, bool) or not -INT64 <= step < INT64):
            parsed.error("'s' must be an integer or null")
            continue
        src = obj.get("src") or "sdk"
        if src not in SOURCES:
            src = "sdk"
        append = parsed.points.append
        for name, raw in metrics.items():
            if not name or len(name) > MAX_NAME:
                parsed.error("metric name empty or longer than 200 characters")
                continue
            kind = type(raw)
            if kind is float or kind is int or kind is bool:
                number = float(raw)
                if number - number == 0.0:  # finite (NaN and the infinities give NaN)
                    append((worker, name, src, step, t, number, None))
                else:
                    append((worker, name, src, step, t, None, str(number)))
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
        rows: list[Row],
        new_series: dict[tuple[str, str, str], tuple[int, str]],
    ) -> dict[tuple[str, str], tuple[int, str]]:
        wanted: dict[tuple[str, str], Row] = {}
        for row in rows:
            wanted.setdefault((row[0], row[1]), row)
        found: dict[tuple[str, str], tuple[int, str]] = {}
        missing: list[tuple[str, str]] = []
        for key in wanted:
            full = (job_id, *key)
            hit = self._series.get(full) or new_series.get(full)
            if hit is not None:
                found[key] = hit
            else:
                missing.append(key)
        if missing:
            now = utcnow()
            values = [
                {
                    "job_id": job_id,
                    "worker": worker,
                    "name": name,
                    "kind": "scalar" if _is_scalar(wanted[(worker, name)]) else "text",
                    "source": wanted[(worker, name)][2],
                    "axis": "step" if wanted[(worker, name)][3] is not None else "time",
                    "count": 0,
                    "created_at": now,
                }
                for worker, name in missing
            ]
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
        ids = self._series_ids(conn, job_id, rows, new_series)
        by_series: dict[int, list[Row]] = defaultdict(list)
        axes: dict[int, str] = {}
        for row in rows:
            sid, axis = ids[(row[0], row[1])]
            by_series[sid].append(row)
            axes[sid] = axis
        c = SERIES.c
        points: list[tuple[Any, ...]] = []
        chunks: list[dict[str, Any]] = []
        for sid, series_rows in by_series.items():
            n = len(series_rows)
            last = series_rows[-1]
            finite = [r[5] for r in series_rows if r[5] is not None]
            low, high = (min(finite), max(finite)) if finite else (None, None)
            steps = [r[3] for r in series_rows if r[3] is not None]
            first_step = steps[0] if steps else None
            low_p, high_p = sql_cast(literal(low), Float), sql_cast(literal(high), Float)  # typed: NULL on PostgreSQL
            first_p = sql_cast(literal(first_step), BigInteger)
            count = conn.execute(
                update(SERIES)
                .where(c.id == sid)
                .values(
                    count=c.count + n,
                    first_step=case((c.first_step.is_(None), first_p), else_=c.first_step),
                    last_step=last[3] if last[3] is not None else c.last_step,
                    last_time=last[4],
                    last_value=last[5],
                    last_text=last[6],
                    min_value=case(
                        (low_p.is_(None), c.min_value),
                        (or_(c.min_value.is_(None), low_p < c.min_value), low_p),
                        else_=c.min_value,
                    ),
                    max_value=case(
                        (high_p.is_(None), c.max_value),
                        (or_(c.max_value.is_(None), high_p > c.max_value), high_p),
                        else_=c.max_value,
                    ),
                )
                .returning(c.count)
            ).scalar_one()
            seq = count - n
            by_axis_step = axes[sid] == "step"
            summaries: dict[int, list[Any]] = {}
            for r in series_rows:
                points.append((sid, seq, r[3], r[4], r[5], r[6]))
                v = r[5]
                if v is not None:
                    x = r[3] if by_axis_step else r[4]
                    if x is not None:
                        _summarise(summaries, seq // CHUNK, float(x), r[4], v)
                seq += 1
            for chunk, agg in summaries.items():
                chunks.append(_chunk_row(sid, chunk, agg))
        if points:
            self._insert_points(conn, points)
        if chunks:
            self._merge_chunks(conn, chunks)
        return len(points)

    def _insert_points(self, conn: Connection, points: list[tuple[Any, ...]]) -> None:
        """The points of a batch, straight through the driver in the open transaction: thousands of rows, and
        building SQLAlchemy parameters per row would cost more than the insert (COPY on PostgreSQL)."""
        columns = "series_id, seq, step, time, value, text"
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            if self.db.dialect == "postgresql":
                with cursor.copy(f"COPY metric_points ({columns}) FROM STDIN") as copy:
                    for row in points:
                        copy.write_row(row)
            else:
                cursor.executemany(f"INSERT INTO metric_points ({columns}) VALUES (?, ?, ?, ?, ?, ?)", points)
        finally:
            cursor.close()

    def _merge_chunks(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        stmt = self._dialect_insert(CHUNKS)
        t, e = CHUNKS.c, stmt.excluded

        def pick(which: str, better: Any) -> dict[str, Any]:
            return {f"{which}_{f}": case((better, e[f"{which}_{f}"]), else_=t[f"{which}_{f}"]) for f in "xtv"}

        merged = {
            "count": t.count + e.count,
            **pick("first", e.first_x < t.first_x),
            **pick("last", e.last_x >= t.last_x),
            **pick("min", e.min_v < t.min_v),
            **pick("max", e.max_v > t.max_v),
        }
        conn.execute(stmt.on_conflict_do_update(index_elements=["series_id", "chunk"], set_=merged), rows)


def _summarise(summaries: dict[int, list[Any]], chunk: int, x: float, t: float, v: float) -> None:
    agg = summaries.get(chunk)
    p = (x, t, v)
    if agg is None:
        summaries[chunk] = [1, p, p, p, p]
        return
    agg[0] += 1
    if x < agg[1][0]:
        agg[1] = p
    if x >= agg[2][0]:
        agg[2] = p
    if v < agg[3][2]:
        agg[3] = p
    if v > agg[4][2]:
        agg[4] = p


def _chunk_row(sid: int, chunk: int, agg: list[Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"series_id": sid, "chunk": chunk, "count": agg[0]}
    for name, p in zip(("first", "last", "min", "max"), agg[1:], strict=True):
        row[f"{name}_x"], row[f"{name}_t"], row[f"{name}_v"] = p
    return row


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
        interval: float = 0.5,
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
            try:
                self.ingest_now()
            except Exception:
                log.exception("metrics ingestion pass failed; retrying")
            self._stop.wait(self.interval)

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
                    if entry.name.endswith(".jsonl"):
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

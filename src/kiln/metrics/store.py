"""The metrics writer: parsed batches (``metrics_parse``) stored as series, points, M4 chunk summaries, spool
cursors and events, one transaction per batch.

Exactly once: a batch's points and the new byte offset of every file it came from are committed in one
transaction (``metric_cursors``), so a server that stops anywhere resumes from the last committed offset. Each
offset moves by compare-and-set: the batch commits only if every cursor of it is still where its reader found it
(``CursorUpdate.expected``), so that two readers of one spool file (two servers on one machine, one of them
stalled past the job's lease) never both store the same lines: the later one's batch is rolled back whole
(``CursorMoved``) and it reads on from the offset the other committed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, cast

from sqlalchemy import (
    Connection,
    Table,
    and_,
    case,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from kiln.db.session import Database
from kiln.db.tables import JobEvent, MetricChunk, MetricCursor, MetricPoint, MetricSeries, utcnow
from kiln.metrics.budget import LIMIT_REASON, MetricBudgets
from kiln.metrics.parse import Columns, Parsed
from kiln.metrics.summaries import _SERIES_UPDATE, CHUNK, _chunk_rows

__all__ = ["CHUNK", "CursorMoved", "CursorUpdate", "MetricsStore"]

SERIES = cast(Table, MetricSeries.__table__)
POINTS = cast(Table, MetricPoint.__table__)
CHUNKS = cast(Table, MetricChunk.__table__)
CURSORS = cast(Table, MetricCursor.__table__)
EVENTS = cast(Table, JobEvent.__table__)

INSERT_ROWS = 150  # points per INSERT statement on SQLite (900 parameters: under the old limit of 999)
# The series update as SQLite's SQL and the order of its parameters, compiled once: sent through the driver's cursor,
# as the points are (SQLAlchemy's execute costs about as much as SQLite's, once per series per batch: a tenth of a
# 1,000-point log-batch's CPU).
_SQLITE_SERIES_UPDATE = _SERIES_UPDATE.compile(dialect=sqlite.dialect())
_SQLITE_SERIES_ORDER = tuple(_SQLITE_SERIES_UPDATE.positiontup or ())
SPOOL_ERROR = "MetricsSpoolError"


def _is_scalar(value: float | None, text: str | None) -> bool:
    return value is not None or (text is not None and text in ("nan", "inf", "-inf"))


@dataclass
class CursorUpdate:
    """A spool file's cursor moved from ``expected`` (the committed offset its reader started from; None: the
    file has no cursor yet) to ``offset``."""

    job_id: str
    file: str
    offset: int
    errors: int  # new malformed lines in this batch
    first_error: str = ""
    expected: int | None = None


@dataclass
class _FileState:
    """What a reader knows of a file's committed cursor; ``committed``: a cursor row exists (offset is its)."""

    offset: int = 0
    errors: int = 0
    reported: bool = False
    committed: bool = False


class CursorMoved(Exception):
    """Another reader moved these files' cursors (job id, file) since this one read them: its batch was rolled
    back, nothing of it stored. Read them again from the committed offsets."""

    def __init__(self, moved: list[tuple[str, str]]) -> None:
        super().__init__(f"cursors moved by another reader: {moved}")
        self.moved = moved


@dataclass
class _Queued:
    """One caller's batches waiting for a group commit (``MetricsStore.append``)."""

    batches: list[tuple[str, Parsed, bool]]
    done: bool = False
    stored: int = 0
    error: BaseException | None = None


class MetricsStore:
    """Writes parsed batches: series (created on first sight), points, chunk summaries, cursors and events, all
    in one transaction per batch. Shared by the ingester thread and the HTTP routes (``append``)."""

    def __init__(self, db: Database, budgets: MetricBudgets | None = None) -> None:
        """``budgets``: the jobs' metrics budgets (default: the platform's defaults and ceilings)."""
        self.db = db
        # Every path's points pass ``_write``: the one place a job's budget is enforced.
        self.budgets = budgets if budgets is not None else MetricBudgets(db)
        self._series: dict[tuple[str, str, str], tuple[int, str]] = {}  # (job, worker, name) -> (id, axis)
        self._lock = threading.Lock()  # one writer at a time (and the caches with it)
        self._queue: list[_Queued] = []  # appends waiting for the next group commit
        self._queue_lock = threading.Lock()
        self._merge_stmt: Any = None  # the chunk-merging upsert, built on first use
        self.points_ingested = 0  # since start, both paths (Prometheus)

    def admit(self, job_id: str) -> Callable[[tuple[str, str]], bool] | None:
        """For the parser (``parse_lines(admit=)``): None, or, for a job at its series limit, whether a series is
        one it has (the others' points would be dropped: they are not even kept as columns)."""
        if not self.budgets.full(job_id):
            return None
        series = self._series
        return lambda key: (job_id, *key) in series

    def new_series(self, job_id: str, keys: Iterable[tuple[str, str]]) -> int:
        """How many of these series of the job this writer does not know (at most what a write would create)."""
        series = self._series
        return sum(1 for key in keys if (job_id, *key) not in series)

    def _dialect_insert(self, table: Table) -> Any:
        return postgresql.insert(table) if self.db.dialect == "postgresql" else sqlite.insert(table)

    def write(
        self,
        batches: Iterable[tuple[str, Parsed, bool]],
        cursors: Sequence[CursorUpdate] = (),
        files: dict[tuple[str, str], _FileState] | None = None,
    ) -> int:
        """Store ``(job_id, parsed, is_gang)`` batches and advance ``cursors``, atomically. Returns the points
        stored. ``files`` (the ingester's cursor cache) is updated after the commit. ``CursorMoved`` (nothing
        stored) where a cursor is no longer at its ``expected`` offset."""
        with self._lock:
            return self._write(list(batches), cursors, files)

    def _write(
        self,
        batches: list[tuple[str, Parsed, bool]],
        cursors: Sequence[CursorUpdate],
        files: dict[tuple[str, str], _FileState] | None,
        per_caller: list[_Queued] | None = None,
    ) -> int:
        """``write`` with the writer's lock held; ``per_caller``: the group of appends these batches are, each
        told its own count of points stored."""
        # Before the transaction (its reads take no write lock): what the jobs' budgets let be stored.
        admitted = self.budgets.admit(batches, self._series)
        batches = admitted.batches
        with self.db.bulk_transaction() as s:
            conn = s.connection()
            # The cursors first: the compare-and-set locks their rows (PostgreSQL), in one order for every reader,
            # so that a second reader of the same files waits here, before any work, and then finds them moved.
            cursors = sorted(cursors, key=lambda c: (c.job_id, c.file))
            reported: list[tuple[str, str, int]] = []
            moved: list[tuple[str, str]] = []
            for cur in cursors:
                state = files.get((cur.job_id, cur.file)) if files is not None else None
                total = (state.errors if state else 0) + cur.errors
                report = total > 0 and not (state and state.reported)
                if not self._advance(conn, cur, total, report or bool(state and state.reported)):
                    moved.append((cur.job_id, cur.file))
                elif report:
                    reported.append((cur.job_id, cur.file, total))
            if moved:
                raise CursorMoved(moved)  # rolled back: no point of the batch is stored
            new_series: dict[tuple[str, str, str], tuple[int, str]] = {}
            stored = 0
            counts: list[int] = []
            for job_id, parsed, gang in batches:
                counts.append(self._write_points(conn, job_id, parsed.series, new_series) if parsed.series else 0)
                stored += counts[-1]
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
            if admitted.events:
                now = utcnow()
                conn.execute(
                    insert(EVENTS),
                    [{"job_id": j, "time": now, "reason": LIMIT_REASON, "message": m} for j, m in admitted.events],
                )
            for job_id, file, total in reported:
                first_error = next(c.first_error for c in cursors if c.job_id == job_id and c.file == file)
                conn.execute(
                    insert(EVENTS),
                    {
                        "job_id": job_id,
                        "time": utcnow(),
                        "reason": SPOOL_ERROR,
                        "message": f"{file}: {total} malformed line(s) skipped"
                        + (f" (first: {first_error})" if first_error else ""),
                    },
                )
        # Committed: now the caches may learn what the database knows.
        self._series.update(new_series)
        self.budgets.commit(admitted)
        if files is not None:
            for cur in cursors:
                state = files.setdefault((cur.job_id, cur.file), _FileState())
                state.offset = cur.offset
                state.errors += cur.errors
                state.committed = True
                if any(r[0] == cur.job_id and r[1] == cur.file for r in reported):
                    state.reported = True
        self.points_ingested += stored
        if per_caller is not None:
            at = 0
            for queued in per_caller:
                queued.stored = sum(counts[at : at + len(queued.batches)])
                at += len(queued.batches)
        return stored

    def append(self, batches: list[tuple[str, Parsed, bool]]) -> int:
        """``write`` for the HTTP routes (a remote job's points, MLflow's log-batch): stored and committed when it
        returns, by a group commit. Requests that arrive while another batch is being written wait for the writer
        and are then written together, in one transaction: a commit and the per-transaction work are paid once
        for all of them (most of a 1,000-point request's cost), not once each. An error of that transaction is
        every waiting caller's (their points are validated before, so it is the database's)."""
        me = _Queued(list(batches))
        with self._queue_lock:
            self._queue.append(me)
        with self._lock:
            if not me.done:  # no writer took it with its group: this caller writes the group now
                with self._queue_lock:
                    group, self._queue = self._queue, []
                try:
                    self._write([batch for queued in group for batch in queued.batches], (), None, per_caller=group)
                except BaseException as exc:
                    for queued in group:
                        queued.error = exc
                    raise
                finally:
                    for queued in group:
                        queued.done = True
        if me.error is not None:
            raise me.error
        return me.stored

    def _advance(self, conn: Connection, cur: CursorUpdate, errors: int, reported: bool) -> bool:
        """Move one cursor from ``cur.expected`` to ``cur.offset``; False (nothing changed) where another reader
        moved it first. On PostgreSQL a concurrent mover's row lock is waited out and the condition checked
        against what it committed (READ COMMITTED); SQLite's writers are serialised already."""
        values = {"offset": cur.offset, "errors": errors, "reported": reported, "updated_at": utcnow()}
        c = CURSORS.c
        if cur.expected is None:  # the file's first batch: its cursor row must not exist yet
            stmt = self._dialect_insert(CURSORS).values(job_id=cur.job_id, file=cur.file, **values)
            stmt = stmt.on_conflict_do_nothing(index_elements=["job_id", "file"])
        else:
            stmt = (
                update(CURSORS)
                .where(c.job_id == cur.job_id, c.file == cur.file, c.offset == cur.expected)
                .values(**values)
            )
        # RETURNING, not the row count: psycopg reports none (-1) for an INSERT ... ON CONFLICT DO NOTHING.
        return conn.execute(stmt.returning(c.offset)).first() is not None

    def _series_ids(
        self,
        conn: Connection,
        job_id: str,
        groups: dict[tuple[str, str], Columns],
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
                first = groups[(worker, name)]  # the series' first point decides its kind, source and axis
                values.append(
                    {
                        "job_id": job_id,
                        "worker": worker,
                        "name": name,
                        "kind": "scalar" if _is_scalar(first.values[0], first.texts[0]) else "text",
                        "source": first.source,
                        "axis": "step" if first.steps[0] is not None else "time",
                        "count": 0,
                        "created_at": now,
                    }
                )
            c = SERIES.c
            # The new rows' ids come back with the insert (RETURNING); only series another writer created first
            # (the insert skipped them) are looked up by name: that lookup's cost grows with the job's series.
            inserted = conn.execute(
                self._dialect_insert(SERIES).on_conflict_do_nothing().returning(c.id, c.worker, c.name, c.axis),
                values,
            )
            for sid, worker, name, axis in inserted:
                found[(worker, name)] = (sid, axis)
                new_series[(job_id, worker, name)] = (sid, axis)
            missing = [key for key in missing if key not in found]
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
        groups: dict[tuple[str, str], Columns],
        new_series: dict[tuple[str, str, str], tuple[int, str]],
    ) -> int:
        """A job's points: each series' running totals advanced (which also hands out the points' ``seq``), the
        points inserted and the chunk summaries merged. Column lists per series (as the parser made them), so that
        the per-point work is done by C builtins (min/max/index over slices, slice assignment); the series update
        is one statement built once (no SQL compiled per series per batch)."""
        ids = self._series_ids(conn, job_id, groups, new_series)
        columns: list[tuple[int, int, list[Any], list[Any], list[Any], list[Any]]] = []
        chunks: list[dict[str, Any]] = []
        sqlite_ = self.db.dialect == "sqlite"
        raw = conn.connection.dbapi_connection.cursor() if sqlite_ else None  # type: ignore[union-attr]
        try:
            self._series_rows(conn, raw, groups, ids, columns, chunks)
        finally:
            if raw is not None:
                raw.close()
        if columns:
            self._insert_points(conn, columns)
        if chunks:
            self._merge_chunks(conn, chunks)
        return sum(len(c[2]) for c in columns)

    def _series_rows(
        self,
        conn: Connection,
        raw: Any,
        groups: dict[tuple[str, str], Columns],
        ids: dict[tuple[str, str], tuple[int, str]],
        columns: list[tuple[int, int, list[Any], list[Any], list[Any], list[Any]]],
        chunks: list[dict[str, Any]],
    ) -> None:
        """Each series' running totals advanced (``raw``: SQLite's driver cursor, else through SQLAlchemy), and
        its points' columns and chunk summaries appended to ``columns`` and ``chunks``."""
        for key, group in groups.items():
            sid, axis = ids[key]
            n = len(group)
            steps: list[Any] = group.steps
            times: list[Any] = group.times
            values: list[Any] = group.values
            texts: list[Any] = group.texts
            all_finite = None not in values
            finite = values if all_finite else [v for v in values if v is not None]
            all_steps = None not in steps
            first_step = steps[0] if all_steps else next((x for x in steps if x is not None), None)
            params = {
                "p_sid": sid,
                "p_n": n,
                "p_first_step": first_step,
                "p_last_step": steps[-1],
                "p_time": times[-1],
                "p_value": values[-1],
                "p_text": texts[-1],
                "p_low": min(finite) if finite else None,
                "p_high": max(finite) if finite else None,
            }
            if raw is None:
                count = conn.execute(_SERIES_UPDATE, params).scalar_one()
            else:
                row = raw.execute(_SQLITE_SERIES_UPDATE.string, [params[p] for p in _SQLITE_SERIES_ORDER]).fetchone()
                if row is None:
                    raise LookupError(f"metric series {sid} is gone")  # as scalar_one would: nothing to number
                count = row[0]
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
            if many < len(flat):  # the rest (fewer than INSERT_ROWS) in one statement, not a statement a row
                rest = (len(flat) - many) // 6
                sql = f"INSERT INTO metric_points ({names}) VALUES {', '.join([one] * rest)}"
                cursor.execute(sql, flat[many:])
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

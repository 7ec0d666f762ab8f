"""Metrics ingestion: the background task that tails the spool files of jobs (``*.jsonl`` in the directory the
backend's :class:`~kiln.backends.capabilities.MetricSpools` names for a job's attempt, or the server's own for a
backend without one) and hands what it reads to the writer. The spool-line parser is ``metrics_parse``, the
writer ``metrics_store`` (both re-exported here).

Exactly once: a batch's points and the new byte offset of every file it came from are committed in one
transaction (``metric_cursors``), so a server that stops anywhere resumes from the last committed offset; each
offset moves by compare-and-set (``CursorMoved``), so that two servers reading one spool never both store a line.

Which server reads a job (``MetricsIngester`` says why): the one holding its lease while it runs; anyone once
nobody holds it.

Fair: every pass reads at most ``max_bytes_per_file`` from each file in turn (round robin), so a job that floods
metrics only delays the others by one slice. Only complete lines are consumed; a partial last line is read when
its newline has arrived.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import and_, bindparam, or_, select

from kiln.backends.capabilities import MetricSpools
from kiln.db.session import Database
from kiln.db.tables import Job, MetricCursor, utcnow
from kiln.domain.states import TERMINAL_STATES, JobState
from kiln.metrics.parse import Parsed, Row, complete_lines, parse_lines
from kiln.metrics.spool_files import has_newline, long_line_parsed, open_spool, piece_of
from kiln.metrics.store import CHUNK, CursorMoved, CursorUpdate, MetricsStore, _FileState
from kiln.tasks.runner import Task, TaskContext

__all__ = [
    "CHUNK",
    "CursorMoved",
    "CursorUpdate",
    "MetricsIngester",
    "MetricsStore",
    "Parsed",
    "Row",
    "complete_lines",
    "parse_lines",
]

log = logging.getLogger(__name__)

ACTIVE = [str(JobState.STARTING), str(JobState.RUNNING), str(JobState.RESTARTING)]
RECENT_AT_START = timedelta(days=7)  # at start, jobs that ended this recently are drained too
DRAINING_PREFIX = "draining-"  # a shim's marker: its spool files still grow after its exit record
DRAINING_STALE_SECONDS = 3700.0  # ... for at most this long (the shim's longest drain, 3600 s, and slack)
BUSY_POINTS = 5000  # a pass that stored at least this many points (a backlog) is followed by the next one soon
BUSY_WAIT = 0.05  # (rather than after the interval): long enough for what arrives meanwhile to make a batch
MIN_WOKEN_GAP = 0.02  # a pass woken by a shim (metrics.watch) starts at least this long after the one before
PIECE_BYTES = 16 * 1024  # lines are parsed this many bytes at a time: the batch bounds are checked in between
MIN_PIECE_BYTES = 512  # ... or this many, after lines of many series


MAX_HANDLES = 10_000  # attempts' handles kept; past it, those of jobs no longer read go
# The jobs a pass reads the spools of: running, and ended since the bound ``since``; with whether another server
# than the bound ``owner`` holds the lease (one that did not run out by ``now``: ``MetricsIngester`` says why).
_CANDIDATES = select(
    Job.id,
    Job.state,
    Job.workers,
    Job.attempt,
    and_(
        Job.lease_owner.is_not(None), Job.lease_owner != bindparam("owner"), Job.lease_expires_at > bindparam("now")
    ).label("elsewhere"),
).where(
    or_(
        Job.state.in_(ACTIVE),
        and_(Job.state.in_([str(x) for x in TERMINAL_STATES]), Job.finished_at > bindparam("since")),
    )
)
_HANDLES = select(Job.id, Job.attempt, Job.handle).where(Job.id.in_(bindparam("ids", expanding=True)))


@dataclass
class _Job:
    id: str
    terminal: bool
    gang: bool
    handle: dict[str, Any] | None = None  # the job's current attempt: where its spool is


class MetricsIngester:
    """The background task (``task()``): every ``interval`` seconds, drain the spool files of running jobs and of
    jobs that ended (or stopped running) until their files are fully consumed.

    Which server reads a job: the spool is found from the attempt's handle, so every server on the machine could
    read every job's (an attempt stays in the home of the server that launched it, and goes on running there
    after another server adopted the job). A running job is read by the server that holds its lease (``owner``,
    as the scheduler records it: ``Job.lease_owner``): the one whose reconciler watches the attempt, and whose
    checkpoint sync and log shipping serve the job too. So the job's metrics follow it when a survivor adopts it
    from a server that died (that one's home keeps the spool; the survivor reads it there), and two live servers
    never read one spool in turn. A job nobody holds — its holder's lease ran out (it died, or it is stalled), or
    it ended (the lease is cleared then) — is read by any server that finds its spool, until drained. Exactly
    once never rests on this rule, only on the cursors' compare-and-set: a reader that was stalled past the lease
    (or two draining an ended job) loses the race for a batch, stores nothing of it, and reads on from the offset
    the other committed."""

    def __init__(
        self,
        db: Database,
        store: MetricsStore,
        spools: MetricSpools,
        *,
        owner: str | None = None,
        interval: float = 0.25,
        max_bytes_per_file: int = 1024 * 1024,
        batch_points: int = 2_000,
        batch_series: int = 64,
        batch_new_series: int = 32,
        on_ingested: Callable[[set[str]], None] | None = None,
    ) -> None:
        """``spools``: where each job's spool files are (the backend's, or the server's own); ``owner``: this
        server in the jobs' leases (None: every job, whoever holds it)."""
        self.db = db
        self.store = store
        self.spools = spools
        self.owner = owner
        self.interval = interval
        self.max_bytes_per_file = max_bytes_per_file
        # Called after a pass that stored points, with the jobs they were of (the studies task judges them).
        self.on_ingested = on_ingested
        self.ingested_jobs: set[str] = set()  # the jobs the last pass stored points of
        # One transaction holds at most about this many points and series (and one PIECE_BYTES of lines more):
        # SQLite has one write lock, and every request and task that writes waits while a batch holds it.
        self.batch_points = batch_points
        self.batch_series = batch_series
        self.batch_new_series = batch_new_series  # creating a series costs several of a point
        self.bytes_read = 0  # spool bytes read since start (each byte of a file once, whatever its lines)
        self._stopping: threading.Event | None = None  # the task's: a pass stops between batches when set
        # (job, file) -> (offset, end): the bytes from the file's offset to ``end`` hold no newline (a line still
        # being written, or one over the line limit): a pass reads on from ``end``, never from the offset again.
        self._scans: dict[tuple[str, str], tuple[int, int]] = {}
        self._files: dict[tuple[str, str], _FileState] = {}
        self._known_jobs: set[str] = set()  # jobs whose cursors were loaded
        self._draining: dict[str, _Job] = {}  # stopped running; drained, then forgotten
        self._done: dict[str, float] = {}  # ended and drained (monotonic time): not looked at again
        self._running: dict[str, _Job] = {}
        self._handles: dict[tuple[str, int], dict[str, Any] | None] = {}  # (job, attempt) → its handle, as read
        self._since: Any = None  # ended jobs are looked for from here on
        self._pass_lock = threading.Lock()
        self._task: Task | None = None
        self._last_pass = 0.0  # monotonic start of the last pass the task ran
        self.passes = 0

    def task(self) -> Task:
        """A pass every ``interval``; every server runs it (the spool files are on its machine)."""
        if self._task is None:
            self._task = Task("metrics-ingest", self._task_pass, self.interval, join_timeout=30)
        return self._task

    def wake(self, job_id: str | None = None) -> None:
        """A pass now: a shim said a job wrote points of a watched metric (``metrics.watch``)."""
        self.task().wake.set()

    def _task_pass(self, ctx: TaskContext) -> float | None:
        # A pass that found a backlog is followed at once by the next: what was written while it ran is
        # waiting already (a job logging fast would otherwise wait an interval per pass).
        if ctx.woken:
            # Wake-ups come from jobs (any spec may watch a metric, and print it in a loop): however many there
            # are, woken passes are at least MIN_WOKEN_GAP apart, so jobs cannot keep the ingester busy.
            ctx.stopping.wait(max(0.0, self._last_pass + MIN_WOKEN_GAP - time.monotonic()))
        self._last_pass = time.monotonic()
        self._stopping = ctx.stopping
        stored = self.ingest_now()
        if stored and self.on_ingested is not None:
            self.on_ingested(self.ingested_jobs)  # e.g. the studies task: a pruner judges a trial's points at once
        return BUSY_WAIT if stored >= BUSY_POINTS else None

    # -- one pass -------------------------------------------------------------------------------------

    def _candidates(self) -> list[_Job]:
        now = utcnow()
        since = self._since if self._since is not None else now - RECENT_AT_START
        self._since = now - timedelta(minutes=2)
        with self.db.read() as s:
            # (Without an owner, every job is read, whoever holds it: no owner is this one.)
            rows = s.execute(_CANDIDATES, {"since": since, "owner": self.owner or "", "now": now}).all()
            # Each attempt's handle (where its spool is) is read once: a pass reads every running job, and every
            # job that ended in the last minutes, four times a second.
            wanted = sorted(
                {job_id for job_id, _, _, attempt, *_ in rows if (job_id, attempt) not in self._handles}
                - self._done.keys()
            )
            for start in range(0, len(wanted), 500):
                for job_id, attempt, handle in s.execute(_HANDLES, {"ids": wanted[start : start + 500]}):
                    self._handles[(job_id, attempt)] = handle
        if len(self._handles) > MAX_HANDLES:
            current = {(job_id, attempt) for job_id, _, _, attempt, *_ in rows}
            self._handles = {k: v for k, v in self._handles.items() if k in current}
        running: dict[str, _Job] = {}
        jobs: dict[str, _Job] = {}
        for job_id, state, workers, attempt, elsewhere in rows:
            if job_id in self._done:
                continue  # ended and drained
            handle = self._handles.get((job_id, attempt))
            terminal = JobState(state) in TERMINAL_STATES
            job = _Job(job_id, terminal, (workers or 1) > 1, handle)
            if terminal:
                if job_id in self._running or job_id not in self._draining:
                    self._draining[job_id] = job
                else:
                    self._draining[job_id].terminal = True
                    self._draining[job_id].handle = handle
            elif elsewhere and self.owner is not None:
                # Another live server reads it: left alone, and what this one knew of its cursors forgotten (read
                # again should the job come back to it).
                self._running.pop(job_id, None)
                self._draining.pop(job_id, None)
                self._forget(job_id)
            else:
                running[job_id] = job
                jobs[job_id] = job
        for job_id in self._running.keys() - running.keys():  # stopped running without ending (preempted, ...)
            self._draining.setdefault(job_id, _Job(job_id, False, False, self._running[job_id].handle))
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
                self._files[(job_id, file)] = _FileState(offset, errors, reported, committed=True)
        self._known_jobs.add(job_id)

    def _forget(self, job_id: str) -> None:
        """Drop what this reader knows of the job's cursors: the next read loads them from the database."""
        self._known_jobs.discard(job_id)
        for key in [k for k in self._files if k[0] == job_id]:
            del self._files[key]
        for key in [k for k in self._scans if k[0] == job_id]:
            del self._scans[key]

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
            directory = self.spools.metric_spool(job.id, job.handle)
            try:
                entries = [
                    e for e in os.scandir(directory) if e.name.endswith(".jsonl") and e.is_file(follow_symlinks=False)
                ]
            except (FileNotFoundError, NotADirectoryError):
                entries = []
            if entries:
                self._load_cursors(job.id)
            for entry in entries:
                size = entry.stat().st_size
                state = self._files.get((job.id, entry.name))
                if state is None or size != state.offset:
                    work.append((job, entry.name, Path(entry.path), size))
        batch = _Batch()
        stored = 0
        ingested: set[str] = set()
        active = work
        while active and not self._stopped():
            still: list[tuple[_Job, str, Path, int]] = []
            for item in active:
                if self._stopped():
                    break  # what is read and not written is read again after the restart (exactly once)
                job, name, path, size = item
                key = (job.id, name)
                limits = self.store.budgets.limits(job.id)
                if self._spool_spent(job.id, batch) >= limits.spool:
                    self._spool_exhausted(job.id, limits.spool, batch)
                    continue
                offset = batch.offset(key, self._files.get(key))
                chunk, offset, advanced, long_line, scanned = self._read(key, path, offset, limits.line)
                if advanced == 0:
                    if scanned and self._scans.get(key, (0, size))[1] < size:
                        still.append(item)
                    continue
                if long_line:
                    self._long_line(job.id, limits.line)
                    batch.add(key, self._expected(key), offset + advanced, long_line_parsed(limits.line), job)
                moved = False
                at = offset
                piece_size = MIN_PIECE_BYTES
                while at < offset + len(chunk):  # (empty for a skipped long line)
                    piece = piece_of(chunk, at - offset, piece_size)
                    parsed = parse_lines(piece, max_line=limits.line, admit=self.store.admit(job.id))
                    at += len(piece)
                    # Pieces grow from a line or so while their lines are of few series; lines of many (a flood of
                    # names) are read a line or so at a time: the batch's bounds are met near them, not a piece past.
                    many = len(parsed.series) > self.batch_series // 4
                    piece_size = MIN_PIECE_BYTES if many else min(2 * piece_size, PIECE_BYTES)
                    if parsed.long_lines:
                        self._long_line(job.id, limits.line)
                    batch.add(key, self._expected(key), at, parsed, job)
                    batch.new += self.store.new_series(job.id, parsed.series)
                    if parsed.series:
                        ingested.add(job.id)
                    # The GIL handed to the request threads between pieces (a pass may parse for seconds): they
                    # would otherwise wait the switch interval (5 ms) for it at each of their I/O calls.
                    time.sleep(0)
                    if (
                        batch.points >= self.batch_points
                        or len(batch.keys) >= self.batch_series
                        or batch.new >= self.batch_new_series
                    ):
                        written, moved = self._write(batch)
                        stored += written
                        batch = _Batch()
                        if moved or self._stopped():
                            break  # the rest of this chunk is read again from the cursor as committed
                if moved or offset + advanced < size:
                    still.append(item)
            active = still
        if (batch.pending or batch.cursors) and not self._stopped():
            stored += self._write(batch)[0]
        self.ingested_jobs = ingested
        self._forget_drained()
        return stored

    def _stopped(self) -> bool:
        return self._stopping is not None and self._stopping.is_set()

    def _expected(self, key: tuple[str, str]) -> int | None:
        state = self._files.get(key)
        return state.offset if state is not None and state.committed else None

    def _spool_spent(self, job_id: str, batch: _Batch) -> int:
        """The job's spool bytes read: up to each file's cursor (or as far as a long line was read)."""
        keys = {k for k in [*self._files, *self._scans] if k[0] == job_id}
        keys.update((c.job_id, c.file) for c in batch.cursors if c.job_id == job_id)
        return sum(max(batch.offset(k, self._files.get(k)), self._scans.get(k, (0, 0))[1]) for k in keys)

    def _spool_exhausted(self, job_id: str, limit: int, batch: _Batch) -> None:
        spent = self._spool_spent(job_id, batch)
        message = (
            f"spool limit {limit} bytes reached: {spent} bytes of metrics spool read, the job's spool files are no "
            "longer read (metrics.limits.spool)"
        )
        if self.store.budgets.note(job_id, "spool", message) and not batch.cursors and not batch.pending:
            self._write(batch)  # no batch of this pass may come to write the event: an empty one does

    def _long_line(self, job_id: str, line: int) -> None:
        message = f"line limit {line} bytes reached: a metrics spool line longer was skipped (metrics.limits.line)"
        self.store.budgets.note(job_id, "line", message)

    def _write(self, batch: _Batch) -> tuple[int, bool]:
        """One batch stored: (points stored, whether another reader moved a cursor of it first: nothing of it is
        stored then, the jobs' cursors are loaded again, and their files read on from there). On SQLite, the
        requests and tasks writing in this process go first (the database's ``WriteGate``)."""
        try:
            return self.store.write(batch.pending, batch.cursors, self._files), False
        except CursorMoved as exc:
            log.debug("%s; reading on from where it left them", exc)
            for job_id in sorted({job_id for job_id, _ in exc.moved}):
                self._forget(job_id)
                self._load_cursors(job_id)
            return 0, True

    def _read(self, key: tuple[str, str], path: Path, offset: int, line: int) -> tuple[bytes, int, int, bool, bool]:
        """(complete lines from offset, the offset read from, bytes consumed, whether those bytes are one line over
        ``line`` bytes that is skipped, whether bytes of a line still without its newline were read): from 0 where
        the file is shorter than offset now (replaced or truncated). At most ``max_bytes_per_file`` new bytes are
        read; bytes of a line whose newline has not come are never read twice (``_scans``), so a job writing one
        endless line costs the bytes it writes, once. A line longer than ``line`` is skipped once its newline
        comes; one within it is read again whole then (at most ``line`` bytes, once)."""
        try:
            with open_spool(path) as fh:
                # Asked of the open file, not of the listing at the pass's start: a cursor another reader moved
                # meanwhile may be past what the listing saw, and is no truncation.
                if os.fstat(fh.fileno()).st_size < offset:
                    offset = 0
                    self._scans.pop(key, None)
                scan = self._scans.get(key)
                if scan is not None and scan[0] == offset:
                    fh.seek(scan[1])
                    block = fh.read(self.max_bytes_per_file)
                    self.bytes_read += len(block)
                    newline = block.find(b"\n")
                    if newline < 0:
                        if block:
                            self._scans[key] = (offset, scan[1] + len(block))
                        return b"", offset, 0, False, bool(block)
                    del self._scans[key]
                    end = scan[1] + newline + 1
                    if end - offset - 1 > line:
                        return b"", offset, end - offset, True, True
                    fh.seek(offset)
                    data = fh.read(end - offset)
                    self.bytes_read += len(data)
                    return data, offset, len(data), False, True
                fh.seek(offset)
                data = fh.read(self.max_bytes_per_file)
                self.bytes_read += len(data)
        except OSError:
            return b"", offset, 0, False, False
        end = complete_lines(data)
        if end == 0 and data:
            self._scans[key] = (offset, offset + len(data))  # a line without its newline yet: read on from its end
            return b"", offset, 0, False, True
        return data[:end], offset, end, False, False

    def _forget_drained(self) -> None:
        """Jobs that stopped running and whose files are consumed (up to a partial line that will never end)."""
        old = time.monotonic() - 600  # ended jobs are looked for at most 2 minutes after their end
        for job_id in [j for j, at in self._done.items() if at < old]:
            del self._done[job_id]
        for job_id in list(self._draining):
            if job_id in self._running:
                self._draining.pop(job_id)
                continue
            directory = self.spools.metric_spool(job_id, self._draining[job_id].handle)
            drained = True
            # A job past its spool limit is never read again: what its files hold more does not keep it here (its
            # limits are looked up only for a file with unread bytes: most jobs' files are read to their end).
            spent: bool | None = None
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
                        if size <= offset:
                            continue
                        if spent is None:
                            spent = self._spool_spent(job_id, _Batch()) >= self.store.budgets.limits(job_id).spool
                        if spent:
                            continue
                        scan = self._scans.get((job_id, entry.name))
                        start = scan[1] if scan is not None and scan[0] == offset else offset  # read already
                        if has_newline(Path(entry.path), start):
                            drained = False
                            break
            except (FileNotFoundError, NotADirectoryError):
                pass
            if drained:
                job = self._draining.pop(job_id)
                if job.terminal:
                    self._done[job_id] = time.monotonic()
                self._forget(job_id)


class _Batch:
    """What a pass has read and not yet written: the parsed lines, the cursors they move, their points and the
    series they are of (an upper bound of the new series a write creates)."""

    def __init__(self) -> None:
        self.pending: list[tuple[str, Parsed, bool]] = []
        self.cursors: list[CursorUpdate] = []
        self.points = 0
        self.keys: set[tuple[str, str, str]] = set()
        self.new = 0  # series unknown to the writer (about those the write creates)

    def offset(self, key: tuple[str, str], state: _FileState | None) -> int:
        """Where the file is read on from: past what this batch read of it, else its committed cursor."""
        for cur in self.cursors:
            if cur.job_id == key[0] and cur.file == key[1]:
                return cur.offset
        return state.offset if state is not None else 0

    def add(self, key: tuple[str, str], expected: int | None, offset: int, parsed: Parsed, job: _Job) -> None:
        self.pending.append((job.id, parsed, job.gang))
        _merge_cursor(self.cursors, CursorUpdate(key[0], key[1], offset, parsed.errors, parsed.first_error, expected))
        self.points += parsed.count
        self.keys.update((job.id, *k) for k in parsed.series)


def _merge_cursor(cursors: list[CursorUpdate], new: CursorUpdate) -> None:
    for cur in cursors:
        if cur.job_id == new.job_id and cur.file == new.file:
            cur.offset = new.offset
            cur.errors += new.errors
            cur.first_error = cur.first_error or new.first_error
            return
    cursors.append(new)

"""Metrics from the logs of jobs whose backend runs no shim (Kubernetes pods), extracted on the server.

On the local executor each attempt's shim reads the job's log and spools the points it recognises
(``kiln.injob.extract``). A pod has no shim, but its output reaches Kiln's own log store (the Kubernetes
controller streams it there, tagged per member like the shim's lines), so the server runs the same extractor over
that file: built-in recognition and the spec's ``metrics.patterns``, keeping the names ``metrics.include`` and
``metrics.exclude`` let through, no change to the job. The points go to the same kind of spool files
(``log-a<attempt>-<member>.jsonl``, in the job's spool directory in this server's home:
kiln.metrics.spools.ServerSpools) that the ingester already reads, so storage, queries and exactly-once ingestion
are shared with every other source.

Where extraction stands is kept in that directory's ``logtail.json`` (attempt, byte offset), written after the points
before it are spooled: a server that stops resumes there (a crash between the two repeats at most one pass's
points). Until an ended job's log is read to its end, a ``draining-server`` marker keeps the ingester looking.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import and_, or_, select

from kiln.backends.capabilities import MetricSpools
from kiln.db.session import Database
from kiln.db.tables import Job, utcnow
from kiln.domain.states import TERMINAL_STATES, JobState
from kiln.domain.stored_spec import StoredSpec
from kiln.injob.extract import (
    _HINT_BYTES,
    DRAINING_PREFIX,
    MAX_LINE,
    Extractor,
    LogTail,
    Spool,
    log_time,
    spool_path,
)
from kiln.storage.logs import LogStore
from kiln.tasks.runner import Task, TaskContext

log = logging.getLogger(__name__)

STATE_FILE = "logtail.json"
MARKER = f"{DRAINING_PREFIX}server"
ACTIVE = [str(JobState.STARTING), str(JobState.RUNNING), str(JobState.RESTARTING)]
PASS_BYTES = 8 * 1024 * 1024  # at most this much of one job's log per pass (others get their turn)
RECENT = timedelta(minutes=10)  # ended jobs whose log is still read to its end
# Lines Kiln's own programs in a pod or on a Slurm node write into the job's output ("kiln-sync: ok checkpoints=1
# outputs=2 bytes=…"): reports of the platform, never the job's metrics.
IN_JOB_PROGRAMS = (b"kiln-sync: ", b"kiln-fetch: ", b"kiln: ")


class MemberTail(LogTail):
    """A log tail that serves every member of the job: each (stdout/stderr) line goes to its member's extractor
    and spool (``O@worker1`` → worker1; an untagged line → worker0)."""

    def __init__(self, path: str, offset: int, directory: str, attempt: int, metrics: dict[str, Any]) -> None:
        self.builtin = bool(metrics.get("builtin", True))
        self.patterns = list(metrics.get("patterns") or [])
        self.include = list(metrics.get("include") or [])  # the names kept (spec: metrics.include / exclude)
        self.exclude = list(metrics.get("exclude") or [])
        super().__init__(path, offset, "", self.new_extractor(), Spool(os.devnull, "", "log"))
        self.directory = directory
        self.attempt = attempt
        self.members: dict[bytes, tuple[Extractor, Spool]] = {}
        self.job_attempt = attempt  # the job's attempt now (the tail's own may still be reading an earlier one)

    def member(self, tag: bytes) -> tuple[Extractor, Spool]:
        found = self.members.get(tag)
        if found is None:
            name = tag.decode("ascii", "replace") or "worker0"
            spool = Spool(spool_path(self.directory, "log", self.attempt, name), name, "log")
            found = self.members[tag] = (self.new_extractor(spool.event), spool)
        return found

    def new_extractor(self, on_event: Callable[[str, str], None] | None = None) -> Extractor:
        return Extractor(self.builtin, self.patterns, on_event, include=self.include, exclude=self.exclude)

    def line(self, raw: bytes) -> None:
        parts = raw.split(b" ", 2)
        if len(parts) < 3:
            return
        stream, _, tag = parts[1].partition(b"@")
        if stream == b"K" and self.attempt < self.job_attempt:
            # Kiln's own line between two attempts ("attempt 1 failed (...); restarting", "preempted: ..."): what
            # follows is the next attempt's output.
            self.close_members()
            self.attempt += 1
            return
        if stream not in (b"O", b"E") or parts[2].startswith(IN_JOB_PROGRAMS):
            return
        if not self.patterns and not _HINT_BYTES.search(parts[2]):
            return
        extractor, spool = self.member(tag)
        t = log_time(parts[0].decode("ascii", "replace")) or time.time()
        text = parts[2][: MAX_LINE + 100].decode("utf-8", "replace")
        for pt, step, metrics in extractor.feed(t, text):
            spool.add(pt, step, metrics)

    def flush(self, final: bool = False) -> None:
        for extractor, spool in self.members.values():
            for t, step, metrics in extractor.flush(idle_only=not final):
                spool.add(t, step, metrics)
            spool.flush()

    def resume_offset(self) -> int:
        """Where a restarted server reads on from: before the line not yet complete."""
        return self.pos - len(self.partial)

    def close_members(self) -> None:
        self.flush(final=True)
        for _, spool in self.members.values():
            spool.close()
        self.members.clear()

    def close(self) -> None:
        self.finish()  # the last partial line and the pending lookahead windows
        self.close_members()


@dataclass
class _State:
    tail: MemberTail
    done: bool = False


class LogMetrics:
    """The server's extraction thread for the jobs of ``backends`` (those without a shim of their own)."""

    def __init__(
        self, db: Database, logs: LogStore, spools: MetricSpools, backends: Iterable[str], interval: float = 0.5
    ) -> None:
        """``spools``: where the spool files go (those the ingester reads: the server's own for such backends)."""
        self.db = db
        self.logs = logs
        self.spools = spools
        self.backends = sorted(set(backends))
        self.interval = interval
        self._tails: dict[str, _State] = {}

    def task(self) -> Task | None:
        """A pass every ``interval`` (None when no backend needs one); ``stop`` flushes what the tails hold."""
        if not self.backends:
            return None
        return Task("log-metrics", self._task_pass, self.interval, first_delay=self.interval, stop=self.stop)

    def _task_pass(self, ctx: TaskContext) -> None:
        self.run_once()

    def stop(self) -> None:
        """Keep what the open tails read so far (the task's last step, once its thread ended)."""
        for job_id, state in self._tails.items():
            if not state.done:
                state.tail.flush()
                self._save(state, job_id)

    def run_once(self) -> int:
        """One pass over the jobs; returns the bytes of log read."""
        since = utcnow() - RECENT
        with self.db.read() as s:
            rows = s.execute(
                select(Job.id, Job.attempt, Job.state, Job.spec).where(
                    Job.backend.in_(self.backends),
                    or_(
                        Job.state.in_(ACTIVE),
                        and_(Job.state.in_([str(x) for x in TERMINAL_STATES]), Job.finished_at > since),
                    ),
                )
            ).all()
        seen = set()
        read = 0
        for job_id, attempt, state, spec in rows:
            seen.add(job_id)
            metrics = StoredSpec(spec).metrics
            if not metrics.get("builtin", True) and not metrics.get("patterns"):
                continue
            read += self._job(job_id, max(1, attempt or 1), JobState(state) in TERMINAL_STATES, metrics)
        for job_id in [j for j in self._tails if j not in seen]:  # long ended: forget
            self._tails.pop(job_id)
        return read

    def _directory(self, job_id: str) -> Path:
        return self.spools.metric_spool(job_id, None)  # this server's own: no attempt writes there

    def _open(self, job_id: str, attempt: int, metrics: dict[str, Any]) -> _State:
        directory = self._directory(job_id)
        saved: dict[str, Any] = {}
        try:
            saved = json.loads((directory / STATE_FILE).read_text())
        except (OSError, ValueError):
            pass
        offset = int(saved.get("offset", 0)) if isinstance(saved.get("offset"), int) else 0
        at = int(saved["attempt"]) if isinstance(saved.get("attempt"), int) else attempt
        tail = MemberTail(
            str(self.logs.path(job_id)),
            offset,
            str(directory),
            at,
            metrics,
        )
        return _State(tail, bool(saved.get("done")) and at == attempt)

    def _job(self, job_id: str, attempt: int, ended: bool, metrics: dict[str, Any]) -> int:
        state = self._tails.get(job_id)
        if state is None:
            state = self._tails[job_id] = self._open(job_id, attempt, metrics)
        if state.done:
            return 0
        directory = self._directory(job_id)
        directory.mkdir(parents=True, exist_ok=True)
        # The marker exists from the first pass over a job (and is touched on every pass, so that it never looks
        # stale): when the job ends, the ingester must already see it, or it may forget the job before the last
        # lines are extracted.
        (directory / MARKER).touch()
        read = 0
        state.tail.job_attempt = attempt
        while read < PASS_BYTES:
            got = state.tail.read_chunk()
            if not got:
                break
            read += got
        if ended and state.tail.pos >= self.logs.size(job_id):
            state.tail.close()
            state.done = True
            self._save(state, job_id)
            (directory / MARKER).unlink(missing_ok=True)
            return read
        state.tail.flush()
        self._save(state, job_id)
        return read

    def _save(self, state: _State, job_id: str) -> None:
        path = self._directory(job_id) / STATE_FILE
        body = {"attempt": state.tail.attempt, "offset": state.tail.resume_offset(), "done": state.done}
        try:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(body))
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("job %s: saving where log extraction stands failed: %s", job_id, exc)

"""Starting attempts: ``backend.start`` for each attempt a reconcile pass committed STARTING, after that commit.

STARTING is committed first: after a crash between the commit and the start (or a start that raised) the next
observation finds the attempt never launched and launches it again, the same attempt (``loop.Reconciler``);
a backend's start is idempotent per attempt, so it is never run twice. A pass commits no more than it starts
before the next one.

Fenced like every leased write: a start is made under the job's lease. The pass that committed STARTING holds it
(it wrote the lease in that commit), so right after the commit nothing is read; a start that comes later than
``FENCE_SECONDS`` after it (the server was paused, a start was slow) first reads whether this server still holds
the leases of the rest, unexpired. A paused server that resumed after another took its jobs over starts nothing
of theirs: they are the other server's to launch (and were it to start one anyway, in the instant between the
look and the start, the attempt's claim runs it once).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from sqlalchemy import select

from kiln.backends.base import Backend, Launch, ResolvedInput
from kiln.db.session import Database
from kiln.db.tables import Job, utcnow
from kiln.domain.spec import JobSpec
from kiln.domain.states import JobState, Reason
from kiln.errors import BackendError, KilnError
from kiln.storage.logs import LogStore
from kiln.usecases.jobs.lifecycle import transition

log = logging.getLogger(__name__)

Attempt = tuple[str, int]  # (job id, attempt number)
FENCE_SECONDS = 0.25  # a start this long after the commit (or the last look) looks at the leases first


def start_failure(exc: KilnError) -> tuple[str, str]:
    """The reason and message a job fails with when its start is refused."""
    if not isinstance(exc, BackendError):
        return Reason.INPUT_ERROR, exc.message
    return (Reason.RUNTIME_ERROR if "runtime" in exc.message else Reason.BACKEND_ERROR), exc.message


class Starter:
    def __init__(
        self,
        db: Database,
        backend: Backend,
        inputs: Callable[[str, JobSpec], tuple[ResolvedInput, ...]],
        logs: LogStore | None = None,
        owner: str | None = None,
    ) -> None:
        """``logs``: a later attempt's log goes on from the store's copy of the earlier ones' (they may have
        run on another machine: ``LogStore.catch_up``). ``owner``: the server whose job leases the starts are
        made under (None: not fenced)."""
        self.db = db
        self.owner = owner
        self.logs = logs
        self.backend = backend
        self.inputs = inputs  # (org id, spec) → the spec's inputs resolved to files
        self.seconds = 0.01  # what one start took lately (moving average): how many a pass takes on

    def start(self, launches: list[Launch], committed_at: float | None = None) -> None:
        """Start the attempts in order. A start the backend refuses fails its job (one transaction for all of
        them); one that raises anything else is left STARTING, and the next observation launches it again (at
        most ``loop.MAX_LAUNCHES`` times), as after a crash between the commit and the start. ``committed_at``
        (``time.monotonic()``): when the transaction that wrote their leases committed (None: look first)."""
        if not launches:
            return
        failed: dict[Attempt, tuple[str, str]] = {}
        began = time.perf_counter()
        looked = committed_at if committed_at is not None else float("-inf")
        held: set[Attempt] | None = None  # None: all of them, as of ``looked``
        workers = max(1, min(len(launches), getattr(self.backend, "start_concurrency", 1)))
        if workers > 1:  # each start a round trip to a remote scheduler: made side by side, fenced once for all
            if self.owner is not None and time.monotonic() - looked > FENCE_SECONDS:
                held = self._held(launches)
            mine = [x for x in launches if held is None or (x.job_id, x.attempt) in held]
            self._not_held(x for x in launches if held is not None and (x.job_id, x.attempt) not in held)
            with ThreadPoolExecutor(workers, thread_name_prefix="kiln-start") as pool:
                for launch, why in zip(mine, pool.map(self._start_one, mine), strict=True):
                    if why is not None:
                        failed[(launch.job_id, launch.attempt)] = why
        else:
            for i, launch in enumerate(launches):
                if self.owner is not None and time.monotonic() - looked > FENCE_SECONDS:
                    held, looked = self._held(launches[i:]), time.monotonic()
                if held is not None and (launch.job_id, launch.attempt) not in held:
                    self._not_held([launch])
                    continue
                why = self._start_one(launch)
                if why is not None:
                    failed[(launch.job_id, launch.attempt)] = why
        self.seconds = 0.7 * self.seconds + 0.3 * (time.perf_counter() - began) / len(launches)
        if failed:
            self._fail(failed)

    def _start_one(self, launch: Launch) -> tuple[str, str] | None:
        """``backend.start`` for one attempt: the reason and message its job fails with if it was refused; None if
        it started, or if it raised otherwise (left STARTING: the next observation launches it again)."""
        try:
            if launch.spec.inputs:
                launch = replace(launch, inputs=self.inputs(launch.org_id, launch.spec))
            if launch.attempt > 1:
                self._catch_up_log(launch)
            self.backend.start(launch)
        except KilnError as exc:
            return start_failure(exc)
        except Exception:
            log.exception("job %s: starting attempt %d failed", launch.job_id, launch.attempt)
        return None

    @staticmethod
    def _not_held(launches: Iterable[Launch]) -> None:
        for launch in launches:
            job, attempt = launch.job_id, launch.attempt
            log.info("job %s: attempt %d not started: its lease is not this server's now", job, attempt)

    def _held(self, launches: list[Launch]) -> set[Attempt]:
        """The attempts among ``launches`` whose jobs this server holds the unexpired lease of, at that attempt."""
        wanted = {(launch.job_id, launch.attempt) for launch in launches}
        with self.db.read() as s:
            rows = s.execute(
                select(Job.id, Job.attempt).where(
                    Job.id.in_(sorted({job_id for job_id, _ in wanted})),
                    Job.lease_owner == self.owner,
                    Job.lease_expires_at > utcnow(),
                )
            )
            return {(job_id, attempt) for job_id, attempt in rows} & wanted

    def _catch_up_log(self, launch: Launch) -> None:
        """The store's copy of the earlier attempts' log into this server's file; a store that is down does not
        stop the start (the attempt's lines then follow what this server has of them)."""
        if self.logs is None:
            return
        try:
            self.logs.catch_up(launch.org_id, launch.job_id)
        except Exception as exc:
            log.warning("job %s: reading its log from the store failed: %s", launch.job_id, exc)

    def _fail(self, failed: dict[Attempt, tuple[str, str]]) -> None:
        """Fail the jobs whose attempts could not be started (where that attempt is still STARTING)."""
        with self.db.transaction() as s:
            for row in s.scalars(select(Job).where(Job.id.in_(sorted({job_id for job_id, _ in failed})))):
                why = failed.get((row.id, row.attempt))
                if why is not None and row.state == JobState.STARTING:
                    transition(s, row, JobState.FAILED, why[0], why[1])

"""What becomes of a job when the reconciler observes its attempt: a pure decision, no database, no I/O, no clock.

``decide`` reads what the job row says (``JobView``), the job's spec (its restart policy), and what observing the
attempt found (``Observed``: the backend's status, when the preemption notice went out, what was kept of the outputs),
and returns the ``Outcome``: the state to move to with its reason and message, whether a restart is spent, what to
do with the attempt's local files, and a line for the job's log. The reconciler (``scheduler.loop``) only carries it
out, in its pass's transaction, through ``usecases.lifecycle.transition``.

A new kind of attempt (a tuning trial, a serving replica) that ends differently gets a decision of its own next to
this one, tested the same way: a table of cases (tests/unit/scheduler/test_outcome.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from kiln.backends.base import AttemptStatus, Phase
from kiln.domain.spec import JobSpec
from kiln.domain.states import JobState, Reason

# Failures that a retry cannot fix: the spec itself is wrong, or the job's log is full (its limit is per job).
PERMANENT_REASONS = frozenset(
    {Reason.COMMAND_NOT_FOUND, Reason.RUNTIME_ERROR, Reason.CODE_ERROR, Reason.INPUT_ERROR, Reason.LOG_LIMIT_EXCEEDED}
)


@dataclass(frozen=True)
class JobView:
    """What the decision reads of the job row, as the pass's transaction holds it."""

    state: JobState
    attempt: int = 1
    restarts: int = 0
    cancel_requested: bool = False
    preempt_reason: str | None = None  # a higher-priority job asked for its place (the notice may have gone out)
    message: str = ""  # the job's message now: "cancel requested by ada" once a cancel was asked for

    @classmethod
    def of(cls, row: Any) -> JobView:
        """From a job row (``kiln.db.tables.Job``) or anything with the same attributes."""
        state = JobState(row.state)
        return cls(state, row.attempt, row.restarts, bool(row.cancel_requested), row.preempt_reason, row.message or "")

    def cancelled_as(self, detail: str) -> str:
        """The message of its cancelled end: who or what asked (``cancel requested by ada`` becomes ``cancelled by
        ada``), then what the attempt said of its end (``signal SIGTERM``), not that alone."""
        who = ""
        if self.message.startswith("cancel requested"):
            who = self.message.replace("cancel requested", "cancelled", 1)
        return "; ".join(part for part in (who, detail) if part) or "cancelled"


@dataclass(frozen=True)
class Observed:
    """What observing one attempt found, through the backend alone."""

    status: AttemptStatus
    preempt_sent_at: float | None = None  # when the preemption notice went out (epoch seconds), if it did
    copied: int = 0  # output files kept in the store
    copy_error: str = ""  # "; collecting outputs failed: ..." — appended to the message of an attempt that ended


@dataclass(frozen=True)
class Outcome:
    """The job's next state, and what else the reconciler writes or does once the pass commits."""

    state: JobState
    reason: str
    message: str
    ended: bool = False  # the attempt is over: the row records its exit code (and its kept outputs)
    exit_code: int | None = None
    # The attempt ran before it ended while the row still says STARTING: RUNNING ("the command started") first.
    started: bool = False
    restart: bool = False  # one restart is spent (the row's count goes up by one), not placed before ``not_before``
    not_before: datetime | None = None
    clear_preemption: bool = False  # the preemption it was asked for happened: the request is done
    # Once committed: free the attempt's local files (False), keep them a while for debugging (True,
    # KILN_WORK_RETENTION_SECONDS), or leave them (None: still running, or preempted, whose checkpoint dir the next
    # attempt reads).
    release: bool | None = None
    note: str | None = None  # a line for the job's log, once committed


# The move of an attempt first seen running, and the RUNNING step of one first seen when it had already ended.
STARTED = Outcome(JobState.RUNNING, Reason.STARTED, "the command is running")
STARTED_BEFORE_END = "the command started"


def decide(
    job: JobView, spec: JobSpec, seen: Observed, *, now: datetime, restart_backoff_seconds: float
) -> Outcome | None:
    """The outcome of observing the job's current attempt; None when nothing changes (still running as recorded,
    or still starting). ``now``: the time a restart's delay counts from."""
    status = seen.status
    if status.phase is Phase.STARTING:
        return None
    if status.phase is Phase.RUNNING:
        return STARTED if job.state is JobState.STARTING else None
    return _ended(job, spec, seen, now, restart_backoff_seconds)


def _ended(job: JobView, spec: JobSpec, seen: Observed, now: datetime, backoff: float) -> Outcome:
    """An attempt that exited or was lost."""
    status = seen.status
    started = job.state is JobState.STARTING and status.running_at is not None

    def end(state: JobState, reason: str, message: str, **extra: Any) -> Outcome:
        return Outcome(
            state, reason, message + seen.copy_error, ended=True, exit_code=status.exit_code, started=started, **extra
        )

    if job.cancel_requested or status.reason == Reason.CANCELLED:
        return end(JobState.CANCELLED, Reason.CANCELLED, job.cancelled_as(status.message), release=False)
    completed = status.phase is Phase.EXITED and status.reason == Reason.COMPLETED and status.exit_code == 0
    warned_at = seen.preempt_sent_at
    if completed and warned_at and status.finished_at and status.finished_at.timestamp() >= warned_at:
        completed = False  # it exited 0 after the notice: it stopped to be preempted, not because it was done
    if job.preempt_reason and not completed:
        # Stopped for a higher-priority job (whatever its exit code after the notice): back to the queue without
        # spending a restart; $KILN_CHECKPOINT_DIR is kept for the next attempt.
        message = f"{job.preempt_reason}; queued again (restarts used: {job.restarts})"
        return end(JobState.QUEUED, Reason.PREEMPTED, message, clear_preemption=True)
    if completed:
        message = f"exit code 0; {seen.copied} output file(s) kept"
        return end(JobState.SUCCEEDED, Reason.COMPLETED, message, release=False)
    reason = status.reason or Reason.ERROR
    message = status.message or f"exit code {status.exit_code}"
    restartable = (
        job.restarts < spec.max_restarts
        and reason not in PERMANENT_REASONS
        and (not spec.restart_on_exit_codes or status.exit_code in spec.restart_on_exit_codes)
    )
    if not restartable:
        return end(JobState.FAILED, reason, message, release=True)
    return end(
        JobState.RESTARTING,
        Reason.RESTART,
        f"{reason}: {message}; restart {job.restarts + 1} of {spec.max_restarts}",
        restart=True,
        not_before=now + timedelta(seconds=backoff),
        note=f"attempt {job.attempt} failed ({reason}); restarting",
    )

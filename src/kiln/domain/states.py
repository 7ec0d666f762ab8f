"""The job state machine: the states and the one FROM→TO table that every change is checked against."""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    QUEUED = "QUEUED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def active(self) -> bool:
        """Holds an allocation on a backend (a process or pod may exist)."""
        return self in (JobState.STARTING, JobState.RUNNING)


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

# Every legal move. Anything else raises IllegalTransition.
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.STARTING, JobState.CANCELLED, JobState.FAILED}),
    # → QUEUED: preempted by a higher-priority job; it waits again without spending a restart.
    JobState.STARTING: frozenset(
        {JobState.RUNNING, JobState.RESTARTING, JobState.FAILED, JobState.CANCELLED, JobState.QUEUED}
    ),
    JobState.RUNNING: frozenset(
        {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.RESTARTING, JobState.QUEUED}
    ),
    # A restart gives back the allocation and is placed again like a queued job.
    JobState.RESTARTING: frozenset({JobState.STARTING, JobState.FAILED, JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


class Reason(StrEnum):
    """Stable, machine-readable reasons written on events."""

    SUBMITTED = "Submitted"
    SCHEDULED = "Scheduled"
    STARTED = "Started"
    COMPLETED = "Completed"
    ERROR = "Error"
    COMMAND_NOT_FOUND = "CommandNotFound"
    PREPARE_FAILED = "PrepareFailed"
    FINISH_FAILED = "FinishFailed"
    TIMEOUT = "Timeout"
    OOM_KILLED = "OOMKilled"
    DISK_LIMIT_EXCEEDED = "DiskLimitExceeded"
    PIDS_LIMIT_EXCEEDED = "PidsLimitExceeded"
    LOG_LIMIT_EXCEEDED = "LogLimitExceeded"
    CANCEL_REQUESTED = "CancelRequested"
    CANCELLED = "Cancelled"
    RESTART = "Restarting"
    SHIM_LOST = "ShimLost"
    DISK_FULL = "DiskFull"
    NETWORK_ERROR = "NetworkError"
    BACKEND_ERROR = "BackendError"
    RUNTIME_ERROR = "RuntimeError"
    REATTACHED = "Reattached"
    ADOPTED = "Adopted"  # a restarted server found the attempt ended while no server ran: its outcome is kept
    RELAUNCHED = "Relaunched"  # the attempt was recorded STARTING but never launched: launched now
    # Another server's lease on the job ran out (it died, or stalled past it) and this one took the job over: the
    # message names both ("Adopted by B after A stopped renewing"), so a job's events say who ran it when.
    TAKEN_OVER = "TakenOver"
    INSUFFICIENT_RESOURCES = "InsufficientResources"
    CODE_ERROR = "CodeError"
    INPUT_ERROR = "InputError"
    PREEMPTING = "Preempting"
    PREEMPTED = "Preempted"
    WAITING = "Waiting"
    # Checkpoints or TensorBoard event files a running job wrote are not kept: they would pass its organisation's
    # storage quota (kiln.usecases.data.storage_gate); said once per job and kind, the job runs on.
    STORAGE_QUOTA_EXCEEDED = "StorageQuotaExceeded"
    BUDGET_WARNING = "BudgetWarning"  # a budget of the job's scope is past its soft limit (kiln.usecases.budgets)

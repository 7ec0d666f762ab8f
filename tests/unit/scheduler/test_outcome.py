"""scheduler.outcome.decide: what becomes of a job when its attempt is observed, one row per case.

No processes, no database: a job row as the decision reads it, the spec's restart policy, and the attempt's status
as a backend reports it. The messages are the ones users read in ``kiln jobs get`` and ``kiln jobs events``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kiln.backends.base import AttemptStatus, Phase
from kiln.domain.spec import JobSpec
from kiln.domain.states import TRANSITIONS, JobState
from kiln.scheduler.outcome import STARTED, JobView, Observed, Outcome, decide

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
RAN = NOW - timedelta(minutes=5)  # when the command started
ENDED = NOW - timedelta(seconds=10)  # when the attempt ended
NOTICE = (NOW - timedelta(seconds=30)).timestamp()  # when a preemption notice went out, before the end
LATE_NOTICE = (NOW - timedelta(seconds=1)).timestamp()  # a notice sent after the attempt had ended
PREEMPT = "preempted by job-hi (priority high)"
COPY_ERROR = "; collecting outputs failed: OSError: disk gone"
BACKOFF = 2.5

RUNNING = JobView(JobState.RUNNING, attempt=1)
STARTING = JobView(JobState.STARTING, attempt=1)


def exited(code: int | None, reason: str = "Error", message: str = "", *, ran: bool = True) -> AttemptStatus:
    return AttemptStatus(Phase.EXITED, code, reason, message, running_at=RAN if ran else None, finished_at=ENDED)


def lost(reason: str, message: str, *, ran: bool = True) -> AttemptStatus:
    return AttemptStatus(Phase.LOST, None, reason, message, running_at=RAN if ran else None, finished_at=ENDED)


COMPLETED = exited(0, "Completed")


@dataclass
class Case:
    id: str
    job: JobView
    status: AttemptStatus
    state: JobState | None  # None: nothing changes
    reason: str = ""
    message: str = ""
    spec: dict[str, Any] = field(default_factory=dict)  # max_restarts, restart_on_exit_codes
    seen: dict[str, Any] = field(default_factory=dict)  # preempt_sent_at, copied, copy_error
    expect: dict[str, Any] = field(default_factory=dict)  # other fields of the Outcome


CASES = [
    # -- attempts that have not ended ---------------------------------------------------------------------------
    Case("still-starting", STARTING, AttemptStatus(Phase.STARTING), None),
    Case("first-seen-running", STARTING, AttemptStatus(Phase.RUNNING, running_at=RAN), JobState.RUNNING,
         "Started", "the command is running"),
    Case("running-as-recorded", RUNNING, AttemptStatus(Phase.RUNNING, running_at=RAN), None),
    # -- success ------------------------------------------------------------------------------------------------
    Case("success", RUNNING, COMPLETED, JobState.SUCCEEDED, "Completed", "exit code 0; 3 output file(s) kept",
         seen={"copied": 3}, expect={"release": False, "exit_code": 0}),
    Case("success-seen-only-at-its-end", STARTING, COMPLETED, JobState.SUCCEEDED, "Completed",
         "exit code 0; 0 output file(s) kept", expect={"started": True, "release": False}),
    Case("success-outputs-not-kept", RUNNING, COMPLETED, JobState.SUCCEEDED, "Completed",
         "exit code 0; 0 output file(s) kept" + COPY_ERROR, seen={"copy_error": COPY_ERROR}),
    Case("success-after-restarts", JobView(JobState.RUNNING, attempt=3, restarts=2), COMPLETED, JobState.SUCCEEDED,
         "Completed", "exit code 0; 0 output file(s) kept", spec={"max_restarts": 2}),
    # -- failure ------------------------------------------------------------------------------------------------
    Case("failure-no-restarts", RUNNING, exited(3), JobState.FAILED, "Error", "exit code 3",
         expect={"release": True, "exit_code": 3, "restart": False}),
    Case("failure-without-a-reason", RUNNING, exited(1, ""), JobState.FAILED, "Error", "exit code 1"),
    Case("failure-outputs-not-kept", RUNNING, exited(2), JobState.FAILED, "Error", "exit code 2" + COPY_ERROR,
         seen={"copy_error": COPY_ERROR}),
    Case("failure-before-the-command-ran", STARTING, exited(None, "PrepareFailed", "prepare_command exited 1",
         ran=False), JobState.FAILED, "PrepareFailed", "prepare_command exited 1", expect={"started": False}),
    Case("command-not-found-is-never-retried", RUNNING, exited(127, "CommandNotFound", "nope: command not found"),
         JobState.FAILED, "CommandNotFound", "nope: command not found", spec={"max_restarts": 3}),
    Case("runtime-error-is-never-retried", STARTING, exited(None, "RuntimeError", "no runtime torch", ran=False),
         JobState.FAILED, "RuntimeError", "no runtime torch", spec={"max_restarts": 3}),
    Case("code-error-is-never-retried", STARTING, exited(None, "CodeError", "bundle missing", ran=False),
         JobState.FAILED, "CodeError", "bundle missing", spec={"max_restarts": 3}),
    Case("input-error-is-never-retried", STARTING, exited(None, "InputError", "dataset gone", ran=False),
         JobState.FAILED, "InputError", "dataset gone", spec={"max_restarts": 3}),
    # -- restarts -----------------------------------------------------------------------------------------------
    Case("restart-within-max-restarts", RUNNING, exited(3), JobState.RESTARTING, "Restarting",
         "Error: exit code 3; restart 1 of 2", spec={"max_restarts": 2},
         expect={"restart": True, "not_before": NOW + timedelta(seconds=BACKOFF), "release": None,
                 "note": "attempt 1 failed (Error); restarting"}),
    Case("last-restart", JobView(JobState.RUNNING, attempt=2, restarts=1), exited(3), JobState.RESTARTING,
         "Restarting", "Error: exit code 3; restart 2 of 2", spec={"max_restarts": 2},
         expect={"note": "attempt 2 failed (Error); restarting"}),
    Case("restarts-used-up", JobView(JobState.RUNNING, attempt=3, restarts=2), exited(3), JobState.FAILED, "Error",
         "exit code 3", spec={"max_restarts": 2}, expect={"release": True, "note": None}),
    Case("restart-on-a-listed-exit-code", RUNNING, exited(3), JobState.RESTARTING, "Restarting",
         "Error: exit code 3; restart 1 of 3", spec={"max_restarts": 3, "restart_on_exit_codes": [3, 4]}),
    Case("no-restart-on-an-unlisted-exit-code", RUNNING, exited(5), JobState.FAILED, "Error", "exit code 5",
         spec={"max_restarts": 3, "restart_on_exit_codes": [3, 4]}),
    Case("restart-message-keeps-the-copy-error", RUNNING, exited(1), JobState.RESTARTING, "Restarting",
         "Error: exit code 1; restart 1 of 1" + COPY_ERROR, spec={"max_restarts": 1},
         seen={"copy_error": COPY_ERROR}),
    # -- limits -------------------------------------------------------------------------------------------------
    Case("oom-killed", RUNNING, exited(137, "OOMKilled", "the job used more than its 512 MiB of memory"),
         JobState.FAILED, "OOMKilled", "the job used more than its 512 MiB of memory"),
    Case("oom-killed-restarts", RUNNING, exited(137, "OOMKilled", "over memory"), JobState.RESTARTING, "Restarting",
         "OOMKilled: over memory; restart 1 of 1", spec={"max_restarts": 1}),
    Case("disk-limit-exceeded", RUNNING, exited(None, "DiskLimitExceeded", "work dir above 1 GiB"),
         JobState.FAILED, "DiskLimitExceeded", "work dir above 1 GiB"),
    Case("timeout", RUNNING, exited(None, "Timeout", "ran longer than its timeout of 1s"), JobState.FAILED,
         "Timeout", "ran longer than its timeout of 1s", expect={"exit_code": None}),
    Case("timeout-restarts", RUNNING, exited(None, "Timeout", "too long"), JobState.RESTARTING, "Restarting",
         "Timeout: too long; restart 1 of 1", spec={"max_restarts": 1}),
    # -- cancellation -------------------------------------------------------------------------------------------
    Case("cancel-requested", JobView(JobState.RUNNING, cancel_requested=True), exited(143, "Cancelled",
         "cancelled by ann"), JobState.CANCELLED, "Cancelled", "cancelled by ann", expect={"release": False}),
    Case("cancel-requested-any-exit", JobView(JobState.RUNNING, cancel_requested=True), exited(0, "Completed"),
         JobState.CANCELLED, "Cancelled", "cancelled", spec={"max_restarts": 3}),
    # Who asked, then what the shim saw: not "signal SIGTERM" alone (issue 46).
    Case("cancel-says-who", JobView(JobState.RUNNING, cancel_requested=True, message="cancel requested by ada"),
         exited(143, "Cancelled", "signal SIGTERM"), JobState.CANCELLED, "Cancelled",
         "cancelled by ada; signal SIGTERM"),
    Case("cancel-says-why", JobView(JobState.RUNNING, cancel_requested=True, message="cancel requested: budget spent"),
         exited(143, "Cancelled", ""), JobState.CANCELLED, "Cancelled", "cancelled: budget spent"),
    Case("cancelled-by-the-backend", RUNNING, exited(None, "Cancelled", ""), JobState.CANCELLED, "Cancelled",
         "cancelled", spec={"max_restarts": 3}),
    Case("cancel-wins-over-preemption", JobView(JobState.RUNNING, cancel_requested=True, preempt_reason=PREEMPT),
         exited(143, "Cancelled", "stopped"), JobState.CANCELLED, "Cancelled", "stopped" + COPY_ERROR,
         seen={"copy_error": COPY_ERROR}),
    Case("cancelled-before-the-command-ran", JobView(JobState.STARTING, cancel_requested=True),
         exited(None, "Cancelled", "cancelled by ann", ran=False), JobState.CANCELLED, "Cancelled",
         "cancelled by ann", expect={"started": False}),
    # -- preemption ---------------------------------------------------------------------------------------------
    Case("preempted", JobView(JobState.RUNNING, restarts=1, preempt_reason=PREEMPT), exited(143, "Preempted", "x"),
         JobState.QUEUED, "Preempted", f"{PREEMPT}; queued again (restarts used: 1)", spec={"max_restarts": 3},
         seen={"preempt_sent_at": NOTICE},
         expect={"clear_preemption": True, "restart": False, "release": None, "note": None}),
    Case("preempted-exit-0-after-the-notice", JobView(JobState.RUNNING, preempt_reason=PREEMPT), COMPLETED,
         JobState.QUEUED, "Preempted", f"{PREEMPT}; queued again (restarts used: 0)",
         seen={"preempt_sent_at": NOTICE}, expect={"clear_preemption": True}),
    Case("finished-before-the-notice", JobView(JobState.RUNNING, preempt_reason=PREEMPT), COMPLETED,
         JobState.SUCCEEDED, "Completed", "exit code 0; 1 output file(s) kept",
         seen={"preempt_sent_at": LATE_NOTICE, "copied": 1}, expect={"clear_preemption": False}),
    Case("finished-with-the-notice-not-sent-yet", JobView(JobState.RUNNING, preempt_reason=PREEMPT), COMPLETED,
         JobState.SUCCEEDED, "Completed", "exit code 0; 0 output file(s) kept"),
    Case("exit-0-after-a-notice-without-preemption", RUNNING, COMPLETED, JobState.RESTARTING, "Restarting",
         "Completed: exit code 0; restart 1 of 1", spec={"max_restarts": 1}, seen={"preempt_sent_at": NOTICE}),
    Case("preempted-lost-attempt", JobView(JobState.RUNNING, preempt_reason=PREEMPT), lost("ShimLost", "gone"),
         JobState.QUEUED, "Preempted", f"{PREEMPT}; queued again (restarts used: 0)" + COPY_ERROR,
         seen={"copy_error": COPY_ERROR}),
    Case("preempted-while-starting", JobView(JobState.STARTING, preempt_reason=PREEMPT),
         exited(None, "Preempted", "", ran=False), JobState.QUEUED, "Preempted",
         f"{PREEMPT}; queued again (restarts used: 0)", expect={"started": False}),
    # -- lost attempts ------------------------------------------------------------------------------------------
    Case("lost-shim", RUNNING, lost("ShimLost", "the shim vanished: tail"), JobState.FAILED, "ShimLost",
         "the shim vanished: tail", expect={"release": True, "exit_code": None}),
    Case("lost-shim-restarts", RUNNING, lost("ShimLost", "the shim vanished"), JobState.RESTARTING, "Restarting",
         "ShimLost: the shim vanished; restart 1 of 1", spec={"max_restarts": 1},
         expect={"note": "attempt 1 failed (ShimLost); restarting"}),
    Case("never-started-after-a-crash", STARTING, lost("ShimLost", "the attempt was never started", ran=False),
         JobState.RESTARTING, "Restarting", "ShimLost: the attempt was never started; restart 1 of 1",
         spec={"max_restarts": 1}, expect={"started": False}),
    Case("lost-disk-full", RUNNING, lost("DiskFull", "disk full: the exit record could not be written"),
         JobState.FAILED, "DiskFull", "disk full: the exit record could not be written"),
    Case("lost-node", STARTING, lost("NodeLost", "node n1 went away"), JobState.FAILED, "NodeLost",
         "node n1 went away", expect={"started": True}),
    Case("lost-without-a-reason", RUNNING, lost("", ""), JobState.FAILED, "Error", "exit code None"),
    # -- gangs (the backend sums up the members: the first member that failed speaks for the attempt) -----------
    Case("gang-all-workers-exited-0", RUNNING, exited(0, "Completed", "all 4 workers exited 0"), JobState.SUCCEEDED,
         "Completed", "exit code 0; 2 output file(s) kept", seen={"copied": 2}),
    Case("gang-member-failed", RUNNING, exited(3, "Error", "worker 1: exit code 3"), JobState.FAILED, "Error",
         "worker 1: exit code 3"),
    Case("gang-member-failed-restarts", RUNNING, exited(3, "Error", "worker 1: exit code 3"), JobState.RESTARTING,
         "Restarting", "Error: worker 1: exit code 3; restart 1 of 2", spec={"max_restarts": 2}),
    Case("gang-member-lost", RUNNING, lost("ShimLost", "ps 0: the shim vanished"), JobState.FAILED, "ShimLost",
         "ps 0: the shim vanished"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_decide(case: Case) -> None:
    spec = JobSpec.model_validate({"command": "python train.py", **case.spec})
    outcome = decide(case.job, spec, Observed(case.status, **case.seen), now=NOW, restart_backoff_seconds=BACKOFF)
    if case.state is None:
        assert outcome is None
        return
    assert outcome is not None
    assert (outcome.state, outcome.reason, outcome.message) == (case.state, case.reason, case.message)
    for name, value in case.expect.items():
        assert getattr(outcome, name) == value, name
    # Every move the reconciler will make with it is in the FROM→TO table.
    before = case.job.state
    if outcome.started:
        assert JobState.RUNNING in TRANSITIONS[before]
        before = JobState.RUNNING
    assert outcome.state in TRANSITIONS[before]


@pytest.mark.parametrize("case", [c for c in CASES if c.state is not None and c.status.phase is not Phase.RUNNING])
def test_an_ended_attempt_always_records_its_exit(case: Case) -> None:
    spec = JobSpec.model_validate({"command": "true", **case.spec})
    outcome = decide(case.job, spec, Observed(case.status, **case.seen), now=NOW, restart_backoff_seconds=BACKOFF)
    assert outcome is not None and outcome.ended and outcome.exit_code == case.status.exit_code
    # Only a restart is delayed, only a restart leaves a line in the job's log, only a restart spends one.
    assert (outcome.not_before is not None) == outcome.restart == (outcome.note is not None)
    # Files: freed after a success or a cancel, kept a while after a failure, left for the next attempt otherwise.
    expected = {JobState.SUCCEEDED: False, JobState.CANCELLED: False, JobState.FAILED: True}.get(outcome.state)
    assert outcome.release is expected


def test_the_first_sighting_of_a_running_attempt_is_one_value() -> None:
    seen = Observed(AttemptStatus(Phase.RUNNING, running_at=RAN))
    spec = JobSpec.model_validate({"command": "true"})
    assert decide(STARTING, spec, seen, now=NOW, restart_backoff_seconds=0) is STARTED
    assert Outcome(JobState.RUNNING, "Started", "the command is running") == STARTED
    assert not STARTED.ended and STARTED.release is None


def test_job_view_reads_a_row() -> None:
    @dataclass
    class Row:
        state: str = "RUNNING"
        attempt: int = 4
        restarts: int = 3
        cancel_requested: bool | None = None
        preempt_reason: str | None = PREEMPT
        message: str | None = None

    assert JobView.of(Row()) == JobView(JobState.RUNNING, 4, 3, False, PREEMPT, "")

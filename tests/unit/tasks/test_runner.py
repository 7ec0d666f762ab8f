"""The task runner: each task on its own thread, a failing run recorded (and logged once per distinct error)
without stopping the task, a wake-up runs a task before its interval, stop ends every thread."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable

import pytest

from kiln.db.session import Database
from kiln.tasks.leases import TaskLeases
from kiln.tasks.runner import BACKOFF_MAX_SECONDS, LeaseLost, Task, TaskContext, TaskRunner, TaskStatus, error_pause
from tests.kilnserver import free_port


def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def status_of(runner: TaskRunner, name: str) -> TaskStatus:
    return next(x for x in runner.status() if x.name == name)


def test_a_failing_run_is_recorded_logged_once_and_the_task_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    def flaky(ctx: TaskContext) -> None:
        calls.append(1)
        if len(calls) <= 3:
            raise OSError("store unreachable")

    runner = TaskRunner()
    runner.add(Task("flaky", flaky, interval=0.01))
    with caplog.at_level(logging.INFO, logger="kiln.tasks.runner"):
        runner.start()
        until(lambda: status_of(runner, "flaky").last_ok is True)
        runner.stop()
    status = status_of(runner, "flaky")
    assert status.errors == 3 and status.runs >= 4
    assert status.last_error == "OSError: store unreachable"  # kept after the task recovered
    assert status.last_error_at is not None and status.last_finished is not None
    assert status.last_duration is not None and status.last_duration >= 0
    assert status.running is False
    failures = [r for r in caplog.records if "background task flaky failed" in r.getMessage()]
    assert len(failures) == 1, "the same error again is not logged again"
    assert failures[0].exc_info is not None  # with its traceback
    assert any(r.getMessage() == "background task flaky runs again" for r in caplog.records)
    assert status.as_dict()["last_error"] == "OSError: store unreachable"


def test_a_run_that_lost_its_lease_ends_quietly_and_the_task_keeps_its_schedule(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def stale(ctx: TaskContext) -> None:
        raise LeaseLost(ctx.name, "scope", 1)  # what ctx.transaction() and ctx.fence() raise for a stale token

    runner = TaskRunner()
    runner.add(Task("stale", stale, interval=0.01))
    with caplog.at_level(logging.INFO, logger="kiln.tasks.runner"):
        runner.start()
        until(lambda: status_of(runner, "stale").runs >= 3)
        runner.stop()
    status = status_of(runner, "stale")
    assert status.errors == 0 and status.last_error is None and status.last_ok is True, "not an error"
    assert status.holds_lease is False and status.token is None
    assert any("another server holds the lease of 'scope'" in r.getMessage() for r in caplog.records)


def test_a_different_error_is_logged_again(caplog: pytest.LogCaptureFixture) -> None:
    errors = iter([ValueError("a"), ValueError("a"), KeyError("b")])

    def failing(ctx: TaskContext) -> None:
        raise next(errors, RuntimeError("c"))

    runner = TaskRunner()
    runner.add(Task("failing", failing, interval=0.01))
    with caplog.at_level(logging.ERROR, logger="kiln.tasks.runner"):
        runner.start()
        until(lambda: status_of(runner, "failing").errors >= 4)
        runner.stop()
    logged = [r.getMessage().split(": ", 1)[1] for r in caplog.records if "failed" in r.getMessage()]
    assert logged[:3] == ["ValueError: a", "KeyError: 'b'", "RuntimeError: c"]


def test_wake_runs_a_task_before_its_interval_and_says_it_was_woken() -> None:
    seen: list[bool] = []
    task = Task("sleepy", lambda ctx: seen.append(ctx.woken), interval=3600)
    runner = TaskRunner()
    runner.add(task)
    runner.start()
    until(lambda: len(seen) == 1)  # the first run is at once, not woken
    runner.wake("sleepy")
    until(lambda: len(seen) == 2)
    task.wake.set()  # the task's own event: what the reconciler's wake() sets
    until(lambda: len(seen) == 3)
    next_due = status_of(runner, "sleepy").next_due
    assert next_due is not None and next_due > time.time() + 3000
    runner.stop()
    assert seen == [False, True, True]


def test_run_once_may_ask_for_the_next_run_sooner() -> None:
    runs: list[float] = []

    def backlog(ctx: TaskContext) -> float | None:
        runs.append(time.monotonic())
        return 0.0 if len(runs) < 5 else None  # a backlog: again at once, then the (long) interval

    runner = TaskRunner()
    runner.add(Task("backlog", backlog, interval=3600))
    runner.start()
    until(lambda: len(runs) == 5)
    time.sleep(0.2)
    runner.stop()
    assert len(runs) == 5


def test_stop_ends_every_thread_ends_a_long_run_and_calls_each_stop_hook() -> None:
    stopped: list[str] = []
    started = threading.Event()

    def long_run(ctx: TaskContext) -> None:
        started.set()
        ctx.stopping.wait(30)  # a long run checks the runner's stop event between items

    runner = TaskRunner()
    runner.add(Task("long", long_run, interval=0.01, stop=lambda: stopped.append("long")))
    runner.add(Task("idle", lambda ctx: None, interval=3600, stop=lambda: stopped.append("idle")))
    runner.start()
    assert started.wait(10)
    began = time.monotonic()
    runner.stop()
    assert time.monotonic() - began < 5
    assert not [t for t in threading.enumerate() if t.name.startswith("kiln-task-") and t.is_alive()]
    assert sorted(stopped) == ["idle", "long"]
    assert all(not x.running for x in runner.status())


def test_a_task_name_is_unique_and_a_scope_needs_leases() -> None:
    runner = TaskRunner()
    runner.add(Task("one", lambda ctx: None, interval=1))
    with pytest.raises(ValueError, match="a task named 'one' is registered already"):
        runner.add(Task("one", lambda ctx: None, interval=1))
    with pytest.raises(ValueError, match="task 'scoped' has a lease scope, and this runner has no leases"):
        runner.add(Task("scoped", lambda ctx: None, interval=1, lease_scope="x"))


def test_the_pause_after_failures_in_a_row_doubles_up_to_its_bound() -> None:
    assert [error_pause(0.2, n) for n in range(1, 8)] == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    assert [error_pause(60, n) for n in range(1, 5)] == [1.0, 2.0, 4.0, 5.0]  # the first pause is at most 1 s
    assert error_pause(0.01, 10_000) == BACKOFF_MAX_SECONDS


def test_failing_runs_back_off_and_the_first_success_ends_the_back_off() -> None:
    starts: list[float] = []
    failing = threading.Event()
    failing.set()

    def run(ctx: TaskContext) -> None:
        starts.append(time.monotonic())
        if failing.is_set():
            raise ConnectionError("the database is gone")

    task = Task("backing-off", run, interval=0.05)
    runner = TaskRunner()
    runner.add(task)
    runner.start()
    until(lambda: len(starts) >= 5)
    for _ in range(20):
        task.wake.set()  # wake-ups do not cut a back-off short
        time.sleep(0.01)
    failing.clear()
    until(lambda: status_of(runner, "backing-off").last_ok is True)
    recovered = len(starts)
    until(lambda: len(starts) >= recovered + 3)
    runner.stop()
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    # After the n-th failure: a pause of 0.05 * 2^(n-1) s, then the interval.
    for n, gap in enumerate(gaps[:4], start=1):
        assert gap >= error_pause(0.05, n) + 0.05 - 0.01, gaps
    assert gaps[4] >= error_pause(0.05, 5) - 0.01, gaps  # woken meanwhile: the interval may be cut, not the pause
    assert all(gap < 1.0 for gap in gaps[recovered:]), f"the back-off outlived the failures: {gaps}"


def test_a_lease_the_unreachable_database_cannot_give_is_a_failed_run_that_backs_off() -> None:
    """A scoped task whose database is down (nothing listens on its port): the run does not happen, the error is
    recorded as the task's (what /readyz and /metrics report), the lease is not held, and it tries again with
    back-off rather than at every interval."""
    db = Database(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/gone")
    runs: list[int] = []
    runner = TaskRunner(TaskLeases(db, "server-a"))
    runner.add(Task("scoped", lambda ctx: runs.append(1), interval=0.05, lease_scope="scoped"))
    try:
        runner.start()
        time.sleep(1.5)
        runner.stop()
    finally:
        db.dispose()
    status = status_of(runner, "scoped")
    assert runs == [], "a run without its lease"
    assert status.last_ok is False and status.holds_lease is False and status.token is None
    assert status.last_error is not None
    assert status.last_error.startswith("DatabaseUnavailable: the database is unavailable"), status.last_error
    # Pauses of 0.05, 0.1, 0.2, 0.4, 0.8 s (each then the interval): at most 5 tries in 1.5 s, not 15 or more.
    assert 1 <= status.errors <= 6, status.errors

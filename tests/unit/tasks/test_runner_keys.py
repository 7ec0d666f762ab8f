"""A task with keys (one piece of work per key live now: a Kubernetes pod whose log is followed): the runner gives
each key a thread of its own as the key appears (at once when woken), ends it once the key is gone, reports the keys
together as one task, and stops every key's thread (interrupting a blocked run) when it stops."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from kiln.tasks.runner import Task, TaskContext, TaskRunner, TaskStatus


def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def status_of(runner: TaskRunner, name: str) -> TaskStatus:
    return next(x for x in runner.status() if x.name == name)


class Streams:
    """Keys whose runs each block until the key is released (as a pod's log stream does until the pod ends)."""

    def __init__(self) -> None:
        self.live: set[str] = set()
        self.released: dict[str, threading.Event] = {}
        self.threads: dict[str, set[str]] = {}  # key → the names of the threads its runs ran on
        self.lock = threading.Lock()

    def keys(self) -> list[str]:
        with self.lock:
            return sorted(self.live)

    def add(self, key: str) -> None:
        with self.lock:
            self.live.add(key)
            self.released[key] = threading.Event()

    def run(self, ctx: TaskContext) -> float | None:
        with self.lock:
            self.threads.setdefault(ctx.key, set()).add(threading.current_thread().name)
            released = self.released[ctx.key]
        released.wait(30)
        with self.lock:
            self.live.discard(ctx.key)  # done: the key leaves, and its thread ends
        return None

    def interrupt(self) -> None:
        for event in list(self.released.values()):
            event.set()


def key_threads(name: str) -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith(f"kiln-task-{name}["))


def test_each_key_runs_on_a_thread_of_its_own_until_its_key_is_gone() -> None:
    streams = Streams()
    task = Task("streams", streams.run, interval=30.0, keys=streams.keys, interrupt=streams.interrupt)
    runner = TaskRunner()
    runner.add(task)
    runner.start()
    try:
        # The interval is 30 s: a key added, then the task woken, starts at once.
        streams.add("pod-a")
        streams.add("pod-b")
        task.wake.set()
        until(lambda: set(streams.threads) == {"pod-a", "pod-b"})
        assert streams.threads == {"pod-a": {"kiln-task-streams[pod-a]"}, "pod-b": {"kiln-task-streams[pod-b]"}}
        until(lambda: status_of(runner, "streams").active == 2)
        assert key_threads("streams") == ["kiln-task-streams[pod-a]", "kiln-task-streams[pod-b]"]

        streams.released["pod-a"].set()  # its stream ended: the key leaves, its thread ends
        until(lambda: key_threads("streams") == ["kiln-task-streams[pod-b]"])
        until(lambda: status_of(runner, "streams").active == 1)
        status = status_of(runner, "streams")
        assert status.runs == 1 and status.errors == 0 and status.running is True
        assert [x.name for x in runner.status()] == ["streams"], "the keys are reported as one task"
        assert status.as_dict()["name"] == "streams"

        clock = time.monotonic()
        runner.stop()  # pod-b's run is blocked: the task's interrupt ends it
        assert time.monotonic() - clock < 5
        assert key_threads("streams") == []
    finally:
        runner.stop()
    status = status_of(runner, "streams")
    assert status.running is False and status.active == 0 and status.runs == 2


def test_a_key_whose_run_fails_is_recorded_under_its_task_and_tried_again() -> None:
    calls: list[str] = []
    live = {"pod-a"}

    def run(ctx: TaskContext) -> float:
        calls.append(ctx.key)
        if len(calls) <= 2:
            raise OSError("stream refused")
        live.discard(ctx.key)
        return 0.0

    runner = TaskRunner()
    runner.add(Task("flaky-streams", run, interval=0.01, keys=lambda: sorted(live)))
    runner.start()
    try:
        until(lambda: not live)
        until(lambda: key_threads("flaky-streams") == [])
    finally:
        runner.stop()
    status = status_of(runner, "flaky-streams")
    assert calls == ["pod-a"] * 3
    assert (status.runs, status.errors, status.last_ok) == (3, 2, True)
    assert status.last_error == "OSError: stream refused"


def test_keys_that_cannot_be_read_are_an_error_of_the_task_and_stop_nothing() -> None:
    reads: list[int] = []

    def keys() -> list[str]:
        reads.append(1)
        if len(reads) == 1:
            raise RuntimeError("cache not ready")
        return []

    task = Task("unready", lambda ctx: None, interval=0.01, keys=keys)
    runner = TaskRunner()
    runner.add(task)
    runner.start()
    try:
        until(lambda: len(reads) >= 3)
    finally:
        runner.stop()
    assert status_of(runner, "unready").last_error == "RuntimeError: cache not ready"


def test_a_task_with_keys_has_no_lease_scope() -> None:
    runner = TaskRunner()
    with pytest.raises(ValueError, match="keys"):
        runner.add(Task("x", lambda ctx: None, 1.0, lease_scope="x", keys=lambda: ()))

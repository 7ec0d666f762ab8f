"""``metrics.watch`` on the local executor, with real shims: a point of a watched metric (a study's objective) is in
the job's spool file as soon as the job prints it, and the shim then tells the server (``metrics_ready``) — the
server reads it and its pruner judges it at once, rather than at the next batch (0.1 s), the next look at a quiet log
(0.2 s) and the next ingestion pass (0.25 s). Issue 26: pruned trials ran 5-39 epochs past the verdict.

A job that watches nothing never asks; a watched point printed to the log and one written by ``kiln.log`` both do.
The backend listens for the shims' notes in its background work, which the server's task runner runs (here a runner
of the test's own): it starts no thread of its own.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln.backends.base import Launch, Phase
from kiln.backends.local.executor import LocalBackend
from kiln.backends.local.runtimes import RuntimeManager
from kiln.domain.catalog import DEFAULT_CATALOG
from kiln.domain.spec import JobSpec
from kiln.settings import Settings
from kiln.storage.logs import LogStore
from kiln.storage.store import ObjectStore
from kiln.tasks.backend_work import backend_tasks
from kiln.tasks.runner import TaskRunner
from tests.kilnserver import TEST_PYTHON_ROOTS

# Prints a watched point, then waits for the test to say it saw the wake-up (or gives up after 20 s).
PRINTS = """
import os, sys, time
print("epoch=1 score=0.5", flush=True)
go = os.path.join(os.environ["KILN_WORK_DIR"], "go")
deadline = time.time() + 20
while not os.path.exists(go) and time.time() < deadline:
    time.sleep(0.01)
"""
LOGS = PRINTS.replace('print("epoch=1 score=0.5", flush=True)', 'import kiln; kiln.log({"score": 0.5}, step=1)')


class Ready:
    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []
        self.event = threading.Event()

    def __call__(self, job_id: str) -> None:
        self.calls.append((job_id, time.monotonic()))
        self.event.set()


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[tuple[LocalBackend, Ready]]:
    settings = Settings(
        home=tmp_path / "home", instance_id="watch", cpus=2, allowed_python_roots=[Path(p) for p in TEST_PYTHON_ROOTS]
    )
    ready = Ready()
    runtimes = RuntimeManager(DEFAULT_CATALOG, settings.home / "runtimes")
    store = ObjectStore(str(settings.home / "store"))
    threads = set(threading.enumerate())
    local = LocalBackend(
        settings, store, LogStore(settings.home / "logs"), runtimes, wake=lambda _job: None, metrics_ready=ready
    )
    started = [t.name for t in set(threading.enumerate()) - threads]
    assert started == [], f"the backend started threads of its own: {started}"
    runner = TaskRunner()
    for task in backend_tasks(local):
        runner.add(task)
    assert {task.name for task in runner.tasks()} >= {"shim-notify", "backend-sweep"}
    runner.start()
    try:
        yield local, ready
    finally:
        runner.stop()
        local.close()


def _run(local: LocalBackend, ready: Ready, job_id: str, script: str, watch: list[str]) -> list[tuple[str, float]]:
    spec = JobSpec.model_validate(
        {"command": [sys.executable, "-c", script], "runtime": {"python": sys.executable}, "metrics": {"watch": watch}}
    )
    launch = Launch(job_id, "org-1", 1, spec, cpus=1, memory=None, gpus=(), code_key=None)
    handle = local.start(launch)
    work = local.settings.jobs_dir / job_id / "work"
    # The job waits (up to 20 s) for this: a wake-up long before then is the watched point's, not the job's end.
    ready.event.wait(15)
    calls = list(ready.calls)
    (work / "go").touch()
    deadline = time.monotonic() + 30
    while local.poll(handle).phase is not Phase.EXITED:
        assert time.monotonic() < deadline, local.poll(handle)
        time.sleep(0.05)
    return calls


@pytest.mark.parametrize(("script", "spool"), [(PRINTS, "log-"), (LOGS, "sdk-")], ids=["printed", "kiln.log"])
def test_a_watched_point_wakes_the_server_while_the_job_runs(
    backend: tuple[LocalBackend, Ready], script: str, spool: str
) -> None:
    local, ready = backend
    calls = _run(local, ready, "job-watched", script, ["SCORE"])  # matched without regard to case
    assert calls and {job for job, _ in calls} == {"job-watched"}, calls
    metrics = local.settings.jobs_dir / "job-watched" / "metrics"
    written = [p for p in metrics.iterdir() if p.name.startswith(spool)]
    assert written and any('"score":0.5' in p.read_text().replace(" ", "") for p in written), written


def test_a_job_that_watches_nothing_never_wakes_it(backend: tuple[LocalBackend, Ready]) -> None:
    local, ready = backend
    ready.event.set()  # do not wait for a call that must not come
    spec_calls = _run(local, ready, "job-unwatched", PRINTS, [])
    time.sleep(0.5)  # the shim's last batch, at its exit
    assert spec_calls == [] and ready.calls == [], ready.calls

"""Small helpers shared by integration and e2e tests."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

from kiln.backends.base import Backend
from kiln.db import migrate
from kiln.db.session import Database
from kiln.db.tables import Job, Organization, User
from kiln.domain.schemas import JobRead
from kiln.domain.states import JobState
from kiln.sdk.client import Client
from kiln.tasks.backend_work import backend_tasks
from kiln.tasks.runner import TaskRunner


def spec(command: str | list[str], **extra: Any) -> dict[str, Any]:
    """A job spec that runs with this interpreter (no runtime venv to build)."""
    return {"command": command, "runtime": {"python": sys.executable}, **extra}


def wait_for(client: Client, job_id: str, *states: str, timeout: float = 60) -> JobRead:
    """Poll until the job is in one of ``states`` (or has ended, if none are given)."""
    deadline = time.monotonic() + timeout
    while True:
        job = client.get_job(job_id)
        if (states and job.state in states) or (not states and job.state.terminal):
            return job
        if job.state.terminal and states:
            raise AssertionError(f"job {job_id} ended {job.state} ({job.reason}: {job.message}), wanted {states}")
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {job.state} after {timeout}s, wanted {states or 'an end'}")
        time.sleep(0.1)


def log_text(client: Client, job_id: str) -> list[str]:
    """The job's output lines (text only, Kiln's own K lines left out)."""
    return [line.text for line in client.stream_logs(job_id, follow=False) if line.source != "kiln"]


def transitions(client: Client, job_id: str) -> list[tuple[str | None, str | None]]:
    return [(e.from_state, e.to_state) for e in client.events(job_id) if e.to_state is not None]


def seed_jobs(db: Database, org_id: str, user_id: str, jobs: dict[str, dict[str, Any]]) -> None:
    """An organisation with one user and job rows, straight into the database (tests of the parts below the API):
    ``jobs`` maps each job id to its fields (default: running, empty spec)."""
    with db.transaction() as s:
        s.add(Organization(id=org_id, name=org_id))
        s.flush()
        s.add(User(id=user_id, org_id=org_id, name=user_id))
        s.flush()
        for job_id, fields in jobs.items():
            s.add(
                Job(
                    **{"name": job_id, "spec": {}, "state": JobState.RUNNING, **fields},
                    id=job_id,
                    org_id=org_id,
                    user_id=user_id,
                )
            )


def acme_database(url: str) -> Database:
    """A migrated database at ``url`` holding organisation ``org-1`` (acme) and its user ``usr-1`` (ann), for tests
    that write job rows straight to the database; the caller disposes of it."""
    database = Database(url)
    migrate.upgrade(database.engine)
    with database.transaction() as s:
        s.add(Organization(id="org-1", name="acme"))
        s.flush()
        s.add(User(id="usr-1", org_id="org-1", name="ann"))
    return database


def run_background_work(backend: Backend) -> TaskRunner:
    """A started task runner running the backend's background work, as a server's does (its informers, its
    listener): stop it before closing the backend."""
    runner = TaskRunner()
    for task in backend_tasks(backend):
        runner.add(task)
    runner.start()
    return runner


@contextmanager
def thread_starts() -> Iterator[list[str]]:
    """The modules that start a thread inside the block, one entry per ``Thread.start`` (in any thread of the
    process): a test that its code starts threads only through the task runner (``kiln.tasks.runner``)."""
    starters: list[str] = []
    start = threading.Thread.start

    def recording(thread: threading.Thread) -> None:
        starters.append(str(sys._getframe(1).f_globals.get("__name__")))
        start(thread)

    with mock.patch.object(threading.Thread, "start", recording):
        yield starters

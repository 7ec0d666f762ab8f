"""The log-shipping task records how much of a running job's log the store holds (``jobs.log_bytes``, counted in
the organisation's storage), only for jobs this server holds, and never waits for a row a reconcile pass has
locked: waiting for one while holding another deadlocked with the pass on PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln.db.session import Database
from kiln.db.tables import Job
from kiln.domain.states import JobState
from kiln.storage.logs import LogStore
from kiln.tasks.log_shipping import LogShipping
from tests.helpers import acme_database
from tests.integration.jobs.test_reconcile_batch import add_jobs


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = acme_database(database_url)
    yield database
    database.dispose()


def _running(db: Database, ids: list[str], owner: str) -> None:
    with db.transaction() as s:
        for job_id in ids:
            job = s.get(Job, job_id)
            assert job is not None
            job.state, job.lease_owner = JobState.RUNNING, owner


def _log_bytes(db: Database) -> dict[str, int]:
    with db.read() as s:
        return {job.id: job.log_bytes or 0 for job in s.query(Job)}


def test_log_bytes_are_recorded_for_held_jobs_and_a_locked_row_is_left_for_the_next_round(
    db: Database, database_url: str, tmp_path: Path
) -> None:
    mine, locked, theirs = add_jobs(db, 3)
    _running(db, [mine, locked], "server-a")
    _running(db, [theirs], "server-b")
    logs = LogStore(tmp_path / "logs")
    for job_id in (mine, locked, theirs):
        logs.path(job_id).write_bytes(b"x" * 100)
    shipping = LogShipping(db, logs, "server-a", 1.0)

    if database_url.startswith("postgresql"):
        # A reconcile pass holding ``locked``'s row: the round records the others and leaves that one.
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            with db.transaction() as s:
                s.query(Job).filter(Job.id == locked).with_for_update().one()
                held.set()
                release.wait(30)

        holder = threading.Thread(target=hold)
        holder.start()
        assert held.wait(10)
        try:
            assert shipping.run_once() == 2  # it returned: it did not wait for the locked row
            assert _log_bytes(db) == {mine: 100, locked: 0, theirs: 0}
        finally:
            release.set()
            holder.join(10)
        logs.path(mine).write_bytes(b"x" * 100)  # nothing new for the one already recorded
    shipping.run_once()
    assert _log_bytes(db) == {mine: 100, locked: 100, theirs: 0}  # another server's job is not this one's to record

"""A task that meets SQLite's "database is locked" (another connection held the write lock past its busy timeout)
is not failing: the runner backs off and runs it again, counts it as busy (not as an error, /readyz and
Prometheus stay clean) and logs one line without a traceback. Real SQLite, a real lock held by a second
connection."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from kiln.db.session import Database
from kiln.tasks.runner import Task, TaskContext, TaskRunner, database_busy
from tests.unit.tasks.test_runner import status_of, until


def test_a_busy_database_is_waited_out_not_counted_as_a_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "kiln.db"
    db = Database(f"sqlite:///{path}")
    with db.transaction() as s:
        s.execute(text("CREATE TABLE t (x INTEGER)"))
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the write lock, held until released below
    released = threading.Event()
    written: list[int] = []

    def write(ctx: TaskContext) -> None:
        with db.bulk_transaction() as s:  # a background writer: gives up on the lock after a short wait
            s.execute(text("INSERT INTO t VALUES (1)"))
        written.append(1)

    runner = TaskRunner()
    runner.add(Task("writer", write, interval=0.05))
    try:
        with caplog.at_level(logging.INFO, logger="kiln.tasks.runner"):
            runner.start()
            until(lambda: status_of(runner, "writer").busy >= 2, timeout=30)
            holder.execute("ROLLBACK")
            released.set()
            until(lambda: bool(written), timeout=30)
            time.sleep(0.2)
            runner.stop()
    finally:
        holder.close()
        db.dispose()
    status = status_of(runner, "writer")
    assert status.errors == 0 and status.last_ok is True
    assert status.as_dict()["busy"] == status.busy >= 2
    lines = [r for r in caplog.records if "found the database busy" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None  # once per streak, no traceback


def test_only_the_lock_is_busy() -> None:
    assert database_busy(sqlite3.OperationalError("database is locked"))
    assert not database_busy(sqlite3.OperationalError("no such table: t"))
    assert not database_busy(OSError("database is locked"))

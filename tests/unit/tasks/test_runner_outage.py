"""A database outage is one line per task, not a traceback per task and message (issue 44: a chaos run logged ~50
lines of traceback for each task's DatabaseUnavailable): the first failure for that reason is logged as one line
without its traceback, whatever each next failure's message says, and the first run that succeeds after it as one
more. An error of the task itself keeps its traceback."""

from __future__ import annotations

import logging

import psycopg
import pytest
from sqlalchemy.exc import OperationalError

from kiln.errors import DatabaseUnavailable
from kiln.tasks.db_errors import database_outage
from kiln.tasks.runner import Task, TaskContext, TaskRunner
from tests.unit.tasks.test_runner import status_of, until

FAILURES = 6
# What the driver raises as the outage goes on: the connection lost, then refused while PostgreSQL is down.
MESSAGES = ("the connection to it was lost", "the server cannot connect to it")


def raised_from(cause: BaseException, error: BaseException) -> BaseException:
    try:
        raise error from cause
    except BaseException as exc:
        return exc


def test_an_outage_is_one_line_when_it_starts_and_one_when_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    def run(ctx: TaskContext) -> None:
        calls.append(1)
        if len(calls) <= FAILURES:
            why = MESSAGES[min(len(calls) - 1, 1)]
            driver = psycopg.OperationalError(f"connection failed ({len(calls)})")
            raise raised_from(driver, DatabaseUnavailable(f"the database is unavailable ({why})"))

    runner = TaskRunner()
    runner.add(Task("ingest", run, interval=0.001))
    with caplog.at_level(logging.DEBUG, logger="kiln.tasks.runner"):
        runner.start()
        until(lambda: status_of(runner, "ingest").last_ok is True, timeout=60)
        runner.stop()
    assert status_of(runner, "ingest").errors == FAILURES  # each failure is still recorded (/readyz, /metrics)
    lines = [r for r in caplog.records if "ingest" in r.getMessage()]
    assert [r.levelname for r in lines] == ["WARNING", "INFO"], [r.getMessage() for r in lines]
    failing, recovered = lines
    assert failing.exc_info is None and "\n" not in failing.getMessage()
    assert "background task ingest fails: the database is unavailable" in failing.getMessage()
    assert recovered.exc_info is None
    assert recovered.getMessage() == (
        "background task ingest recovered (the database is unavailable no more): it runs again"
    )
    text = caplog.text
    assert "Traceback" not in text and "psycopg" not in text


def test_a_tasks_own_error_after_an_outage_keeps_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    errors: list[BaseException] = [
        DatabaseUnavailable("the database is unavailable (the connection to it was lost)"),
        DatabaseUnavailable("the database is unavailable (the server cannot connect to it)"),
        KeyError("no such spool"),
    ]

    def run(ctx: TaskContext) -> None:
        if errors:
            raise errors.pop(0)

    runner = TaskRunner()
    runner.add(Task("spools", run, interval=0.001))
    with caplog.at_level(logging.INFO, logger="kiln.tasks.runner"):
        runner.start()
        until(lambda: status_of(runner, "spools").last_ok is True, timeout=60)
        runner.stop()
    lines = [r for r in caplog.records if "spools" in r.getMessage()]
    assert [(r.levelname, r.exc_info is not None) for r in lines] == [
        ("WARNING", False),  # the outage, once
        ("ERROR", True),  # the task's own error: with its traceback
        ("INFO", False),  # runs again
    ], [r.getMessage() for r in lines]


def test_what_counts_as_the_databases_outage() -> None:
    assert database_outage(DatabaseUnavailable("gone")) == "the database is unavailable"
    lock = psycopg.errors.LockNotAvailable("canceling statement due to lock timeout")
    assert database_outage(OperationalError("LOCK", {}, lock)) == "a database lock"
    assert database_outage(raised_from(lock, RuntimeError("a write failed"))) == "a database lock"
    assert database_outage(OperationalError("SELECT", {}, psycopg.OperationalError("no such column"))) is None
    assert database_outage(KeyError("x")) is None

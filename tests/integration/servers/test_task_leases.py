"""Leases of background tasks with fencing tokens, on SQLite and PostgreSQL: one server at a time runs a scoped
task; when the holder stalls past its lease another takes it with a higher token, and the stalled one's writes
are refused by that token."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy import select

from kiln.db import migrate
from kiln.db.session import Database
from kiln.db.tables import TaskLease
from kiln.tasks.leases import TaskLeases
from kiln.tasks.runner import LeaseLost, Task, TaskContext, TaskRunner


def until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture
def databases(database_url: str) -> Iterator[tuple[Database, Database]]:
    """Two servers' handles on one database."""
    first = Database(database_url)
    migrate.upgrade(first.engine)
    second = Database(database_url)
    yield first, second
    second.dispose()
    first.dispose()


def test_the_token_goes_up_when_the_lease_changes_hands(databases: tuple[Database, Database]) -> None:
    a, b = TaskLeases(databases[0], "server-a"), TaskLeases(databases[1], "server-b")
    held = a.acquire("purge", 0.5)
    assert held is not None and held.token == 1
    assert b.acquire("purge", 0.5) is None  # a holds it
    renewed = a.acquire("purge", 0.5)
    assert renewed is not None and renewed.token == 1  # renewing keeps the token
    time.sleep(0.6)
    taken = b.acquire("purge", 30)
    assert taken is not None and taken.token == 2
    assert not a.holds("purge", 1)  # a's token is stale
    with databases[0].transaction() as s:
        assert not a.check(s, "purge", 1)  # ... also inside a writer's transaction
    assert b.holds("purge", 2)
    assert a.acquire("purge", 30) is None
    b.release("purge", 2)  # at shutdown: the next owner need not wait for the expiry
    again = a.acquire("purge", 30)
    assert again is not None and again.token == 3
    time.sleep(0.01)
    with databases[0].read() as s:
        row = s.scalars(select(TaskLease).where(TaskLease.scope == "purge")).one()
    assert (row.owner, row.token) == ("server-a", 3)
    # The same owner taking its own lease back after it expired gets a new token too (it may have been taken
    # and lost in between).
    a.release("purge", 3)
    back = a.acquire("purge", 30)
    assert back is not None and back.token == 4


@dataclass
class Run:
    owner: str
    token: int | None
    started: float
    ended: float = 0.0
    held_at_end: bool = False
    wrote: bool = False
    refused: bool = False


def test_two_runners_one_scoped_task_and_a_stalled_holder_is_fenced(
    databases: tuple[Database, Database],
) -> None:
    runs: list[Run] = []
    stall = threading.Event()  # set: the next run of the holder hangs until `resume`
    resume = threading.Event()
    stalled: list[Run] = []

    def make(owner: str, db: Database) -> Callable[[TaskContext], None]:
        def run_once(ctx: TaskContext) -> None:
            run = Run(owner, ctx.token, time.monotonic())
            runs.append(run)
            if stall.is_set() and not stalled:
                stalled.append(run)
                resume.wait(30)
            try:
                with ctx.transaction() as s:  # the fenced write: only with a token that still holds the lease
                    s.execute(select(TaskLease.token).where(TaskLease.scope == "purge"))
                    run.wrote = True
            except LeaseLost:
                run.refused = True
                raise  # the runner ends the run, not as an error
            finally:
                run.held_at_end = ctx.holds()
                run.ended = time.monotonic()

        return run_once

    runners = {}
    for owner, db in (("server-a", databases[0]), ("server-b", databases[1])):
        # A lease of 2 s renewed every 0.05 s: only a stall (the one below) lets it change hands.
        runner = TaskRunner(TaskLeases(db, owner), lease_seconds=2.0)
        runner.add(Task("purge", make(owner, db), interval=0.05, lease_scope="purge"))
        runners[owner] = runner
    for runner in runners.values():
        runner.start()
    try:
        until(lambda: len(runs) >= 10)
        first = runs[0].owner
        other = "server-b" if first == "server-a" else "server-a"
        normal = list(runs)
        assert {x.owner for x in normal} == {first}, "one server at a time runs a scoped task"
        assert {x.token for x in normal} == {1}
        assert all(x.wrote and x.held_at_end for x in normal if x.ended)
        (holder,) = [x for x in runners[first].status()]
        assert holder.holds_lease is True and holder.token == 1
        assert runners[other].status()[0].holds_lease is False
        assert runners[other].status()[0].runs == 0

        stall.set()  # the holder's next run hangs past its lease: the other server takes over
        until(lambda: any(x.owner == other for x in runs))
        taker = [x for x in runs if x.owner == other]
        assert taker[0].token == 2, "the new holder's token is higher"
        assert runners[other].status()[0].holds_lease is True
        resume.set()
        until(lambda: stalled[0].ended > 0)
        assert stalled[0].owner == first and stalled[0].token == 1
        assert stalled[0].held_at_end is False, "the stalled holder's holds() is False"
        assert stalled[0].wrote is False and stalled[0].refused, "its write with the stale token is refused"
        until(lambda: runners[first].status()[0].holds_lease is False)  # its next try finds the lease taken
        # The new holder runs on (its next pass need not have started yet when the stalled run ended: wait for
        # it), and only it: the stalled server does not run the task again while the lease is held.
        until(lambda: any(x.owner == other and x.started > stalled[0].ended for x in runs))
        later = [x for x in runs if x.started > stalled[0].ended]
        assert {x.owner for x in later} == {other}, later
        assert all(x.wrote for x in later if x.ended)
        lost = runners[first].status()[0]
        assert lost.errors == 0 and lost.last_error is None, "a lost lease is not an error of the server"
    finally:
        resume.set()
        for runner in runners.values():
            runner.stop()

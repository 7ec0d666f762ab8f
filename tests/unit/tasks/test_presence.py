"""The live servers of a database (kiln.tasks.presence): each counts the others through its heartbeat, stops
counting one that left or went quiet, and forgets long-dead ones."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update

from kiln.db import migrate
from kiln.db.session import Database
from kiln.db.tables import Server, utcnow
from kiln.tasks.presence import ServerPresence


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'kiln.db'}")
    migrate.upgrade(database.engine)
    yield database
    database.dispose()


def ids(db: Database) -> list[str]:
    with db.read() as s:
        return sorted(s.scalars(select(Server.id)))


def test_servers_count_each_other_and_stop_counting_one_that_left(db: Database) -> None:
    counts: list[int] = []
    first = ServerPresence(db, "srv-a", "http://a:8080", 5.0, on_count=counts.append)
    second = ServerPresence(db, "srv-b", "http://b:8080", 5.0)
    assert first.beat() == 1
    assert second.beat() == 2
    assert first.beat() == 2 and first.live == 2
    assert counts == [1, 2]
    second.leave()
    assert ids(db) == ["srv-a"]
    assert first.beat() == 1 and counts[-1] == 1


def test_a_server_unseen_for_three_heartbeats_is_not_counted_and_forgotten_after_an_hour(db: Database) -> None:
    first = ServerPresence(db, "srv-a", "", 5.0)
    quiet = ServerPresence(db, "srv-b", "", 5.0)
    quiet.beat()

    def seen(ago: timedelta) -> None:
        at = utcnow() - ago
        with db.transaction() as s:
            s.execute(
                update(Server).where(Server.id == "srv-b").values(seen_at=at, live_until=at + timedelta(seconds=15))
            )

    seen(timedelta(seconds=14))  # within 3 heartbeats of 5 s
    assert first.beat() == 2
    seen(timedelta(seconds=16))
    assert first.beat() == 1
    assert ids(db) == ["srv-a", "srv-b"]  # not live, still listed
    seen(timedelta(hours=1, seconds=1))
    first.beat()
    assert ids(db) == ["srv-a"]


def test_a_restarted_server_is_one_row_and_a_heartbeat_must_be_positive(db: Database) -> None:
    ServerPresence(db, "srv-a", "http://a:8080", 5.0).beat()
    again = ServerPresence(db, "srv-a", "http://a:8081", 5.0)
    assert again.beat() == 1
    with db.read() as s:
        assert s.scalars(select(Server.endpoint)).all() == ["http://a:8081"]
    with pytest.raises(ValueError, match="heartbeat_seconds"):
        ServerPresence(db, "srv-c", "", 0)


def test_servers_with_different_heartbeats_judge_each_other_by_the_others_own(db: Database) -> None:
    """A server beating every 0.5 s counts one that beats every 5 s for all of its 15 s, not for 1.5 s (this made
    two such servers share a rate limit as if alone most of the time)."""
    fast = ServerPresence(db, "srv-fast", "", 0.5)
    slow = ServerPresence(db, "srv-slow", "", 5.0)
    slow.beat()
    with db.transaction() as s:  # the slow one last beat 10 s ago: within its own three heartbeats
        at = utcnow() - timedelta(seconds=10)
        s.execute(
            update(Server).where(Server.id == "srv-slow").values(seen_at=at, live_until=at + timedelta(seconds=15))
        )
    assert fast.beat() == 2
    assert slow.beat() == 2  # and the slow one counts the fast one, seen just now
    with db.transaction() as s:  # a row from before live_until was recorded: judged by the reader's heartbeat
        s.execute(update(Server).where(Server.id == "srv-slow").values(seen_at=utcnow(), live_until=None))
    assert fast.beat() == 2

"""``Database.read(snapshot=True)``: every query of the read sees the database as of its first, though another
transaction commits in between — what a usage report of several parts needs (the usage task adds settled holds
into usage_hours while reports read them) — on SQLite and PostgreSQL; a plain read on PostgreSQL does not."""

from __future__ import annotations

from sqlalchemy import text

from kiln.db.session import Database


def _count(s: object) -> int:
    return int(s.execute(text("SELECT n FROM counted")).scalar_one())  # type: ignore[attr-defined]


def test_a_snapshot_read_sees_one_moment_while_another_transaction_commits(database_url: str) -> None:
    db = Database(database_url)
    try:
        with db.transaction() as s:
            s.execute(text("CREATE TABLE counted (n integer)"))
            s.execute(text("INSERT INTO counted VALUES (1)"))
        with db.read(snapshot=True) as r:
            assert _count(r) == 1
            with db.transaction() as w:
                w.execute(text("UPDATE counted SET n = 2"))
            assert _count(r) == 1  # the same moment as its first query
        with db.read() as r:
            assert _count(r) == 2
            with db.transaction() as w:
                w.execute(text("UPDATE counted SET n = 3"))
            # PostgreSQL's default (READ COMMITTED): each statement sees what was committed before it
            assert _count(r) == (3 if db.dialect == "postgresql" else 2)
        with db.read(snapshot=True) as r:  # the connection went back to the pool at its default level
            assert _count(r) == 3
        with db.read() as r:
            level = r.execute(text("SHOW transaction_isolation")).scalar() if db.dialect == "postgresql" else None
            assert level in (None, "read committed")
    finally:
        db.dispose()

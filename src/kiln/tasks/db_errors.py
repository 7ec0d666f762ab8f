"""What a background task's error says of its database, when it is the database's and not the task's: the runner
(kiln.tasks.runner) backs off from such errors like any other, and logs them as one line without a traceback."""

from __future__ import annotations

from kiln.errors import DatabaseUnavailable


def database_busy(exc: BaseException) -> bool:
    """Is ``exc`` (or what it was raised from) SQLite's "database is locked": another connection held the write
    lock for longer than this one's busy timeout?"""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return False
        if type(seen).__name__ == "OperationalError" and "database is locked" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


# PostgreSQL's SQLSTATEs of a statement that met another transaction's lock: lock_not_available (NOWAIT, or a
# lock_timeout) and deadlock_detected.
LOCK_SQLSTATES = frozenset({"55P03", "40P01"})


def database_outage(exc: BaseException) -> str | None:
    """What a run's error says of the database when it is the database's, not the task's: "the database is
    unavailable" (``DatabaseUnavailable``: it cannot be reached) or "a database lock" (PostgreSQL's lock errors, as
    under an operator's long ``LOCK TABLE``); else None. Such an error is the same in every task for the length of
    an outage, and its traceback says nothing about the task: it is logged as one line, once, and the recovery as
    another (``TaskRunner._failed``)."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return None
        if isinstance(seen, DatabaseUnavailable):
            return "the database is unavailable"
        original = getattr(seen, "orig", None) or seen  # SQLAlchemy's DBAPIError wraps the driver's error
        sqlstate = getattr(original, "sqlstate", None)
        if sqlstate in LOCK_SQLSTATES:
            return "a database lock"
        seen = seen.__cause__ or seen.__context__
    return None

"""Engine, sessions and the unit of work.

SQLite runs in WAL mode and every write transaction starts with ``BEGIN IMMEDIATE`` so that concurrent
writers queue on the busy timeout instead of failing on a lock upgrade. Sessions never expire on commit:
services hand the loaded rows to the routes after the transaction closed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from kiln.errors import Unavailable


def make_engine(url: str, *, read_only: bool = False) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            pool_size=20,
            max_overflow=20,
        )

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Take transaction control from the driver so that BEGIN IMMEDIATE below is ours.
            dbapi_conn.isolation_level = None
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Any) -> None:
            # Writers take the write lock up front (no deadlocking lock upgrades); readers never block
            # anyone in WAL mode, so they start a plain deferred transaction.
            conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

        return engine
    return create_engine(url, pool_size=10, max_overflow=20, pool_pre_ping=True)


class Database:
    """Owns the engine and hands out units of work."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        # On SQLite a second engine whose transactions don't take the write lock; elsewhere the same engine.
        self.read_engine = make_engine(url, read_only=True) if self.engine.dialect.name == "sqlite" else self.engine
        self._read_sessions = sessionmaker(self.read_engine, expire_on_commit=False)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """One unit of work: commits on success, rolls back on any error."""
        session = self._sessions()
        try:
            with session.begin():
                yield session
        finally:
            session.close()

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A unit of work that only reads: on SQLite it never waits for, or blocks, a writer."""
        session = self._read_sessions()
        try:
            with session.begin():
                yield session
        finally:
            session.close()

    def ping(self) -> None:
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except Exception as exc:
            raise Unavailable(f"database unreachable: {type(exc).__name__}") from exc

    def dispose(self) -> None:
        self.engine.dispose()
        self.read_engine.dispose()

"""Engine, sessions and the unit of work.

SQLite runs in WAL mode and every write transaction starts with ``BEGIN IMMEDIATE`` so that concurrent
writers queue on the busy timeout instead of failing on a lock upgrade. Sessions never expire on commit:
services hand the loaded rows to the routes after the transaction closed.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import ExceptionContext, make_url
from sqlalchemy.orm import Session, sessionmaker

from kiln.errors import DatabaseUnavailable, KilnError, Unavailable

log = logging.getLogger(__name__)

# The table a DML statement writes: INSERT INTO t / UPDATE t / DELETE FROM t (optionally quoted, any case).
_DML_TARGET = re.compile(r'\s*(?:INSERT\s+(?:OR\s+\w+\s+)?INTO|REPLACE\s+INTO|UPDATE|DELETE\s+FROM)\s+"?(\w+)"?', re.I)


_RETURNING = re.compile(r"\bRETURNING\b", re.I)


@functools.lru_cache(maxsize=1024)
def _written_table(statement: str) -> tuple[str | None, bool]:
    """(the table a DML statement writes or None, whether its rowcount can be trusted before its rows are read)."""
    match = _DML_TARGET.match(statement)
    if match is None:
        return None, False
    return match.group(1).lower(), _RETURNING.search(statement) is None


class TableVersions:
    """A version number per watched table that changes after every committed write to it through one engine.

    Caches of what a query over those tables returned stay valid while the version they were filled under is
    the current one. Every statement is seen (ORM flushes, Core ``update()``/``insert()``/``delete()``, raw
    SQL) by an engine event, so no writer has to remember to invalidate anything. The version changes when the
    statement runs (before its commit) *and* again when its connection goes back to the pool (after the
    commit): a reader that looked up the version, then took its snapshot before that commit, cached its result
    under a version that the second change retires.

    Only writes through this process's engine are seen: callers use it where this process is the only writer
    (SQLite, whose server holds a lock on $KILN_HOME), never across PostgreSQL replicas.
    """

    _DIRTY = "kiln_tables_written"

    def __init__(self, engine: Engine, tables: tuple[str, ...]) -> None:
        self.tables = frozenset(tables)
        self._versions = dict.fromkeys(self.tables, 0)
        self._lock = threading.Lock()
        event.listen(engine, "after_cursor_execute", self._after_execute)
        event.listen(engine, "commit", self._on_commit)
        event.listen(engine.pool, "checkin", self._on_checkin)
        event.listen(engine.pool, "invalidate", self._on_checkin)

    def version(self, table: str) -> int:
        return self._versions[table]

    def bump(self, tables: Any) -> None:
        with self._lock:
            for table in tables:
                self._versions[table] += 1

    def _after_execute(
        self, conn: Any, cursor: Any, statement: str, _params: Any, _context: Any, _executemany: bool
    ) -> None:
        table, exact_rowcount = _written_table(statement)
        if table is None or table not in self.tables or (exact_rowcount and cursor.rowcount == 0):
            return  # a read, another table, or a write that matched no row
        written = conn.info.setdefault(self._DIRTY, set())
        written.add(table)
        self.bump((table,))

    def _on_commit(self, conn: Any) -> None:
        written = conn.info.get(self._DIRTY)
        if written:
            self.bump(written)

    def _on_checkin(self, _dbapi_conn: Any, record: Any, *_: Any) -> None:
        written = record.info.pop(self._DIRTY, None) if record is not None else None
        if written:
            self.bump(written)


def _private_sqlite_file(path: Path) -> None:
    """The database holds every encrypted secret and the audit log: readable by the server's user only. SQLite
    gives its -wal and -shm files the database file's mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            if name.exists() and name.stat().st_uid == os.geteuid():
                os.chmod(name, 0o600)
    except OSError:
        pass  # a read-only location: SQLite says what is wrong when it opens it


# How long one connection attempt to PostgreSQL may take (unless the URL sets connect_timeout): while the database
# cannot be reached, a request that needs it answers 503 after about this long, not after the TCP connect timeout
# (minutes when packets to it are dropped). libpq's own minimum is 2 s.
PG_CONNECT_TIMEOUT_SECONDS = 2
# PostgreSQL ends a session that stays this long inside a transaction without sending a statement: a server paused
# (a stopped container, a frozen VM, SIGSTOP) in the middle of a transaction would otherwise hold its row locks until
# it resumed, and every other server skips locked jobs (FOR UPDATE SKIP LOCKED): none could take over its jobs. No
# Kiln transaction waits this long between two statements (backend and store calls happen outside them).
PG_IDLE_IN_TRANSACTION_SECONDS = 15.0
# libpq's TCP settings (unless the URL sets them) for a database host that vanished without closing its connections
# (a partition, a host that died): keepalive probes find an idle connection dead in ~16 s, and data unacknowledged
# for 10 s fails the statement that sent it, instead of the kernel retransmitting for a quarter of an hour.
PG_TCP_OPTIONS = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}
# How long a bulk writer (metrics ingestion) waits for SQLite's write lock before its transaction fails with
# "database is locked" (its task backs off and tries again); a request waits up to 30 s.
BULK_BUSY_SECONDS = 2.0
# How long a bulk writer lets the process's other writers go first before it takes its turn anyway (WriteGate).
BULK_YIELD_SECONDS = 0.5
# What a client answered 503 for an unavailable database is told to wait (Retry-After) before it tries again.
DATABASE_RETRY_AFTER_SECONDS = 2


def database_unavailable(ctx: ExceptionContext) -> BaseException | None:
    """SQLAlchemy's ``handle_error`` hook: an error that means the database cannot be reached now becomes
    ``DatabaseUnavailable`` (503, with Retry-After, wherever it reaches a client; a background task backs off),
    raised from the driver's error, which the server's log keeps. That is a connection that broke (the dialect's
    disconnect test, after which SQLAlchemy has already invalidated it, and the pool's other connections older
    than it) or a connection that could not be made (refused, timed out, "the database system is starting up").
    Any other error (a constraint, a deadlock, SQLite's busy lock) is left as it is. The pool's pre-ping of an
    idle connection is left alone too: the pool replaces a dead connection there itself."""
    if ctx.is_pre_ping:
        return None
    if ctx.is_disconnect:
        why = "the connection to it was lost"
    elif ctx.connection is None and isinstance(ctx.original_exception, ctx.dialect.loaded_dbapi.OperationalError):
        why = "the server cannot connect to it"
    else:
        return None
    return DatabaseUnavailable(
        f"the database is unavailable ({why}); try again in a few seconds",
        details={"retry_after": DATABASE_RETRY_AFTER_SECONDS},
    )


def _postgresql_connect_args(url: str, idle_transaction_seconds: float | None = None) -> dict[str, Any]:
    """The connection timeout, TCP settings and the idle-in-transaction timeout, each unless the URL's query sets
    it already (``options`` there replaces the timeout's)."""
    query = make_url(url).query
    options: dict[str, Any] = {"connect_timeout": PG_CONNECT_TIMEOUT_SECONDS, **PG_TCP_OPTIONS}
    idle = PG_IDLE_IN_TRANSACTION_SECONDS if idle_transaction_seconds is None else idle_transaction_seconds
    if idle > 0:
        options["options"] = f"-c idle_in_transaction_session_timeout={int(idle * 1000)}"
    return {name: value for name, value in options.items() if name not in query}


class WriteGate:
    """(SQLite) The turns of one process's writers at the database's one write lock, handed over at once.

    SQLite hands its write lock to nobody in turn: a writer that finds it taken sleeps and tries again (1, 2, 5, ...
    up to 100 ms between tries), so a request waiting behind a bulk writer waits past the end of the bulk
    transaction, and a bulk writer going from one transaction to the next takes the lock again before any sleeper
    wakes: requests waited out their 30 s busy timeout behind metrics ingestion. Within the process the writers
    queue here instead (a condition: the next goes when the last commits or rolls back), the writers of
    ``transaction`` and plain ``engine.begin()`` (requests, tasks) before the bulk writer, which goes once none of
    them waits or after ``BULK_YIELD_SECONDS``. Other processes sharing the file still meet SQLite's busy handler.
    A writer that cannot enter within its busy timeout goes on without the gate (SQLite's lock still serialises
    it): a thread that opened a second write transaction inside its first waits as long as it did before."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._holder: int | None = None  # id() of the DB-API connection whose transaction is in
        self._waiting = 0  # writers other than bulk ones waiting for their turn

    def attach(self, engine: Engine) -> None:
        """Give the turn back after each commit or rollback of ``engine`` (whose BEGIN takes it: ``enter``)."""
        dialect = engine.dialect
        commit, rollback = dialect.do_commit, dialect.do_rollback

        def do_commit(dbapi_conn: Any) -> None:
            try:
                commit(dbapi_conn)
            finally:
                self.leave(dbapi_conn)

        def do_rollback(dbapi_conn: Any) -> None:
            try:
                rollback(dbapi_conn)
            finally:
                self.leave(dbapi_conn)

        dialect.do_commit = do_commit  # type: ignore[method-assign,assignment]
        dialect.do_rollback = do_rollback  # type: ignore[method-assign,assignment]

    def enter(self, dbapi_conn: Any, *, bulk: bool, timeout: float) -> None:
        key = id(getattr(dbapi_conn, "dbapi_connection", dbapi_conn))  # the pool's proxy, or the driver's
        with self._cond:
            if self._holder == key:
                return
            if bulk:
                self._cond.wait_for(lambda: self._holder is None and self._waiting == 0, BULK_YIELD_SECONDS)
            else:
                self._waiting += 1
            try:
                if self._cond.wait_for(lambda: self._holder is None, timeout):
                    self._holder = key
            finally:
                if not bulk:
                    self._waiting -= 1

    def leave(self, dbapi_conn: Any) -> None:
        key = id(getattr(dbapi_conn, "dbapi_connection", dbapi_conn))
        with self._cond:
            if self._holder == key:
                self._holder = None
                self._cond.notify_all()

    def waiting(self) -> int:
        """Writers (not bulk ones) waiting for their turn now."""
        return self._waiting


def make_engine(
    url: str,
    *,
    read_only: bool = False,
    foreign_keys: bool = True,
    idle_transaction_seconds: float | None = None,
    busy_seconds: float = 30.0,
    gate: WriteGate | None = None,
    bulk: bool = False,
) -> Engine:
    """``gate`` (SQLite): the process's writers take turns through it (``bulk``: after the others)."""
    engine = _make_engine(
        url,
        read_only=read_only,
        foreign_keys=foreign_keys,
        idle_transaction_seconds=idle_transaction_seconds,
        busy_seconds=busy_seconds,
        gate=gate if not read_only else None,
        bulk=bulk,
    )
    if gate is not None and engine.dialect.name == "sqlite" and not read_only:
        gate.attach(engine)
    event.listen(engine, "handle_error", database_unavailable)
    return engine


def _make_engine(
    url: str,
    *,
    read_only: bool,
    foreign_keys: bool,
    idle_transaction_seconds: float | None,
    busy_seconds: float,
    gate: WriteGate | None,
    bulk: bool,
) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:" and not read_only:
            _private_sqlite_file(Path(parsed.database))
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": busy_seconds},
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
            cursor.execute(f"PRAGMA foreign_keys={'ON' if foreign_keys else 'OFF'}")
            cursor.execute(f"PRAGMA busy_timeout={int(busy_seconds * 1000)}")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Any) -> None:
            # Writers take the write lock up front (no deadlocking lock upgrades); readers never block
            # anyone in WAL mode, so they start a plain deferred transaction.
            if read_only or gate is None:
                conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")
                return
            dbapi_conn = conn.connection.dbapi_connection
            gate.enter(dbapi_conn, bulk=bulk, timeout=busy_seconds)  # this process's writers in turn
            try:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            except BaseException:
                gate.leave(dbapi_conn)  # (another process held the lock past the busy timeout): no rollback comes
                raise

        return engine
    # pool_pre_ping: a pooled connection that died with the database (a restart) is found dead on checkout and the
    # pool replaces it, with every connection older than it, so the first request after a restart does not fail.
    connect_args = (
        _postgresql_connect_args(url, idle_transaction_seconds) if parsed.get_backend_name() == "postgresql" else {}
    )
    return create_engine(url, pool_size=10, max_overflow=20, pool_pre_ping=True, connect_args=connect_args)


class Database:
    """Owns the engine and hands out units of work."""

    # Tables whose writes this process tracks (see TableVersions): the job list cache depends on them.
    WATCHED_TABLES = ("jobs",)

    def __init__(self, url: str, idle_transaction_seconds: float | None = None, *, metering: bool = True) -> None:
        """``idle_transaction_seconds``: PostgreSQL ends a session idle this long inside a transaction (None:
        ``PG_IDLE_IN_TRANSACTION_SECONDS``, 0: never). ``metering``: the job state machine meters each
        attempt's hold in the sessions of ``transaction`` (``session.info["metering"]``; kiln.usecases.usage.usage)."""
        self.url = url
        # SQLite: this process's writers (requests, tasks, the bulk writer) take turns through one gate.
        self.gate = WriteGate()
        self.engine = make_engine(url, idle_transaction_seconds=idle_transaction_seconds, gate=self.gate)
        self.versions = TableVersions(self.engine, self.WATCHED_TABLES)
        self._close_hooks: list[Callable[[], None]] = []
        self.exclusive = False  # see claim_exclusive
        self._lock_file = self._share_sqlite_file(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False, info={"metering": metering})
        # On SQLite a second engine whose transactions don't take the write lock; elsewhere the same engine.
        self.read_engine = make_engine(url, read_only=True) if self.engine.dialect.name == "sqlite" else self.engine
        self._read_sessions = sessionmaker(self.read_engine, expire_on_commit=False)
        # On SQLite a third for bulk writers that guarantee their own references (see bulk_transaction). They are
        # background work that can wait: they give up on SQLite's write lock after BULK_BUSY_SECONDS (their task
        # tries again later, kiln.tasks.runner), rather than queue for it as long as a request would.
        self.bulk_engine = (
            make_engine(url, foreign_keys=False, busy_seconds=BULK_BUSY_SECONDS, gate=self.gate, bulk=True)
            if self.engine.dialect.name == "sqlite"
            else self.engine
        )
        self._bulk_sessions = sessionmaker(self.bulk_engine, expire_on_commit=False)

    @staticmethod
    def _share_sqlite_file(url: str) -> IO[str] | None:
        """A shared lock on ``<database>.kiln-lock`` next to a SQLite file, for as long as this is open: several
        servers may share one SQLite file, except with one that claimed it (``claim_exclusive``)."""
        parsed = make_url(url)
        if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
            return None
        fh = open(f"{parsed.database}.kiln-lock", "a+")  # noqa: SIM115 - held until dispose()
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise KilnError(
                f"the SQLite database {parsed.database} is in use by a server that keeps its state in memory "
                "(the default database of its KILN_HOME); stop that server, or give both the same KILN_HOME"
            ) from None
        return fh

    def claim_exclusive(self) -> bool:
        """Try to become the only process using this SQLite file (an exclusive lock; later opens by others fail
        until ``dispose``). True when this process is, and can keep what it knows of the database in memory:
        the used nonces, cached job lists. False on PostgreSQL, or when another process has it open."""
        if self._lock_file is None:
            return False
        if not self.exclusive:
            try:
                fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.exclusive = True
            except BlockingIOError:
                # Converting a lock is not atomic: take the shared one back (it fails only if another process
                # claimed the file in between).
                fcntl.flock(self._lock_file, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return self.exclusive

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
    def bulk_transaction(self) -> Iterator[Session]:
        """``transaction`` for a writer of many rows whose references it guarantees itself (metrics ingestion:
        points of series it created or read in the same transaction, of jobs that are never deleted). On SQLite
        foreign keys are not checked row by row there, which costs a tenth of a bulk insert; elsewhere it is
        ``transaction``."""
        session = self._bulk_sessions()
        try:
            with session.begin():
                yield session
        finally:
            session.close()

    @contextmanager
    def read(self, snapshot: bool = False) -> Iterator[Session]:
        """A unit of work that only reads: on SQLite it never waits for, or blocks, a writer. ``snapshot``: every
        query of it sees the database as of its first (PostgreSQL's REPEATABLE READ; a SQLite read transaction
        always does), for a reader whose queries must add up: a report of several parts, say."""
        session = self._read_sessions()
        try:
            with session.begin():
                if snapshot and self.dialect == "postgresql":
                    session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
                yield session
        finally:
            session.close()

    def ping(self) -> None:
        """Raise ``DatabaseUnavailable`` (or ``Unavailable``) unless the database answers a query now."""
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except KilnError:
            raise
        except Exception as exc:
            raise Unavailable(f"database unreachable: {type(exc).__name__}") from exc

    def on_dispose(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` (e.g. a last flush of write-behind data) before the engines are disposed."""
        self._close_hooks.append(hook)

    def dispose(self) -> None:
        for hook in self._close_hooks:
            try:
                hook()
            except Exception:
                log.exception("database close hook failed")
        self._close_hooks.clear()
        self.engine.dispose()
        self.read_engine.dispose()
        self.bulk_engine.dispose()
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None
            self.exclusive = False

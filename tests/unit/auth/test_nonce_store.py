"""The replay check: in memory with write-behind on SQLite (one server process), a synchronous INSERT on
PostgreSQL. Either way a nonce is single use, also across a restart of the server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from kiln.auth import signing
from kiln.auth.secrets import SecretBox, load_or_create_server_key
from kiln.db import migrate
from kiln.db.session import Database
from kiln.db.tables import Nonce, utcnow
from kiln.settings import Settings
from kiln.tasks.nonce_flush import nonce_flush
from kiln.tasks.runner import TaskRunner
from kiln.usecases.access.identity import AuthFailure, Credentials, IdentityService, MemoryNonceStore


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'kiln.db'}"


def open_db(url: str) -> Database:
    db = Database(url)
    migrate.upgrade(db.engine)
    return db


@pytest.fixture
def db(sqlite_url: str) -> Iterator[Database]:
    database = open_db(sqlite_url)
    yield database
    database.dispose()


def rows(db: Database) -> int:
    with db.read() as s:
        return int(s.scalar(select(func.count()).select_from(Nonce)) or 0)


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


# -- MemoryNonceStore ---------------------------------------------------------------------------------------


def test_a_nonce_is_single_use_per_key(db: Database) -> None:
    store = MemoryNonceStore(db, 601, flush_interval=60)
    now = utcnow()
    assert store.use("AK1", "nonce-0000000000000001", now)
    assert not store.use("AK1", "nonce-0000000000000001", now)
    assert store.use("AK2", "nonce-0000000000000001", now)  # per key
    store.close()


def test_accepted_nonces_reach_the_table_in_the_background(db: Database) -> None:
    store = MemoryNonceStore(db, 601, flush_interval=0.05)
    runner = TaskRunner()  # as a server's: task nonce-flush
    runner.add(nonce_flush(store))
    runner.start()
    try:
        for i in range(50):
            assert store.use("AK1", f"nonce-{i:020d}", utcnow())
        deadline = time.monotonic() + 5
        while rows(db) < 50 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert rows(db) == 50
    finally:
        runner.stop()
    store.close()


def test_the_store_starts_no_thread_of_its_own(db: Database) -> None:
    before = set(threading.enumerate())
    store = MemoryNonceStore(db, 601, flush_interval=0.05)
    assert store.use("AK1", "nonce-0000000000000001", utcnow())
    assert set(threading.enumerate()) - before == set()
    time.sleep(0.2)
    assert rows(db) == 0  # nothing flushes it but its task (or close)
    store.close()
    assert rows(db) == 1


def test_close_and_dispose_write_what_is_left(sqlite_url: str) -> None:
    db = open_db(sqlite_url)
    store = MemoryNonceStore(db, 601, flush_interval=3600)  # the flusher never gets to it
    assert store.use("AK1", "nonce-0000000000000001", utcnow())
    db.dispose()  # what Platform.close does: the store's last flush runs first
    db = open_db(sqlite_url)
    assert rows(db) == 1
    db.dispose()


def test_a_restart_remembers_the_window(sqlite_url: str) -> None:
    db = open_db(sqlite_url)
    store = MemoryNonceStore(db, 601, flush_interval=3600)
    now = utcnow()
    assert store.use("AK1", "nonce-recent-00000001", now)
    assert store.use("AK1", "nonce-old-0000000001", now - timedelta(seconds=700))
    db.dispose()
    db = open_db(sqlite_url)
    again = MemoryNonceStore(db, 601, flush_interval=3600)
    assert len(again) == 1  # only what is still inside the window is loaded
    assert not again.use("AK1", "nonce-recent-00000001", utcnow())
    db.dispose()


def test_nonces_older_than_the_window_are_dropped(db: Database) -> None:
    store = MemoryNonceStore(db, 10, flush_interval=3600)
    t0 = time.time()
    for i in range(100):
        store.use("AK1", f"nonce-{i:020d}", at(t0))
    assert len(store) == 100
    assert store.use("AK1", "nonce-later-000000001", at(t0 + 11))
    assert len(store) == 1
    store.close()


def test_a_failed_flush_is_retried(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryNonceStore(db, 601, flush_interval=3600)
    store.use("AK1", "nonce-0000000000000001", utcnow())
    engine = db.engine

    class Broken:
        def begin(self) -> None:
            raise RuntimeError("database is locked")

    monkeypatch.setattr(db, "engine", Broken())
    assert store.flush() == 0
    monkeypatch.setattr(db, "engine", engine)
    assert store.flush() == 1
    assert rows(db) == 1
    store.close()


# -- IdentityService, on both databases ----------------------------------------------------------------------


def identity(url: str, home: Path) -> tuple[Database, IdentityService]:
    """SQLite: the default database of the home (kept in memory); PostgreSQL: the given URL."""
    settings = Settings(home=home) if url.startswith("sqlite") else Settings(home=home, database_url=url)
    db = open_db(settings.resolved_database_url)
    key = load_or_create_server_key(home / "server.key")
    return db, IdentityService(db, SecretBox(key), settings, key)


def request(creds: Credentials, nonce: str) -> dict[str, object]:
    headers = signing.sign_headers(
        access_key=creds.access_key,
        secret_key=creds.secret_key,
        method="GET",
        path="/api/v1/whoami",
        query="",
        content_sha256=signing.body_sha256(b""),
        nonce=nonce,
    )
    return {
        "method": "GET",
        "path": "/api/v1/whoami",
        "query": "",
        "headers": {k.lower(): v for k, v in headers.items()},
        "body_sha256": signing.body_sha256(b""),
    }


def test_replays_are_refused_before_and_after_a_restart(database_url: str, tmp_path: Path) -> None:
    db, ids = identity(database_url, tmp_path)
    creds = ids.bootstrap()
    assert creds is not None
    first = request(creds, "restart-nonce-000000001")
    assert ids.authenticate(**first).key_id == creds.access_key  # type: ignore[arg-type]
    with pytest.raises(AuthFailure) as refused:
        ids.authenticate(**first)  # type: ignore[arg-type]
    assert refused.value.reason == "replayed"

    # The key is cached now: on SQLite the check needs no database (and no thread); on PostgreSQL it does.
    second = request(creds, "restart-nonce-000000002")
    fast = ids.authenticate_nonblocking(**second)  # type: ignore[arg-type]
    if db.dialect == "sqlite":
        assert fast is not None and fast.key_id == creds.access_key
        with pytest.raises(AuthFailure) as refused:
            ids.authenticate_nonblocking(**second)  # type: ignore[arg-type]
        assert refused.value.reason == "replayed"
    else:
        assert fast is None and ids.nonces is None
        ids.authenticate(**second)  # type: ignore[arg-type]
    # A refused request does not use up its nonce, on either path.
    third = request(creds, "restart-nonce-000000003")
    forged = request(Credentials(creds.endpoint, creds.access_key, "not-the-secret"), "restart-nonce-000000003")
    check = ids.authenticate_nonblocking if db.dialect == "sqlite" else ids.authenticate
    with pytest.raises(AuthFailure) as refused:
        check(**forged)  # type: ignore[arg-type]
    assert refused.value.reason == "signature"
    db.dispose()  # a clean stop

    db, ids = identity(database_url, tmp_path)
    for used in (first, second):
        with pytest.raises(AuthFailure) as refused:
            ids.authenticate(**used)  # type: ignore[arg-type]
        assert refused.value.reason == "replayed"
    assert ids.authenticate(**third).key_id == creds.access_key  # type: ignore[arg-type]
    db.dispose()


def test_a_named_sqlite_file_gets_the_synchronous_check(sqlite_url: str, tmp_path: Path) -> None:
    """KILN_DATABASE_URL may point several servers at one SQLite file: no in-memory nonces there."""
    db = open_db(sqlite_url)
    key = load_or_create_server_key(tmp_path / "server.key")
    ids = IdentityService(db, SecretBox(key), Settings(home=tmp_path, database_url=sqlite_url), key)
    assert ids.nonces is None and not db.exclusive
    creds = ids.bootstrap()
    assert creds is not None
    req = request(creds, "named-file-nonce-000001")
    assert ids.authenticate_nonblocking(**req) is None  # type: ignore[arg-type]
    ids.authenticate(**req)  # type: ignore[arg-type]
    with pytest.raises(AuthFailure) as refused:
        ids.authenticate(**req)  # type: ignore[arg-type]
    assert refused.value.reason == "replayed"
    db.dispose()


def test_a_key_not_in_the_cache_goes_to_the_blocking_path(tmp_path: Path) -> None:
    db, ids = identity(f"sqlite:///{tmp_path / 'kiln.db'}", tmp_path)
    creds = ids.bootstrap()
    assert creds is not None
    req = request(creds, "uncached-nonce-00000001")
    assert ids.authenticate_nonblocking(**req) is None  # type: ignore[arg-type]
    assert ids.nonces is not None and len(ids.nonces) == 0  # nothing used up
    assert ids.authenticate(**req).key_id == creds.access_key  # type: ignore[arg-type]
    db.dispose()

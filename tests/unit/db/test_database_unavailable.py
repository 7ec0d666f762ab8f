"""What an unreachable database raises: ``DatabaseUnavailable`` (503 with Retry-After through the API), raised from
the driver's error, at once; any other database error stays what it was."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError, OperationalError

from kiln.api.errors import install_error_handlers
from kiln.db.session import PG_CONNECT_TIMEOUT_SECONDS, Database, _postgresql_connect_args
from kiln.errors import DatabaseUnavailable
from tests.kilnserver import free_port


@pytest.fixture
def gone() -> Iterator[Database]:
    """A PostgreSQL database nothing listens for: connections are refused."""
    db = Database(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/gone")
    yield db
    db.dispose()


def test_a_database_that_refuses_connections_is_unavailable_for_every_unit_of_work(gone: Database) -> None:
    for work in (gone.transaction, gone.read, gone.bulk_transaction):
        with pytest.raises(DatabaseUnavailable) as caught, work() as s:
            s.execute(text("SELECT 1"))
        assert caught.value.message.startswith("the database is unavailable (the server cannot connect to it)")
        assert caught.value.details == {"retry_after": 2}
        assert isinstance(caught.value.__cause__, Exception) and "refused" in str(caught.value.__cause__).lower()
    with pytest.raises(DatabaseUnavailable):
        gone.ping()


def test_the_api_answers_it_with_503_its_code_and_retry_after(gone: Database) -> None:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/jobs")
    def jobs() -> None:
        with gone.read() as s:
            s.execute(text("SELECT 1"))

    response = TestClient(app, raise_server_exceptions=False).get("/jobs")
    assert response.status_code == 503
    assert response.json()["code"] == "database_unavailable"
    assert response.headers["Retry-After"] == "2"


def test_other_database_errors_are_left_as_they_are(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'kiln.db'}")
    try:
        with db.transaction() as s:
            s.execute(text("CREATE TABLE t (id INTEGER PRIMARY KEY)"))
            s.execute(text("INSERT INTO t VALUES (1)"))
        with pytest.raises(IntegrityError), db.transaction() as s:
            s.execute(text("INSERT INTO t VALUES (1)"))
        with pytest.raises(OperationalError), db.transaction() as s:
            s.execute(text("SELECT * FROM no_such_table"))
    finally:
        db.dispose()


def test_a_connect_timeout_and_tcp_settings_unless_the_url_sets_them() -> None:
    plain = _postgresql_connect_args("postgresql+psycopg://u@h/db")
    assert plain["connect_timeout"] == PG_CONNECT_TIMEOUT_SECONDS and plain["tcp_user_timeout"] == 10_000
    own = _postgresql_connect_args("postgresql+psycopg://u@h/db?connect_timeout=9&keepalives_idle=60")
    assert "connect_timeout" not in own and "keepalives_idle" not in own and own["keepalives_count"] == 3

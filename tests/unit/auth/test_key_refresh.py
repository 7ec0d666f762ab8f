"""A cached access key is read again off the request path before it expires (IdentityService.refresh_due, then
refresh_key in a worker thread nobody waits for), and its last-use time is written there too: requests that keep
coming never find it expired and never go to a worker thread for it. Before, every request after the key's entry
expired read it itself, behind whatever database work was queued in the worker threads (issue 26: at 16
concurrent predicts, 16 waits every 5 s, part of a p99 32 times the p50)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import update

from kiln.auth import signing
from kiln.auth.secrets import SecretBox, load_or_create_server_key
from kiln.db import migrate
from kiln.db.session import Database
from kiln.db.tables import AccessKey
from kiln.settings import Settings
from kiln.usecases.access import identity as identity_module
from kiln.usecases.access.identity import AuthFailure, Credentials, IdentityService


def signed(creds: Credentials, nonce: str) -> dict[str, object]:
    body = signing.body_sha256(b"")
    headers = signing.sign_headers(
        access_key=creds.access_key,
        secret_key=creds.secret_key,
        method="GET",
        path="/api/v1/whoami",
        query="",
        content_sha256=body,
        nonce=nonce,
    )
    headers = {k.lower(): v for k, v in headers.items()}
    return {"method": "GET", "path": "/api/v1/whoami", "query": "", "headers": headers, "body_sha256": body}


def last_used(db: Database, key_id: str) -> object:
    with db.read() as s:
        row = s.get(AccessKey, key_id)
        assert row is not None
        return row.last_used_at


def test_a_key_due_for_refresh_is_read_again_off_the_request_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(home=tmp_path)  # the home's SQLite database: nonces in memory, requests on the event loop
    db = Database(settings.resolved_database_url)
    migrate.upgrade(db.engine)
    key = load_or_create_server_key(tmp_path / "server.key")
    ids = IdentityService(db, SecretBox(key), settings, key)
    creds = ids.bootstrap()
    assert creds is not None and ids.nonces is not None
    ids.authenticate(**signed(creds, "refresh-nonce-0000000001"))  # type: ignore[arg-type]  # loads and caches it
    monkeypatch.setattr(identity_module, "KEY_REFRESH_SECONDS", 3600.0)
    assert not ids.refresh_due(creds.access_key)  # read within the hour, its last use just written

    monkeypatch.setattr(identity_module, "KEY_REFRESH_SECONDS", 0.0)  # every cached key is due from now on
    # A due key still answers on the event loop: the request does not read it, it says a refresh is due, once.
    principal = ids.authenticate_nonblocking(**signed(creds, "refresh-nonce-0000000002"))  # type: ignore[arg-type]
    assert principal is not None and principal.key_id == creds.access_key
    assert ids.refresh_due(creds.access_key)
    assert not ids.refresh_due(creds.access_key)  # under way: not a second one
    assert ids.authenticate_nonblocking(**signed(creds, "refresh-nonce-0000000003")) is not None  # type: ignore[arg-type]

    # Another server disables the key: the refresh reads that, and the next request is refused on the event loop.
    with db.transaction() as s:
        s.execute(update(AccessKey).where(AccessKey.id == creds.access_key).values(enabled=False))
    ids.refresh_key(creds.access_key)
    with pytest.raises(AuthFailure) as refused:
        ids.authenticate_nonblocking(**signed(creds, "refresh-nonce-0000000004"))  # type: ignore[arg-type]
    assert refused.value.reason == "key_disabled"
    assert ids.refresh_due(creds.access_key)  # the refresh ended: the next one may start
    db.dispose()


def test_the_last_use_is_written_by_the_refresh_not_by_a_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(home=tmp_path)
    db = Database(settings.resolved_database_url)
    migrate.upgrade(db.engine)
    key = load_or_create_server_key(tmp_path / "server.key")
    ids = IdentityService(db, SecretBox(key), settings, key)
    creds = ids.bootstrap()
    assert creds is not None
    ids.authenticate(**signed(creds, "last-used-nonce-00000001"))  # type: ignore[arg-type]
    first = last_used(db, creds.access_key)
    assert first is not None

    monkeypatch.setattr(identity_module, "LAST_USED_INTERVAL", -1.0)  # a write is due at every use
    # Due or not, the request itself is checked on the event loop (it used to go to a worker thread to write it).
    assert ids.authenticate_nonblocking(**signed(creds, "last-used-nonce-00000002")) is not None  # type: ignore[arg-type]
    assert last_used(db, creds.access_key) == first
    assert ids.refresh_due(creds.access_key)
    ids.refresh_key(creds.access_key)
    assert last_used(db, creds.access_key) != first
    db.dispose()

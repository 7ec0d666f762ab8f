"""A real server refuses a request replayed after it restarted: after a clean stop and after SIGKILL (once the
write-behind of used nonces, 0.1 s on SQLite, has had its turn). Synchronous on PostgreSQL."""

from __future__ import annotations

import time

import httpx
import pytest

from kiln.auth import signing
from tests.kilnserver import KilnServer


@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
def test_a_replay_after_a_restart_is_refused(make_server, database_url: str, stop: str) -> None:
    # SQLite: the default database of the server's KILN_HOME, where nonces are kept in memory (written behind).
    server: KilnServer = make_server(None if database_url.startswith("sqlite") else database_url)
    creds = server.credentials()
    headers = signing.sign_headers(
        access_key=creds["KILN_ACCESS_KEY"],
        secret_key=creds["KILN_SECRET_KEY"],
        method="GET",
        path="/api/v1/whoami",
        query="",
        content_sha256=signing.body_sha256(b""),
    )
    assert httpx.get(server.url + "/api/v1/whoami", headers=headers).status_code == 200
    time.sleep(0.5)  # more than the write-behind interval
    if stop == "sigkill":
        server.kill()
    else:
        server.stop()
    server.start()
    replay = httpx.get(server.url + "/api/v1/whoami", headers=headers)
    assert replay.status_code == 401, replay.text
    assert replay.json()["details"]["reason"] == "replayed"

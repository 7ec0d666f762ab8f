"""The requests an attacker sent, against a real server: each is refused with a 4xx that names what was wrong, and
the server's memory stays where it was.

The first opened an upload of 2628206758546830848 bytes, which was accepted; completing it then built a list of
156 billion part numbers (the process grew to 23 GB). The second sent sizes of 2**63 and 3.6e19 bytes, which
SQLite cannot store: 500 OverflowError.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from sqlalchemy import update

from kiln.db.session import Database
from kiln.db.tables import DatasetFile, DataUpload
from kiln.domain import limits
from kiln.errors import BadRequest, InvalidInput, KilnError, PayloadTooLarge
from kiln.sdk.client import Client
from tests.kilnserver import KilnServer

ATTACK_SIZE = 2628206758546830848
RSS_GROWTH = 100 * 1024 * 1024  # generous: the attack grew the process by gigabytes


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    home = tmp_path_factory.mktemp("limits")
    # A database named by URL, which another process may open too: the test writes a session as it was before.
    server = KilnServer(home / "home", f"sqlite:///{home / 'kiln.db'}").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server: KilnServer) -> Iterator[Client]:
    with server.client() as client:
        yield client


def rss(server: KilnServer) -> int:
    assert server.proc is not None
    return int(psutil.Process(server.proc.pid).memory_info().rss)


def refusal(client: Client, method: str, path: str, body: Any) -> KilnError:
    with pytest.raises(KilnError) as info:
        client.request(method, path, json_body=body)
    return info.value


def test_an_upload_over_the_largest_file_is_refused_at_creation(server: KilnServer, client: Client) -> None:
    before = rss(server)
    for size in (ATTACK_SIZE, 36_000_000_000_000_000_000, 2**63, limits.MAX_FILE_BYTES + 1):
        error = refusal(client, "POST", "/uploads", {"sha256": "a" * 64, "size": size})
        assert isinstance(error, InvalidInput), error
        assert error.details[0]["field"] == "size", error.details
        assert str(limits.MAX_FILE_BYTES) in error.details[0]["message"], error.details
    assert rss(server) - before < RSS_GROWTH


def test_an_upload_of_more_than_10000_parts_is_refused_at_creation(server: KilnServer, client: Client) -> None:
    """Through the API parts are 16 MiB: a file of more than 10,000 of them (156.25 GiB) cannot be uploaded."""
    most = limits.MAX_UPLOAD_PARTS * 16 * 1024 * 1024
    error = refusal(client, "POST", "/uploads", {"sha256": "b" * 64, "size": most + 1})
    assert isinstance(error, PayloadTooLarge), error
    assert "10001 parts" in error.message and str(most) in error.message, error.message
    assert error.details == {"field": "size", "max": most, "max_parts": limits.MAX_UPLOAD_PARTS}
    # At the limit: a session of exactly 10,000 parts opens, and nothing of it is allocated up front.
    session = client.request("POST", "/uploads", json_body={"sha256": "c" * 64, "size": most}).json()
    assert session["parts"] == limits.MAX_UPLOAD_PARTS and session["received"] == []
    missing = refusal(client, "POST", f"/uploads/{session['id']}/complete", None)
    assert missing.status == 409 and "10000 of 10000 part(s) not received" in missing.message
    assert len(missing.details["missing"]) == 1000


def test_completing_an_oversized_session_left_from_before_does_not_allocate(
    server: KilnServer, client: Client, tmp_path: Path
) -> None:
    """A session opened before sizes were bounded is completed: refused and removed, without enumerating its
    part numbers."""
    data = b"a blob that becomes huge"
    sha = hashlib.sha256(data).hexdigest()
    session = client.request("POST", "/uploads", json_body={"sha256": sha, "size": len(data)}).json()
    db = Database(server.env["KILN_DATABASE_URL"])
    try:
        with db.transaction() as s:
            s.execute(update(DataUpload).where(DataUpload.id == session["id"]).values(size=ATTACK_SIZE))
    finally:
        db.dispose()
    before = rss(server)
    error = refusal(client, "POST", f"/uploads/{session['id']}/complete", None)
    assert isinstance(error, BadRequest) and "open a new one" in error.message, error
    assert rss(server) - before < RSS_GROWTH
    # The session is gone: the same blob opens a new one of its real size.
    again = client.request("POST", "/uploads", json_body={"sha256": sha, "size": len(data)}).json()
    assert again["id"] != session["id"] and again["size"] == len(data)


@pytest.mark.parametrize("size", [2**63, 36_000_000_000_000_000_000, limits.MAX_FILE_BYTES + 1])
def test_a_manifest_file_over_the_largest_file_is_refused(client: Client, size: int) -> None:
    files = [{"path": "a.bin", "size": size, "sha256": "d" * 64}]
    error = refusal(client, "POST", "/datasets", {"name": "huge", "files": files})
    assert isinstance(error, InvalidInput), error
    assert error.details[0]["field"] == "files.0.size", error.details


def test_a_job_asking_for_more_than_the_largest_quantities_is_refused(client: Client) -> None:
    for resources, field in (
        ({"memory": "9" * 40 + "G"}, "spec.resources.memory"),
        ({"disk": 2**63}, "spec.resources.disk"),
        ({"memory": limits.MAX_RESOURCE_BYTES + 1}, "spec.resources.memory"),
    ):
        error = refusal(client, "POST", "/jobs", {"spec": {"command": "true", "resources": resources}})
        assert isinstance(error, InvalidInput), error
        assert error.details[0]["field"] == field, error.details


def test_a_version_stored_before_the_bounds_stays_readable(server: KilnServer, client: Client, tmp_path: Path) -> None:
    """Reads build manifests from the stored rows without validating them again: a file recorded above today's
    maximum (before it existed) is still listed, not a 500."""
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "f.bin").write_bytes(b"old data")
    client.put_dataset(tmp_path / "tree", "legacy", state_dir=tmp_path / "state")
    db = Database(server.env["KILN_DATABASE_URL"])
    try:
        with db.transaction() as s:
            s.execute(update(DatasetFile).where(DatasetFile.path == "f.bin").values(size=limits.MAX_FILE_BYTES + 1))
    finally:
        db.dispose()
    manifest = client.request("GET", "/datasets/legacy/versions/1").json()
    assert [(f["path"], f["size"]) for f in manifest["items"]] == [("f.bin", limits.MAX_FILE_BYTES + 1)]


def test_the_server_survived_every_refusal(server: KilnServer, client: Client) -> None:
    assert server.proc is not None and server.proc.poll() is None
    assert client.whoami().user_name

"""Datasets end to end against real servers: a Kiln server (subprocess) on a local store and on a real
S3-protocol server (moto), driven through the SDK, the raw signed API and the CLI."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kiln.errors import BadRequest, Conflict, DigestMismatch, Forbidden, InvalidInput, KilnError, NotFound
from kiln.sdk.client import Client
from kiln.storage.store import ObjectStore, crc32_hex
from tests.kilnserver import KilnServer
from tests.s3server import S3Server
from tests.tenancy_helpers import Api, close_all, create_tenant

MiB = 1024 * 1024


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    server = S3Server().start()
    yield server
    server.stop()


_buckets = iter(range(10**6))


@pytest.fixture(params=["local", "s3"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def kiln(store_kind: str, make_server: Callable[..., KilnServer], request: pytest.FixtureRequest) -> KilnServer:
    settings: dict[str, str] = {}
    if store_kind == "s3":
        s3: S3Server = request.getfixturevalue("s3")
        bucket = s3.create_bucket(f"kiln-ds-{os.getpid()}-{next(_buckets)}")
        settings = s3.kiln_settings(bucket)
    return make_server(**settings)


def server_store(server: KilnServer) -> ObjectStore:
    """The server's own store, opened from its settings (to check what was, or was not, written)."""
    url = server.env.get("KILN_STORAGE_URL")
    if url is None:
        return ObjectStore(str(server.home / "store"))
    return ObjectStore(
        url,
        key=server.env["KILN_STORAGE_ACCESS_KEY_ID"],
        secret=server.env["KILN_STORAGE_SECRET_ACCESS_KEY"],
        client_kwargs={"endpoint_url": server.env["KILN_STORAGE_ENDPOINT_URL"], "region_name": "us-east-1"},
    )


def data_objects(server: KilnServer, org_id: str) -> list[tuple[str, int]]:
    return server_store(server).list(f"orgs/{org_id}/data")


def make_tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


class PartCounter:
    """An SDK ``before_part`` hook: counts parts sent; optionally stops after ``stop_after`` or corrupts one."""

    def __init__(self, stop_after: int | None = None, corrupt: int | None = None) -> None:
        self.sent: list[tuple[str, int]] = []
        self.stop_after = stop_after
        self.corrupt = corrupt

    def __call__(self, sha256: str, number: int, data: bytes) -> bytes:
        if self.stop_after is not None and len(self.sent) >= self.stop_after:
            raise KeyboardInterrupt("interrupted by the test")
        self.sent.append((sha256, number))
        if self.corrupt == number:
            return bytes([data[0] ^ 0xFF]) + data[1:]
        return data


def test_put_ls_get_roundtrip_then_a_second_version_sends_only_what_changed(kiln: KilnServer, tmp_path: Path) -> None:
    client = kiln.client()
    files = {
        "train/images.bin": os.urandom(3 * MiB + 11),
        "train/labels.txt": b"0\n1\n2\n",
        "test/deep/nested/x.bin": os.urandom(20 * MiB + 1),
        "README": b"mnist, sort of\n",
        "empty.txt": b"",
    }
    src = make_tree(tmp_path / "src", files)
    first = PartCounter()
    v1 = client.put_dataset(src, "mnist", state_dir=tmp_path / "state", before_part=first)
    assert (v1.name, v1.version, v1.files, v1.size) == ("mnist", 1, 5, sum(map(len, files.values())))
    assert {sha for sha, _ in first.sent} == {hashlib.sha256(d).hexdigest() for d in files.values() if d}
    [summary] = client.datasets()
    assert (summary.name, summary.latest_version, summary.versions, summary.files) == ("mnist", 1, 1, 5)
    client.get_dataset("mnist", tmp_path / "out1")
    assert read_tree(tmp_path / "out1") == files

    # The same content again: no new version, nothing sent.
    again = PartCounter()
    assert client.put_dataset(src, "mnist", state_dir=tmp_path / "state", before_part=again).version == 1
    assert again.sent == []

    # One file changed, one added: only their blobs travel.
    (src / "train/labels.txt").write_bytes(b"9\n8\n")
    (src / "extra.bin").write_bytes(b"new file")
    second = PartCounter()
    v2 = client.put_dataset(src, "mnist", state_dir=tmp_path / "state", before_part=second)
    assert v2.version == 2
    assert {sha for sha, _ in second.sent} == {
        hashlib.sha256(b"9\n8\n").hexdigest(),
        hashlib.sha256(b"new file").hexdigest(),
    }
    assert [v.version for v in client.dataset_versions("mnist")] == [1, 2]
    client.get_dataset("mnist@1", tmp_path / "old")
    assert read_tree(tmp_path / "old") == files
    client.get_dataset("mnist", tmp_path / "new")
    assert read_tree(tmp_path / "new") == read_tree(src)
    manifest = client.dataset_manifest("mnist@2")
    assert [f.path for f in manifest.items] == sorted(read_tree(src))

    # The quota report counts each blob once, however many versions share it.
    unique = {hashlib.sha256(d).digest(): len(d) for d in [*files.values(), b"9\n8\n", b"new file"]}
    total = next(c for c in client.quota().categories if c.category == "total")
    assert total.used.storage == sum(unique.values())

    # Removing version 1 deletes only the blob nothing else uses (the old labels).
    removed = client.remove_dataset("mnist@1")
    assert removed.versions == [1] and removed.blobs_deleted == 1 and removed.bytes_freed == len(b"0\n1\n2\n")
    client.get_dataset("mnist@2", tmp_path / "after-rm")
    assert read_tree(tmp_path / "after-rm") == read_tree(src)
    with pytest.raises(NotFound):
        client.get_dataset("mnist@1", tmp_path / "gone")
    client.remove_dataset("mnist")
    assert client.datasets() == []
    org = client.whoami().org_id
    assert data_objects(kiln, org) == []


def test_roundtrip_on_postgresql(make_server: Callable[..., KilnServer], postgres_url: str, tmp_path: Path) -> None:
    server = make_server(postgres_url)
    client = server.client()
    src = make_tree(tmp_path / "src", {"a/b.txt": b"b", "c.bin": os.urandom(MiB)})
    assert client.put_dataset(src, "pg-data", state_dir=tmp_path / "s").version == 1
    client.get_dataset("pg-data@1", tmp_path / "out")
    assert read_tree(tmp_path / "out") == read_tree(src)
    assert server.client().datasets()[0].name == "pg-data"


def test_an_interrupted_200mb_put_resumes_with_only_the_missing_parts(kiln: KilnServer, tmp_path: Path) -> None:
    client = kiln.client()
    big = tmp_path / "src" / "big.bin"
    big.parent.mkdir()
    with open(big, "wb") as fh:
        for _ in range(25):
            fh.write(os.urandom(8 * MiB))
    state = tmp_path / "state"
    first = PartCounter(stop_after=4)
    with pytest.raises(KeyboardInterrupt):
        client.put_dataset(big.parent, "big", state_dir=state, before_part=first, workers=2)
    assert client.datasets() == []  # nothing visible yet
    sha = hashlib.sha256(big.read_bytes()).hexdigest()
    # The server kept the session and the parts it acknowledged; the state file kept the draft.
    session = client.request("POST", "/uploads", json_body={"sha256": sha, "size": big.stat().st_size}).json()
    received = set(session["received"])
    assert 4 <= len(received) < session["parts"]
    assert list(state.glob("*.json"))
    second = PartCounter()
    version = client.put_dataset(big.parent, "big", state_dir=state, before_part=second, workers=2)
    assert version.version == 1
    assert {n for _, n in second.sent} == set(range(1, session["parts"] + 1)) - received
    assert not list(state.glob("*.json"))  # done: the state file is gone
    client.get_dataset("big", tmp_path / "out")  # verifies the SHA-256 of every file
    assert hashlib.sha256((tmp_path / "out" / "big.bin").read_bytes()).hexdigest() == sha


@pytest.mark.parametrize("size", [2 * MiB, 6 * MiB], ids=["small-blobs", "session"])
def test_a_corrupt_part_is_refused_and_the_previous_version_stays(kiln: KilnServer, tmp_path: Path, size: int) -> None:
    """Under 4 MiB a file goes with others in one request (the server checks its SHA-256), above it in parts of
    its own upload session: either way a corrupt body is refused, named, and nothing changes."""
    client = kiln.client()
    src = make_tree(tmp_path / "src", {"a.bin": os.urandom(size)})
    client.put_dataset(src, "ds", state_dir=tmp_path / "s")
    (src / "a.bin").write_bytes(os.urandom(size))
    expected = "part 1" if size >= 4 * MiB else f"{src / 'a.bin'} arrived with other bytes"
    with pytest.raises(DigestMismatch, match=expected):
        client.put_dataset(src, "ds", state_dir=tmp_path / "s", before_part=PartCounter(corrupt=1))
    assert [v.version for v in client.dataset_versions("ds")] == [1]
    client.get_dataset("ds", tmp_path / "out")
    assert read_tree(tmp_path / "out") != read_tree(src)
    # The draft can be retried: the same put without corruption makes version 2.
    assert client.put_dataset(src, "ds", state_dir=tmp_path / "s").version == 2
    client.get_dataset("ds", tmp_path / "out2")
    assert read_tree(tmp_path / "out2") == read_tree(src)


def test_the_server_checks_parts_sent_straight_to_s3(
    s3: S3Server, make_server: Callable[..., KilnServer], tmp_path: Path
) -> None:
    """A client that skips its own ETag check still cannot complete a blob from corrupt parts."""
    server = make_server(**s3.kiln_settings(s3.create_bucket("kiln-ds-presign-check")))
    client = server.client()
    data = os.urandom(6 * MiB)
    sha = hashlib.sha256(data).hexdigest()
    session = client.request("POST", "/uploads", json_body={"sha256": sha, "size": len(data)}).json()
    assert session["mode"] == "presigned" and session["parts"] == 1
    declared = {"size": len(data), "md5": hashlib.md5(data).hexdigest(), "crc32": crc32_hex(data)}
    url = client.request("POST", f"/uploads/{session['id']}/parts/1/url", json_body=declared)
    target = url.json()
    assert "Authorization" not in target["headers"] and "X-Kiln" not in str(target["headers"])
    assert set(target["headers"]) == {"Content-MD5", "x-amz-checksum-crc32"}
    corrupt = bytes([data[0] ^ 0xFF]) + data[1:]  # always differs (a zero byte would not, once in 256 runs)
    httpx.put(target["url"], content=corrupt, headers=target["headers"])  # real S3 refuses it outright
    with pytest.raises(DigestMismatch, match="part 1"):
        client.request("POST", f"/uploads/{session['id']}/complete")
    assert not server_store(server).list("orgs")
    # Sent again correctly, it completes.
    target = client.request("POST", f"/uploads/{session['id']}/parts/1/url", json_body=declared).json()
    assert httpx.put(target["url"], content=data, headers=target["headers"]).status_code == 200
    assert client.request("POST", f"/uploads/{session['id']}/complete").json()["complete"] is True


def test_presigned_urls_for_many_parts_at_once_and_the_part_size_a_client_asks_for(
    s3: S3Server, make_server: Callable[..., KilnServer], tmp_path: Path
) -> None:
    """POST /uploads/{id}/parts/urls: one request presigns many parts (each with its Content-MD5, recorded and
    checked again at completion); a new session takes the client's part size when S3 allows it."""
    server = make_server(**s3.kiln_settings(s3.create_bucket("kiln-ds-batch-urls")))
    client = server.client()
    data = os.urandom(12 * MiB + 123)
    sha = hashlib.sha256(data).hexdigest()
    session = client.request(
        "POST", "/uploads", json_body={"sha256": sha, "size": len(data), "part_size": 5 * MiB}
    ).json()
    assert session["mode"] == "presigned" and session["part_size"] == 5 * MiB and session["parts"] == 3
    # Asking again (resuming) keeps the session's part size, whatever the new preference.
    again = client.request("POST", "/uploads", json_body={"sha256": sha, "size": len(data), "part_size": 8 * MiB})
    assert again.json()["id"] == session["id"] and again.json()["part_size"] == 5 * MiB
    chunks = [data[i : i + 5 * MiB] for i in range(0, len(data), 5 * MiB)]
    parts = [
        {"number": n, "size": len(c), "md5": hashlib.md5(c).hexdigest(), "crc32": crc32_hex(c)}
        for n, c in enumerate(chunks, 1)
    ]
    urls = f"/uploads/{session['id']}/parts/urls"
    bad_bodies = [
        ({"parts": [parts[0], parts[0]]}, BadRequest, "at most once"),
        ({"parts": [{**parts[1], "size": 5}]}, BadRequest, "part 2 is"),
        ({"parts": [{**parts[0], "number": 4}]}, BadRequest, "parts 1 to 3"),
    ]
    for body, error, text in bad_bodies:
        with pytest.raises(error, match=text):
            client.request("POST", urls, json_body=body)
    with pytest.raises(KilnError):  # validation: at least one part, MD5 and CRC32 in hex, both required
        client.request("POST", urls, json_body={"parts": []})
    with pytest.raises(KilnError):
        client.request("POST", urls, json_body={"parts": [{**parts[0], "md5": "x" * 32}]})
    with pytest.raises(KilnError, match="crc32"):
        client.request("POST", urls, json_body={"parts": [{k: v for k, v in parts[0].items() if k != "crc32"}]})
    answer = client.request("POST", urls, json_body={"parts": list(reversed(parts))}).json()
    assert [u["number"] for u in answer["items"]] == [3, 2, 1]  # the order asked for
    by_number = {u["number"]: u for u in answer["items"]}
    for u in answer["items"]:
        assert "Authorization" not in u["headers"] and "X-Kiln" not in str(u["headers"])
    # Part 2 goes corrupt: the server refuses to assemble, names it; sent again correctly, the blob completes.
    for n, chunk in enumerate(chunks, 1):
        body = bytes([chunk[0] ^ 0xFF]) + chunk[1:] if n == 2 else chunk
        httpx.put(by_number[n]["url"], content=body, headers=by_number[n]["headers"])
    with pytest.raises(DigestMismatch, match="part 2"):
        client.request("POST", f"/uploads/{session['id']}/complete")
    fresh = client.request("POST", urls, json_body={"parts": [parts[1]]}).json()["items"][0]
    assert httpx.put(fresh["url"], content=chunks[1], headers=fresh["headers"]).status_code == 200
    assert client.request("POST", f"/uploads/{session['id']}/complete").json()["complete"] is True
    # A part size outside S3's limits is not taken: the server's own (32 MiB by default) is.
    small = os.urandom(MiB)
    other = client.request(
        "POST",
        "/uploads",
        json_body={"sha256": hashlib.sha256(small).hexdigest(), "size": len(small), "part_size": MiB},
    ).json()
    assert other["part_size"] == 32 * MiB and other["parts"] == 1
    # Another organisation's client cannot use the session.
    outsider = create_tenant(Api.admin(server), "batch-outsider", roles=("admin",))
    try:
        account = outsider.accounts["admin"]
        with pytest.raises(NotFound):
            Client(server.url, account.key_id, account.secret).request(
                "POST", f"/uploads/{other['id']}/parts/urls", json_body={"parts": parts[:1]}
            )
    finally:
        close_all(outsider)


def test_parts_sent_to_s3_declare_the_digests_read_with_the_file_hash_unless_the_session_has_other_parts(
    kiln: KilnServer, store_kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GET /uploads/config tells the client how parts travel before it hashes; on S3 the parts' MD5 and CRC32 come
    from the same read as the file's SHA-256, so each part is read once more only to be sent. A session opened
    with another part size (an older client's, resumed) has its digests computed again, part by part."""
    from kiln.sdk import upload

    client = kiln.client()
    config = client.request("GET", "/uploads/config").json()
    presigned = store_kind == "s3"
    assert config["mode"] == ("presigned" if presigned else "api")
    assert config["max_parts"] == 10_000
    assert config["min_part_size"] == (5 * MiB if presigned else 16 * MiB)
    assert (config["small_blob_bytes"], config["small_blobs_body_bytes"]) == (4 * MiB, 16 * MiB)
    reads: list[tuple[str, int]] = []
    real_read = upload.read_part

    def counting(source: Path, offset: int, length: int) -> bytes:
        reads.append((source.name, offset))
        return real_read(source, offset, length)

    monkeypatch.setattr(upload, "read_part", counting)
    big = tmp_path / "src" / "big.bin"
    big.parent.mkdir()
    big.write_bytes(os.urandom(20 * MiB + 5))
    sent = PartCounter()
    assert client.put_dataset(big.parent, "once", state_dir=tmp_path / "s", before_part=sent).version == 1
    assert len(sent.sent) == (3 if presigned else 2)  # 8 MiB parts straight to S3, 16 MiB through the API
    assert sorted(reads) == sorted(set(reads)) and len(reads) == len(sent.sent)  # each part read once to send
    # A session with 5 MiB parts, as an older client opened it: resumed with its own part size.
    other = tmp_path / "other" / "other.bin"
    other.parent.mkdir()
    other.write_bytes(os.urandom(12 * MiB))
    sha = hashlib.sha256(other.read_bytes()).hexdigest()
    body = {"sha256": sha, "size": 12 * MiB, "part_size": 5 * MiB}
    session = client.request("POST", "/uploads", json_body=body).json()
    reads.clear()
    sent = PartCounter()
    assert client.put_dataset(other.parent, "resumed", state_dir=tmp_path / "s", before_part=sent).version == 1
    if presigned:
        assert session["part_size"] == 5 * MiB and len(sent.sent) == 3
        assert len(reads) == 6 and len(set(reads)) == 3  # digests computed again: each part read twice
    client.get_dataset("resumed", tmp_path / "out")  # SHA-256 verified
    assert (tmp_path / "out" / "other.bin").read_bytes() == other.read_bytes()


def blobs_body(blobs: list[bytes], header: Any = None) -> bytes:
    """A POST /uploads/blobs body: the JSON line, then the bytes."""
    declared = header or {"blobs": [{"sha256": hashlib.sha256(b).hexdigest(), "size": len(b)} for b in blobs]}
    return json.dumps(declared).encode() + b"\n" + b"".join(blobs)


def test_many_small_files_go_many_to_a_request_without_upload_sessions(
    kiln: KilnServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = kiln.client()
    sent: list[tuple[str, str]] = []
    real_request = client.request

    def counting(method: str, path: str, **kwargs: Any) -> httpx.Response:
        sent.append((method, path))
        return real_request(method, path, **kwargs)

    monkeypatch.setattr(client, "request", counting)
    rng = random.Random(7)
    files = {f"shard-{i:04d}/{i}.bin": os.urandom(rng.randrange(0, 200_000)) for i in range(300)}
    files["copy/same-as-first.bin"] = files["shard-0000/0.bin"]  # one content, two names
    files["big.bin"] = os.urandom(5 * MiB)  # over 4 MiB: its own session
    src = make_tree(tmp_path / "src", files)
    version = client.put_dataset(src, "shards", state_dir=tmp_path / "s")
    assert (version.files, version.size) == (len(files), sum(map(len, files.values())))
    batches = [p for m, p in sent if p == "/uploads/blobs"]
    sessions = [p for m, p in sent if m == "POST" and p == "/uploads"]
    small_bytes = sum(len(d) for n, d in files.items() if n != "big.bin")
    assert 2 <= len(batches) <= 2 + small_bytes // (15 * MiB)  # ~30 MB in 16 MiB bodies
    assert len(sessions) == 1
    client.get_dataset("shards", tmp_path / "out")  # every SHA-256 verified
    assert read_tree(tmp_path / "out") == files
    # A second version with one file changed sends that file alone.
    sent.clear()
    (src / "shard-0007" / "7.bin").write_bytes(b"changed")
    assert client.put_dataset(src, "shards", state_dir=tmp_path / "s").version == 2
    assert [p for _, p in sent].count("/uploads/blobs") == 1 and ("POST", "/uploads") not in sent


def test_a_put_reads_only_the_files_that_changed_since_the_last_one(
    kiln: KilnServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kiln.sdk import hash_cache, upload

    monkeypatch.setattr(hash_cache, "RACY_SECONDS", 0)  # files written just now count as settled
    hashed: list[str] = []
    real_hash = upload.hash_file

    def counting(source: Path, part_size: int | None = None, pool: Any = None) -> Any:
        hashed.append(source.name)
        return real_hash(source, part_size, pool)

    monkeypatch.setattr(upload, "hash_file", counting)
    client = kiln.client()
    src = make_tree(
        tmp_path / "src", {f"{i}.bin": os.urandom(50_000) for i in range(20)} | {"big.bin": os.urandom(6 * MiB)}
    )
    state = tmp_path / "home" / "uploads"
    assert client.put_dataset(src, "cached", state_dir=state).version == 1
    assert len(hashed) == 21 and (tmp_path / "home" / "hashes.sqlite").is_file()
    hashed.clear()
    assert client.put_dataset(src, "cached", state_dir=state).version == 1  # nothing changed, nothing read
    assert hashed == []
    (src / "7.bin").write_bytes(b"changed")
    version = client.put_dataset(src, "cached", state_dir=state)
    assert version.version == 2 and hashed == ["7.bin"]
    hashed.clear()
    assert client.put_dataset(src, "cached", state_dir=state, rehash=True).version == 2
    assert len(hashed) == 21
    client.get_dataset("cached", tmp_path / "out")
    assert read_tree(tmp_path / "out") == read_tree(src)


def test_the_small_blobs_route_checks_everything_before_it_writes(kiln: KilnServer, tmp_path: Path) -> None:
    client = kiln.client()
    me = client.whoami()
    url = "/uploads/blobs"
    headers = {"Content-Type": "application/octet-stream"}
    a, b = os.urandom(1000), os.urandom(2000)
    sha_a = hashlib.sha256(a).hexdigest()
    bad_bodies = [
        (json.dumps({"blobs": []}).encode() + b"\n", "the blobs header: blobs"),
        (b"no header line at all", "JSON line"),
        (blobs_body([a], {"blobs": [{"sha256": "x", "size": 1000}]}), "blobs.0.sha256"),
        (blobs_body([a], {"blobs": [{"sha256": sha_a, "size": 1000, "path": "/etc"}]}), "blobs.0.path"),
        (blobs_body([a, b])[:-1], "holds 2999 bytes after its header, which declares 3000"),
        (blobs_body([a], {"blobs": [{"sha256": sha_a, "size": 1}] * 1001}), "at most 1000"),
    ]
    for body, text in bad_bodies:
        with pytest.raises(BadRequest, match=text):
            client.request("POST", url, content=body, extra_headers=headers)
    # One corrupt blob: refused, named (its declared SHA-256 in the details), and the good one is not stored.
    corrupt = blobs_body([a, b], {"blobs": [{"sha256": sha_a, "size": 1000}, {"sha256": sha_a, "size": 2000}]})
    with pytest.raises(DigestMismatch, match="blob 2 of 2") as refused:
        client.request("POST", url, content=corrupt, extra_headers=headers)
    assert refused.value.details == {"sha256": sha_a}
    assert data_objects(kiln, me.org_id) == []
    # Over the storage quota: 403 with the numbers, nothing written.
    client.set_quota(me.org_id, category="total", storage=2500)
    with pytest.raises(
        Forbidden, match=r"quota: storage 0 B in use \+ 2.9 KiB would exceed the limit of 2.4 KiB"
    ) as over:
        client.request("POST", url, content=blobs_body([a, b]), extra_headers=headers)
    assert over.value.details == {"used": 0, "adding": 3000, "limit": 2500}
    assert data_objects(kiln, me.org_id) == []
    client.set_quota(me.org_id, category="total", storage=10_000)
    # The same content twice in one body is stored once; a blob already held is not written again.
    stored = client.request("POST", url, content=blobs_body([a, a]), extra_headers=headers).json()
    assert stored == {"stored": 1, "present": 0, "bytes": 1000}
    again = client.request("POST", url, content=blobs_body([a, b]), extra_headers=headers).json()
    assert again == {"stored": 1, "present": 1, "bytes": 2000}
    assert sorted(size for _, size in data_objects(kiln, me.org_id)) == [1000, 2000]
    total = next(c for c in client.quota().categories if c.category == "total")
    assert total.used.storage == 3000
    # The blobs are usable at once: a manifest naming them has nothing missing.
    draft = client.request(
        "POST", "/datasets", json_body={"name": "two", "files": [{"path": "a", "size": 1000, "sha256": sha_a}]}
    ).json()
    assert draft["missing"] == []


def test_a_small_blob_ends_the_upload_session_an_interrupted_put_left(kiln: KilnServer) -> None:
    """A session left open for a blob reserves its size; storing the blob many-to-a-request ends it."""
    client = kiln.client()
    me = client.whoami()
    data = os.urandom(3 * MiB)
    sha = hashlib.sha256(data).hexdigest()
    session = client.request("POST", "/uploads", json_body={"sha256": sha, "size": len(data)}).json()
    assert session["complete"] is False
    total = next(c for c in client.quota().categories if c.category == "total")
    assert total.used.storage == len(data)  # reserved by the session
    answer = client.request(
        "POST", "/uploads/blobs", content=blobs_body([data]), extra_headers={"Content-Type": "application/octet-stream"}
    ).json()
    assert answer["stored"] == 1
    total = next(c for c in client.quota().categories if c.category == "total")
    assert total.used.storage == len(data)  # counted once: the session is gone
    assert client.request("POST", "/uploads", json_body={"sha256": sha, "size": len(data)}).json()["complete"]
    assert [size for _, size in data_objects(kiln, me.org_id)] == [len(data)]


def test_batch_part_urls_are_refused_on_a_store_without_presigned_urls(make_server: Callable[..., KilnServer]) -> None:
    client = make_server().client()
    data = b"through the API"
    sha = hashlib.sha256(data).hexdigest()
    session = client.request("POST", "/uploads", json_body={"sha256": sha, "size": len(data), "part_size": 8 * MiB})
    assert session.json()["mode"] == "api" and session.json()["part_size"] == 16 * MiB  # the preference: S3 only
    part = {"number": 1, "size": len(data), "md5": hashlib.md5(data).hexdigest(), "crc32": crc32_hex(data)}
    with pytest.raises(BadRequest, match="through the API"):
        client.request("POST", f"/uploads/{session.json()['id']}/parts/urls", json_body={"parts": [part]})


BAD_PATHS = [
    ("../x", "'..'"),
    ("/etc/passwd", "absolute"),
    ("a/../../b", "'..'"),
    ("%2e%2e/x", "%2e"),
    ("a%2fb", "%2f"),
    ("a\\b", "backslash"),
    ("a//b", "empty"),
    ("./a", "'.'"),
]
BAD_NAMES = ["../x", "a%2fb", "%2e%2e", "Upper", "a/b", "a..b", "-x", "x" * 101, "a\\b"]


def test_paths_and_names_that_could_escape_are_refused_and_nothing_is_written(kiln: KilnServer, tmp_path: Path) -> None:
    client = kiln.client()
    org = client.whoami().org_id
    blob = {"size": 1, "sha256": hashlib.sha256(b"x").hexdigest()}
    for bad, why in BAD_PATHS:
        with pytest.raises(BadRequest) as info:
            client.request("POST", "/datasets", json_body={"name": "ok", "files": [{"path": bad, **blob}]})
        assert why in info.value.message and repr(bad)[1:-1] in info.value.message, info.value.message
    # A NUL is refused before any route reads the body, naming where it was (kiln.api.nul).
    with pytest.raises(InvalidInput, match=r"files\.0\.path: must not contain a NUL"):
        client.request("POST", "/datasets", json_body={"name": "ok", "files": [{"path": "a\x00b", **blob}]})
    for bad in BAD_NAMES:
        with pytest.raises(BadRequest, match="dataset name"):
            client.request("POST", "/datasets", json_body={"name": bad, "files": [{"path": "a", **blob}]})
    # Reads with such names or paths in the URL: refused, never resolved outside the organisation's data.
    for raw in ("/api/v1/datasets/%2e%2e", "/api/v1/datasets/a%252fb/versions/1/files/x"):
        api = Api(kiln.url, *client_keys(kiln))
        assert api.request("GET", raw).status_code in (400, 404)
        api.close()
    client.put_dataset(make_tree(tmp_path / "ok", {"f": b"x"}), "ok", state_dir=tmp_path / "s")
    api = Api(kiln.url, *client_keys(kiln))
    for raw in ("/datasets/ok/versions/1/files/%2e%2e/%2e%2e/server.key", "/datasets/ok/versions/1/files/a%5cb"):
        response = api.request("GET", raw)
        assert response.status_code == 400, (raw, response.text)
    api.close()
    client.remove_dataset("ok")
    assert client.datasets() == []
    assert data_objects(kiln, org) == []
    assert not list((kiln.home / "store").rglob("*passwd*")) if (kiln.home / "store").exists() else True


def client_keys(server: KilnServer) -> tuple[str, str]:
    creds = server.credentials()
    return creds["KILN_ACCESS_KEY"], creds["KILN_SECRET_KEY"]


def test_the_cli_refuses_links_in_a_local_directory(kiln: KilnServer, tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", {"real.txt": b"real"})
    (src / "link").symlink_to("/etc/passwd")
    env = {**os.environ, **cli_env(kiln, tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "kiln", "data", "put", str(src), "linked"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 1, result
    assert "symbolic link" in result.stderr and "link" in result.stderr
    assert kiln.client().datasets() == []
    os.link(src / "real.txt", src / "hard.txt")
    (src / "link").unlink()
    result = subprocess.run(
        [sys.executable, "-m", "kiln", "data", "put", str(src), "linked"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 1 and "hard link" in result.stderr, result


def cli_env(server: KilnServer, tmp_path: Path) -> dict[str, str]:
    creds = server.credentials()
    return {
        "KILN_ENDPOINT": server.url,
        "KILN_ACCESS_KEY": creds["KILN_ACCESS_KEY"],
        "KILN_SECRET_KEY": creds["KILN_SECRET_KEY"],
        "HOME": str(tmp_path / "home"),
    }


def test_the_cli_puts_lists_gets_and_removes(kiln: KilnServer, tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", {"a/b.txt": b"hello", "c.bin": os.urandom(MiB)})
    env = {**os.environ, **cli_env(kiln, tmp_path)}

    def kiln_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "kiln", *args], env=env, capture_output=True, text=True)

    put = kiln_cli("data", "put", str(src), "cli-data")
    assert put.returncode == 0 and put.stdout.strip() == "cli-data@1", put
    assert (tmp_path / "home" / ".kiln" / "hashes.sqlite").is_file()  # the hashes, for the next put
    again = kiln_cli("data", "put", "--rehash", str(src), "cli-data")
    assert again.returncode == 0 and again.stdout.strip() == "cli-data@1", again  # the same files: no new version
    ls = kiln_cli("data", "ls")
    assert ls.returncode == 0 and "cli-data" in ls.stdout, ls
    versions = kiln_cli("data", "ls", "cli-data", "-o", "json")
    assert versions.returncode == 0 and '"version": 1' in versions.stdout, versions
    get = kiln_cli("data", "get", "cli-data@1", str(tmp_path / "out"))
    assert get.returncode == 0 and "verified" in get.stderr, get
    assert read_tree(tmp_path / "out") == read_tree(src)
    missing = kiln_cli("data", "get", "cli-data@7", str(tmp_path / "out7"))
    assert missing.returncode == 1 and "cli-data has no version 7; it has 1 (latest 1)" in missing.stderr, missing
    rm = kiln_cli("data", "rm", "cli-data")
    assert rm.returncode == 0 and "removed" in rm.stderr, rm
    assert kiln.client().datasets() == []


def test_another_organisation_can_never_see_read_or_overwrite_a_dataset(kiln: KilnServer, tmp_path: Path) -> None:
    admin = Api.admin(kiln)
    a = create_tenant(admin, "org-a", roles=("member", "viewer"))
    b = create_tenant(admin, "org-b", roles=("member",))
    try:
        alice = Client(kiln.url, a.accounts["member"].key_id, a.accounts["member"].secret)
        viewer = Client(kiln.url, a.accounts["viewer"].key_id, a.accounts["viewer"].secret)
        bob = Client(kiln.url, b.accounts["member"].key_id, b.accounts["member"].secret)
        secret = os.urandom(MiB)
        src = make_tree(tmp_path / "a", {"secret.bin": secret})
        alice.put_dataset(src, "secret", state_dir=tmp_path / "sa")
        assert bob.datasets() == []
        for call in (
            lambda: bob.dataset_versions("secret"),
            lambda: bob.dataset_manifest("secret@1"),
            lambda: bob.get_dataset("secret@1", tmp_path / "stolen"),
            lambda: bob.remove_dataset("secret"),
            lambda: bob.remove_dataset("secret@1"),
        ):
            with pytest.raises(NotFound) as info:
                call()
            assert a.id not in info.value.message
        assert not list((tmp_path / "stolen").rglob("*")) if (tmp_path / "stolen").exists() else True
        # Knowing the content's hash gives B nothing: its upload session is its own, and must send the bytes.
        sha = hashlib.sha256(secret).hexdigest()
        session = bob.request("POST", "/uploads", json_body={"sha256": sha, "size": len(secret)}).json()
        assert session["complete"] is False and session["received"] == []
        files = [{"path": "s", "size": len(secret), "sha256": sha}]
        draft = bob.request("POST", "/datasets", json_body={"name": "secret", "files": files}).json()
        assert draft["missing"] == [sha]
        with pytest.raises(Conflict):
            bob.request("POST", f"/datasets/drafts/{draft['id']}/commit")
        # B's own "secret" is B's: A's is untouched.
        bob.put_dataset(make_tree(tmp_path / "b", {"mine.txt": b"bob"}), "secret", state_dir=tmp_path / "sb")
        alice.get_dataset("secret", tmp_path / "a-out")
        assert read_tree(tmp_path / "a-out") == {"secret.bin": secret}
        # A's viewer reads but may not write or remove.
        viewer.get_dataset("secret@1", tmp_path / "viewer-out")
        with pytest.raises(Forbidden):
            viewer.remove_dataset("secret")
        with pytest.raises(Forbidden):
            viewer.put_dataset(src, "other", state_dir=tmp_path / "sv")
        for c in (alice, viewer, bob):
            c.close()
    finally:
        close_all(a, b)
        admin.close()


def test_the_storage_quota_refuses_a_put_with_the_numbers_and_writes_nothing(kiln: KilnServer, tmp_path: Path) -> None:
    client = kiln.client()
    me = client.whoami()
    client.put_dataset(make_tree(tmp_path / "small", {"s.bin": os.urandom(MiB)}), "small", state_dir=tmp_path / "s")
    client.set_quota(me.org_id, category="total", storage=3 * MiB)
    src = make_tree(tmp_path / "big", {"b.bin": os.urandom(5 * MiB)})
    with pytest.raises(Forbidden, match=r"quota: storage 1 MiB in use \+ 5 MiB would exceed the limit of 3 MiB \(org "):
        client.put_dataset(src, "big", state_dir=tmp_path / "s")
    assert [d.name for d in client.datasets()] == ["small"]
    total = next(c for c in client.quota().categories if c.category == "total")
    assert total.used.storage == MiB
    assert [size for _, size in data_objects(kiln, me.org_id)] == [MiB]
    client.set_quota(me.org_id, category="total", storage=None)
    assert client.put_dataset(src, "big", state_dir=tmp_path / "s").version == 1


def test_a_store_that_is_down_answers_503_naming_it(make_server: Callable[..., KilnServer], tmp_path: Path) -> None:
    own = S3Server().start()
    try:
        server = make_server(**own.kiln_settings(own.create_bucket("kiln-ds-down")))
        client = server.client()
        src = make_tree(tmp_path / "src", {"f.bin": os.urandom(MiB)})
        client.put_dataset(src, "before", state_dir=tmp_path / "s")
    finally:
        own.stop()
    (src / "f.bin").write_bytes(os.urandom(MiB))
    with pytest.raises(KilnError) as info:
        client.put_dataset(src, "before", state_dir=tmp_path / "s")
    assert info.value.code == "store_unavailable"
    assert "object store s3://kiln-ds-down/kiln" in info.value.message and own.endpoint in info.value.message
    # The previous version is still the latest (the database never pointed at half-written data).
    assert [v.version for v in client.dataset_versions("before")] == [1]
    # Code bundle uploads give the same clear 503.
    api = Api(server.url, *client_keys(server))
    bundle = b"\x1f\x8b" + b"\0" * 64
    response = api.request("PUT", f"/blobs/{hashlib.sha256(bundle).hexdigest()}", content=bundle, unsigned=True)
    api.close()
    assert response.status_code in (400, 503), response.text  # (an invalid archive is refused before the store)
    assert "Traceback" not in server.log()


def in_process(tmp_path: Path) -> tuple[Any, Any, Any, ObjectStore]:
    """A DatasetService on its own database and local store (no HTTP): what the executor's process holds."""
    from kiln.db import migrate
    from kiln.db.session import Database
    from kiln.db.tables import Organization, User
    from kiln.settings import Settings
    from kiln.usecases.access.identity import Principal
    from kiln.usecases.data.datasets import DatasetService

    db = Database(f"sqlite:///{tmp_path / 'k.db'}")
    migrate.upgrade(db.engine)
    with db.transaction() as s:
        s.add(Organization(id="org-1", name="acme"))
        s.flush()
        s.add(User(id="usr-1", org_id="org-1", name="ann"))
    store = ObjectStore(str(tmp_path / "store"))
    svc = DatasetService(db, store, Settings(home=tmp_path / "home"), None)
    return db, svc, Principal("usr-1", "ann", "org-1", "acme", "AK", "member", False), store


def put_in_process(svc: Any, me: Any, name: str, files: dict[str, bytes]) -> int:
    from kiln.domain.datasets import DatasetFileEntry, DraftCreate

    entries = [DatasetFileEntry(path=p, size=len(d), sha256=hashlib.sha256(d).hexdigest()) for p, d in files.items()]
    draft = svc.create_draft(me, DraftCreate(name=name, files=entries))
    for data in files.values():
        sha = hashlib.sha256(data).hexdigest()
        session = svc.open_upload(me, sha, len(data))
        if not session.complete:
            svc.put_part(me, session.id, 1, data, sha)
            svc.complete_upload(me, session.id)
    return int(svc.commit(me, draft.id).version)


def test_resolve_gives_the_executor_the_files_and_store_keys(tmp_path: Path) -> None:
    """The in-process interface the executor uses: ``DatasetService.resolve`` + ``ObjectStore.download``."""
    from kiln.usecases.data.datasets import DatasetFile, ResolvedDataset

    db, svc, me, store = in_process(tmp_path)
    data = b"some bytes"
    sha = hashlib.sha256(data).hexdigest()
    assert put_in_process(svc, me, "d", {"x/y.txt": data}) == 1
    resolved = svc.resolve("org-1", "d")
    assert resolved == ResolvedDataset(
        name="d", version=1, files=[DatasetFile("x/y.txt", 10, sha, f"orgs/org-1/data/sha256/{sha[:2]}/{sha}")]
    )
    assert svc.resolve("org-1", "d@1") == resolved
    store.download(resolved.files[0].key, tmp_path / "got")
    assert (tmp_path / "got").read_bytes() == data
    for ref in ("d@2", "nope"):
        with pytest.raises(NotFound):
            svc.resolve("org-1", ref)
    with pytest.raises(NotFound):
        svc.resolve("org-2", "d")
    db.dispose()


@pytest.mark.parametrize("state", ["QUEUED", "RUNNING"])
def test_removing_a_version_a_job_reads_is_refused_until_the_job_ends(tmp_path: Path, state: str) -> None:
    from kiln.db.tables import Job

    db, svc, me, _store = in_process(tmp_path)
    assert put_in_process(svc, me, "pinned", {"f": b"1"}) == 1
    assert put_in_process(svc, me, "pinned", {"f": b"2"}) == 2
    assert put_in_process(svc, me, "latest", {"f": b"3"}) == 1
    with db.transaction() as s:
        spec = {"command": "true", "inputs": [{"dataset": "pinned@1"}, {"dataset": "latest"}]}
        s.add(Job(id="job-1", org_id="org-1", user_id="usr-1", name="n", spec=spec, state=state))
        s.add(Job(id="job-2", org_id="org-1", user_id="usr-1", name="n", spec={"command": "true"}, state=state))
    with pytest.raises(Conflict, match=f"pinned@1 is an input of job job-1 \\({state}\\)"):
        svc.remove(me, "pinned", 1)
    with pytest.raises(Conflict):
        svc.remove(me, "pinned", None)
    with pytest.raises(Conflict, match="latest@1"):  # NAME alone pins the latest version
        svc.remove(me, "latest", None)
    assert svc.remove(me, "pinned", 2).versions == [2]  # not pinned
    with db.transaction() as s:
        job = s.get(Job, "job-1")
        assert job is not None
        job.state = "SUCCEEDED"
    assert svc.remove(me, "pinned", 1).versions == [1]
    assert svc.remove(me, "latest", None).versions == [1]
    db.dispose()

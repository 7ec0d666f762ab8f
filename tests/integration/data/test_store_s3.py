"""ObjectStore on a real S3-protocol server (moto) through s3fs/boto3, and its errors on both kinds of store."""

from __future__ import annotations

import hashlib
import os
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kiln.errors import BadRequest, DigestMismatch, NotFound, StoreUnavailable
from kiln.storage.store import ObjectStore, b64_digest, crc32_hex
from tests.s3server import S3Server


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    server = S3Server().start()
    server.create_bucket("kiln-store-tests")
    yield server
    server.stop()


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return ObjectStore(str(tmp_path / "store"))
    s3: S3Server = request.getfixturevalue("s3")
    return ObjectStore(f"s3://kiln-store-tests/{tmp_path.name}", **s3.storage_options())


def test_put_get_list_size_download_delete(store: ObjectStore, tmp_path: Path) -> None:
    src = tmp_path / "f.bin"
    data = os.urandom(300_000)
    src.write_bytes(data)
    store.put_file(src, "orgs/o1/a/f.bin")
    store.put_file(src, "orgs/o1/a/b/g.bin")
    assert store.exists("orgs/o1/a/f.bin") and not store.exists("orgs/o1/a/nope")
    assert store.size("orgs/o1/a/f.bin") == len(data)
    assert b"".join(store.iter_bytes("orgs/o1/a/f.bin", 65536)) == data
    assert store.list("orgs/o1/a") == [("b/g.bin", len(data)), ("f.bin", len(data))]
    assert store.list("orgs/o2") == []
    store.download("orgs/o1/a/b/g.bin", tmp_path / "out" / "g.bin")
    assert (tmp_path / "out" / "g.bin").read_bytes() == data
    with pytest.raises(NotFound):
        store.size("orgs/o1/a/nope")
    with pytest.raises(NotFound):
        store.open("orgs/o1/a/nope")
    store.delete("orgs/o1/a/f.bin")
    store.delete("orgs/o1/a/f.bin")  # a missing object is not an error
    assert not store.exists("orgs/o1/a/f.bin")
    for bad in ("../x", "/etc/passwd", "a/../../b", "a\\b", "a\x00b"):
        with pytest.raises(BadRequest):
            store.exists(bad)


def test_multipart_upload_resumes_and_assembles(store: ObjectStore) -> None:
    part = 5 * 1024 * 1024  # S3's smallest part (but the last)
    data = os.urandom(2 * part + 123)
    chunks = [data[:part], data[part : 2 * part], data[2 * part :]]
    key = "orgs/o1/data/sha256/aa/blob"
    upload = store.multipart_start(key)
    store.multipart_put_part(key, upload, 2, chunks[1])
    store.multipart_put_part(key, upload, 1, chunks[0])
    held = store.multipart_parts(key, upload)
    assert sorted(held) == [1, 2] and held[1][0] == part
    store.multipart_put_part(key, upload, 3, chunks[2])
    parts = store.multipart_parts(key, upload)
    if store.is_s3:  # ETag: the MD5 of the part
        assert parts[3][1] == hashlib.md5(chunks[2]).hexdigest()
    ordered = [(n, parts[n][1]) for n in (1, 2, 3)]
    digest = store.multipart_complete(key, upload, ordered, expected_sha256=hashlib.sha256(data).hexdigest())
    assert digest in (None, hashlib.sha256(data).hexdigest())
    assert b"".join(store.iter_bytes(key)) == data
    assert store.list("orgs/o1/data") == [("sha256/aa/blob", len(data))]


def test_local_multipart_refuses_a_wrong_whole_hash_and_writes_nothing(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path / "store"))
    key = "orgs/o1/data/sha256/bb/blob"
    upload = store.multipart_start(key)
    store.multipart_put_part(key, upload, 1, b"hello")
    with pytest.raises(DigestMismatch):
        store.multipart_complete(key, upload, [(1, "")], expected_sha256="0" * 64)
    assert not store.exists(key)


def test_presigned_urls_read_and_write_straight_to_the_store(s3: S3Server, tmp_path: Path) -> None:
    import base64

    store = ObjectStore(f"s3://kiln-store-tests/{tmp_path.name}", **s3.storage_options())
    key = "orgs/o1/data/sha256/cc/blob"
    data = os.urandom(6 * 1024 * 1024)
    upload = store.multipart_start(key)
    md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
    crc = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    assert crc == b64_digest(crc32_hex(data))
    url = store.multipart_presign_part(key, upload, 1, md5, 60, crc)
    headers = store.part_headers(md5, crc)
    assert headers == {"Content-MD5": md5, "x-amz-checksum-crc32": crc}
    # Both digests are signed into the URL: a store that checks signatures (S3 does; moto does not) refuses a
    # body sent without them, and S3 checks the body against them.
    signed = httpx.URL(url).params["X-Amz-SignedHeaders"].split(";")
    assert {"content-md5", "x-amz-checksum-crc32"} <= set(signed)
    response = httpx.put(url, content=data, headers=headers)
    assert response.status_code == 200, response.text
    (part,) = store.multipart_parts(key, upload).values()
    assert part.checksum in (None, crc)  # what the store computed, where it keeps one (moto does not)
    store.multipart_complete(key, upload, [(1, response.headers["etag"].strip('"'))], checksums={1: crc})
    get = store.presign_get(key, 60, "blob.bin")
    assert get is not None and httpx.get(get).content == data
    assert ObjectStore(str(tmp_path / "local")).presign_get("x", 60) is None


def test_a_store_that_is_down_raises_store_unavailable_naming_it(tmp_path: Path) -> None:
    down = S3Server().start()
    endpoint = down.endpoint
    down.create_bucket("kiln-down")
    down.stop()
    store = ObjectStore("s3://kiln-down/p", **{**down.storage_options(), "client_kwargs": {"endpoint_url": endpoint}})
    src = tmp_path / "f"
    src.write_bytes(b"x")
    for call in (lambda: store.exists("a"), lambda: store.put_file(src, "a"), lambda: store.multipart_start("a")):
        with pytest.raises(StoreUnavailable) as info:
            call()
        assert "s3://kiln-down/p" in info.value.message and endpoint in info.value.message
        assert info.value.status == 503

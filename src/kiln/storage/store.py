"""The artifact store: one interface over any fsspec filesystem (a local directory by default, or any
S3-compatible service through s3fs/boto3: AWS, MinIO, Ceph, moto).

Keys are ``/``-separated relative paths; every key is checked so no caller can leave the store's root. A store
that cannot be reached (or is full) raises ``StoreUnavailable`` (503, naming the store) instead of whatever its
driver threw, so no caller turns an outage into a 500 with a traceback.

Multipart uploads (used by datasets): on S3 they are the store's own multipart uploads (parts may be sent
straight to the store through presigned URLs); on a local directory the parts are files beside the final object,
concatenated (and hashed) at completion, and the object appears atomically.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import hashlib
import logging
import os
import secrets
import shutil
import tempfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from pathlib import Path, PurePosixPath
from typing import IO, Any, NamedTuple, TypeVar

import fsspec

from kiln.domain import limits
from kiln.errors import BadRequest, DigestMismatch, KilnError, NotFound, StoreUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")
PartList = list[tuple[int, str]]  # (part number, ETag)
PartDigests = list[tuple[int, str, str | None]]  # (part number, Content-MD5, CRC32 checksum), both base64
# Multipart uploads to S3 declare CRC32 part checksums (S3's flexible checksums, the AWS SDKs' default): the store
# verifies each part's CRC32 on arrival, and completing an upload combines the parts' checksums instead of hashing
# the whole object again. (The whole blob's SHA-256 is Kiln's own end-to-end check, verified by every download.)
CHECKSUM_ALGORITHM = "CRC32"
CHECKSUM_HEADER = "x-amz-checksum-crc32"
CHECKSUM_FIELD = "ChecksumCRC32"


class StoredPart(NamedTuple):
    """A part the store holds: its size, its ETag (without quotes; "" on a local store) and the checksum the store
    computed for it (base64; None where the store keeps none)."""

    size: int
    etag: str
    checksum: str | None = None


def crc32_hex(data: bytes) -> str:
    """A part's CRC32 as Kiln's API carries it: 8 hex digits (big-endian, as S3's checksum)."""
    return format(zlib.crc32(data), "08x")


def b64_digest(hex_digest: str) -> str:
    """A hex digest as S3's headers carry it (base64 of the bytes)."""
    return base64.b64encode(bytes.fromhex(hex_digest)).decode()


_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


BASE_ERRORS: tuple[type[BaseException], ...] = (OSError, ConnectionError, TimeoutError)


def _driver_errors() -> tuple[type[BaseException], ...]:
    """Exceptions of the S3 drivers that mean "the store failed", when they are installed. Imported only for an
    S3 store (s3fs imports them anyway): aiohttp alone is a third of a second of every server's and CLI's start."""
    found: list[type[BaseException]] = list(BASE_ERRORS)
    try:
        from botocore.exceptions import BotoCoreError, ClientError

        found += [BotoCoreError, ClientError]
    except ImportError:  # pragma: no cover - s3fs[boto3] is a dependency
        pass
    try:
        from aiohttp import ClientError as AioClientError

        found.append(AioClientError)
    except ImportError:  # pragma: no cover
        pass
    return tuple(found)


def safe_key(*parts: str) -> str:
    """Join key parts, refusing anything that could leave the prefix it is placed under."""
    out: list[str] = []
    for part in parts:
        if "\x00" in part or "\\" in part:
            raise BadRequest(f"invalid path: {part!r}")
        for piece in PurePosixPath(part).parts:
            if piece in ("/", "") or piece.startswith("/"):
                raise BadRequest(f"absolute paths are not allowed: {part!r}")
            if piece in (".", ".."):
                raise BadRequest(f"'.' and '..' are not allowed in paths: {part!r}")
            if len(piece.encode("utf-8", "surrogatepass")) > limits.MAX_KEY_SEGMENT_BYTES:
                raise BadRequest(f"a path's parts are at most {limits.MAX_KEY_SEGMENT_BYTES} bytes: {piece[:60]!r}...")
            out.append(piece)
    if not out:
        raise BadRequest("empty path")
    key = "/".join(out)
    if len(key.encode("utf-8", "surrogatepass")) > limits.MAX_KEY_BYTES:
        raise BadRequest(f"a path is at most {limits.MAX_KEY_BYTES} bytes with its prefix: {key[:60]!r}...")
    return key


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".upload-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class ObjectStore:
    """Objects under a root URL: a local directory path or any ``protocol://`` fsspec understands."""

    def __init__(self, url: str, **storage_options: Any) -> None:
        self.url = url.rstrip("/")
        protocol = self.url.split("://", 1)[0] if "://" in self.url else "file"
        self.is_s3 = protocol in ("s3", "s3a")
        self.driver_errors = _driver_errors() if protocol != "file" else BASE_ERRORS
        if self.is_s3:
            # Fail fast when the store is down (the API answers 503), and never serve a stale listing.
            config = dict(storage_options.pop("config_kwargs", None) or {})
            config.setdefault("retries", {"max_attempts": 2, "mode": "standard"})
            config.setdefault("connect_timeout", 5)
            config.setdefault("signature_version", "s3v4")  # presigned URLs that carry their Content-MD5
            storage_options["config_kwargs"] = config
            storage_options.setdefault("use_listings_cache", False)
            storage_options.setdefault("skip_instance_cache", True)
        self.fs, root = fsspec.core.url_to_fs(self.url, **storage_options)
        if self.is_s3:
            self.fs.retries = 2
        self.root = root.rstrip("/")
        self.is_local = self.fs.protocol in ("file", ("file", "local")) or "file" in self.fs.protocol
        endpoint = (storage_options.get("client_kwargs") or {}).get("endpoint_url") or storage_options.get(
            "endpoint_url"
        )
        # Names the store in errors; never holds credentials.
        self.display = f"{self.url} at {endpoint}" if endpoint else self.url
        if self.is_local:
            self._guard(lambda: Path(self.root).mkdir(parents=True, exist_ok=True))

    # -- errors -------------------------------------------------------------------------------------------------

    def _guard(self, call: Callable[[], T], *, missing: str | None = None) -> T:
        """Run one store operation; a missing object becomes NotFound (when ``missing`` names it), a store that
        is down or full becomes StoreUnavailable."""
        try:
            return call()
        except KilnError:
            raise
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            if missing is None:
                raise
            raise NotFound(f"no such object: {missing}") from exc
        except self.driver_errors as exc:
            if isinstance(exc, OSError) and exc.errno in _FULL:
                raise StoreUnavailable(f"the object store {self.display} is full: {exc.strerror}") from exc
            detail = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            log.warning("object store %s failed: %s: %s", self.display, type(exc).__name__, detail)
            raise StoreUnavailable(f"the object store {self.display} is unavailable: {detail}") from exc

    def _path(self, key: str) -> str:
        return f"{self.root}/{safe_key(key)}"

    # -- objects ------------------------------------------------------------------------------------------------

    def exists(self, key: str) -> bool:
        path = self._path(key)
        return bool(self._guard(lambda: self.fs.exists(path)))

    def size(self, key: str) -> int:
        path = self._path(key)
        return int(self._guard(lambda: self.fs.size(path), missing=key))

    def put_file(self, local: Path, key: str) -> None:
        """Upload a local file; on a local store the object appears atomically (rename)."""
        path = self._path(key)
        if self.is_local:

            def copy() -> None:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=Path(path).parent, prefix=".upload-")
                os.close(fd)
                try:
                    shutil.copyfile(local, tmp)
                    os.replace(tmp, path)
                except BaseException:
                    Path(tmp).unlink(missing_ok=True)
                    raise

            self._guard(copy)
        else:
            self._guard(lambda: self.fs.put_file(str(local), path))

    def copy(self, source: str, key: str) -> None:
        """The object ``source`` under ``key`` too, without its bytes passing through Kiln where the store can help:
        on a local store a hard link (every write to the store replaces a file, never changes one, so the two stay
        the same bytes; a copy where links cannot be made), on S3 the store's own copy."""
        src, path = self._path(source), self._path(key)
        if self.is_local:

            def link() -> None:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                tmp = Path(path).parent / f".link-{secrets.token_hex(8)}"
                try:
                    try:
                        os.link(src, tmp)
                    except FileNotFoundError:
                        raise
                    except OSError:  # another file system, or one without links
                        shutil.copyfile(src, tmp)
                    os.replace(tmp, path)
                except BaseException:
                    tmp.unlink(missing_ok=True)
                    raise

            self._guard(link, missing=source)
        else:
            self._guard(lambda: self.fs.copy(src, path), missing=source)

    def put_objects(self, objects: list[tuple[str, bytes]], concurrency: int = 16) -> None:
        """Store many small objects (key, bytes) at once: on S3 up to ``concurrency`` PutObject calls in flight on
        the store client's event loop, each with its Content-MD5 (the store refuses a body that does not match);
        on a local store each object appears atomically (rename)."""
        if self.is_local:
            for key, data in objects:
                self._guard(partial(_write_atomically, Path(self._path(key)), data))
            return
        fs: Any = self.fs
        located = [(*self._bucket_key(key), data) for key, data in objects]

        async def put_all() -> None:
            await fs.set_session()
            limit = asyncio.Semaphore(concurrency)

            async def put(bucket: str, name: str, data: bytes) -> None:
                md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
                async with limit:
                    await fs._call_s3("put_object", Bucket=bucket, Key=name, Body=data, ContentMD5=md5)

            await asyncio.gather(*(put(bucket, name, data) for bucket, name, data in located))

        from fsspec.asyn import sync

        self._guard(lambda: sync(fs.loop, put_all))

    def put_tree(self, local_dir: Path, prefix: str) -> tuple[int, int]:
        """Upload every regular file under ``local_dir`` (links are not followed). Returns (files, bytes)."""
        count = 0
        size = 0
        for dirpath, dirnames, filenames in os.walk(local_dir, followlinks=False):
            dirnames.sort()
            for name in sorted(filenames):
                full = Path(dirpath) / name
                if full.is_symlink() or not full.is_file():
                    continue
                rel = full.relative_to(local_dir).as_posix()
                self.put_file(full, f"{prefix}/{rel}")
                count += 1
                size += full.stat().st_size
        return count, size

    def open(self, key: str) -> IO[bytes]:
        path = self._path(key)
        return self._guard(lambda: self.fs.open(path, "rb"), missing=key)  # type: ignore[no-any-return]

    def iter_bytes(self, key: str, chunk: int = 1024 * 1024) -> Iterator[bytes]:
        with self.open(key) as fh:
            while data := self._guard(lambda: fh.read(chunk)):
                yield data

    def list(self, prefix: str) -> list[tuple[str, int]]:
        """(path relative to prefix, size) of every object under ``prefix``, sorted."""
        base = self._path(prefix)
        if not self._guard(lambda: self.fs.exists(base)):
            return []
        out = []
        found = self._guard(lambda: self.fs.find(base, detail=True))
        for path, info in found.items():
            if info.get("type") == "directory":
                continue
            rel = path[len(base) :].lstrip("/") if path.startswith(base) else path
            if self.is_local:
                rel = os.path.relpath(path, base).replace(os.sep, "/")
            out.append((rel, int(info.get("size") or 0)))
        return sorted(out)

    def local_path(self, key: str) -> Path | None:
        """The object's path on this machine when the store is a local directory, else None."""
        return Path(self._path(key)) if self.is_local else None

    def download(self, key: str, dest: Path) -> None:
        """Fetch one object to ``dest`` (written under a temporary name, then renamed)."""
        path = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".part")
        try:
            self._guard(lambda: self.fs.get_file(path, str(tmp)), missing=key)
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def delete(self, key: str) -> None:
        """Remove one object; a missing one is not an error."""
        path = self._path(key)
        try:
            self._guard(lambda: self.fs.rm_file(path))
        except FileNotFoundError:
            pass

    def presign_get(self, key: str, expires: int, filename: str | None = None) -> str | None:
        """A short-lived URL that reads the object straight from the store (S3), or None (local store)."""
        if not self.is_s3:
            return None
        path = self._path(key)
        extra: dict[str, str] = {}
        if filename:
            extra["ResponseContentDisposition"] = f'attachment; filename="{filename}"'
        return str(self._guard(lambda: self.fs.url(path, expires=expires, client_method="get_object", **extra)))

    # -- multipart uploads --------------------------------------------------------------------------------------

    def _bucket_key(self, key: str) -> tuple[str, str]:
        bucket, _, rest = self._path(key).partition("/")
        return bucket, rest

    def _staging(self, key: str, upload_id: str) -> Path:
        if not all(c.isalnum() for c in upload_id):
            raise BadRequest("invalid upload id")
        return Path(f"{self._path(key)}.multipart-{upload_id}")

    def multipart_start(self, key: str) -> str:
        """Begin a multipart upload of ``key``; returns the store's upload id."""
        if self.is_local:
            upload_id = secrets.token_hex(12)
            self._guard(lambda: self._staging(key, upload_id).mkdir(parents=True, exist_ok=True))
            return upload_id
        bucket, name = self._bucket_key(key)
        answer = self._guard(
            lambda: self.fs.call_s3(
                "create_multipart_upload", Bucket=bucket, Key=name, ChecksumAlgorithm=CHECKSUM_ALGORITHM
            )
        )
        return str(answer["UploadId"])

    def multipart_put_part(self, key: str, upload_id: str, number: int, data: bytes) -> None:
        """Store one part (numbered from 1) through this process."""
        if self.is_local:
            staging = self._staging(key, upload_id)

            def write() -> None:
                if not staging.is_dir():
                    raise NotFound(f"upload {upload_id} of {key} is not open")
                fd, tmp = tempfile.mkstemp(dir=staging, prefix=".part-")
                try:
                    with os.fdopen(fd, "wb") as fh:
                        fh.write(data)
                    os.replace(tmp, staging / f"{number:05d}")
                except BaseException:
                    Path(tmp).unlink(missing_ok=True)
                    raise

            self._guard(write)
            return

        bucket, name = self._bucket_key(key)
        md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
        checksum = b64_digest(crc32_hex(data))
        self._guard(
            lambda: self.fs.call_s3(
                "upload_part",
                Bucket=bucket,
                Key=name,
                UploadId=upload_id,
                PartNumber=number,
                Body=data,
                ContentMD5=md5,
                **{CHECKSUM_FIELD: checksum},
            )
        )

    @staticmethod
    def part_headers(content_md5: str, checksum: str | None) -> dict[str, str]:
        """The headers a presigned part upload must carry (they are part of its signature)."""
        headers = {"Content-MD5": content_md5}
        if checksum:
            headers[CHECKSUM_HEADER] = checksum
        return headers

    def multipart_presign_part(
        self, key: str, upload_id: str, number: int, content_md5: str, expires: int, checksum: str | None = None
    ) -> str:
        """A URL that takes part ``number`` straight to the store; the store refuses a body whose MD5 is not
        ``content_md5`` (base64) or whose CRC32 is not ``checksum`` (base64), which the sender must send as the
        headers ``part_headers`` names."""
        return self.multipart_presign_parts(key, upload_id, [(number, content_md5, checksum)], expires)[number]

    def multipart_presign_parts(self, key: str, upload_id: str, parts: PartDigests, expires: int) -> dict[int, str]:
        """``multipart_presign_part`` for many (part number, Content-MD5, CRC32) at once: one trip to the store
        client's event loop (signing is local: nothing is sent to the store)."""
        if not self.is_s3:
            raise BadRequest("this store takes parts through the API, not presigned URLs")
        bucket, name = self._bucket_key(key)
        fs: Any = self.fs

        async def sign_all() -> dict[int, str]:
            await fs.set_session()
            s3 = await fs.get_s3(bucket)
            out: dict[int, str] = {}
            for number, md5, checksum in parts:
                params: dict[str, Any] = {
                    "Bucket": bucket,
                    "Key": name,
                    "UploadId": upload_id,
                    "PartNumber": number,
                    "ContentMD5": md5,
                }
                if checksum:
                    params[CHECKSUM_FIELD] = checksum
                out[number] = str(
                    await s3.generate_presigned_url(ClientMethod="upload_part", Params=params, ExpiresIn=expires)
                )
            return out

        from fsspec.asyn import sync

        return self._guard(lambda: sync(fs.loop, sign_all))

    def multipart_parts(self, key: str, upload_id: str) -> dict[int, StoredPart]:
        """The parts the store holds, by number."""
        if self.is_local:
            staging = self._staging(key, upload_id)

            def scan() -> dict[int, StoredPart]:
                if not staging.is_dir():
                    return {}
                return {int(p.name): StoredPart(p.stat().st_size, "") for p in staging.iterdir() if p.name.isdigit()}

            return self._guard(scan)
        bucket, name = self._bucket_key(key)
        out: dict[int, StoredPart] = {}
        marker = 0
        while True:
            try:
                answer = self._guard(
                    lambda m=marker: self.fs.call_s3(  # type: ignore[misc]
                        "list_parts", Bucket=bucket, Key=name, UploadId=upload_id, PartNumberMarker=m
                    )
                )
            except FileNotFoundError:  # NoSuchUpload: aborted or completed
                return {}
            for part in answer.get("Parts", []):
                out[int(part["PartNumber"])] = StoredPart(
                    int(part["Size"]), str(part["ETag"]).strip('"'), part.get(CHECKSUM_FIELD) or None
                )
            if not answer.get("IsTruncated"):
                return out
            marker = int(answer["NextPartNumberMarker"])

    def multipart_complete(
        self,
        key: str,
        upload_id: str,
        parts: PartList,
        expected_sha256: str | None = None,
        checksums: Mapping[int, str] | None = None,
    ) -> str | None:
        """Assemble the object from ``parts`` ((number, ETag), in order). On a local store the bytes are hashed
        on the way and the SHA-256 returned; the object appears atomically, and only when it matches
        ``expected_sha256`` (else DigestMismatch, nothing written). On S3 the store assembles it (None), checking
        the parts' CRC32 ``checksums`` (base64, by part number: what ``multipart_parts`` reported)."""
        if self.is_local:
            staging = self._staging(key, upload_id)
            final = Path(self._path(key))

            def assemble() -> str:
                digest = hashlib.sha256()
                fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=".assemble-")
                try:
                    with os.fdopen(fd, "wb") as out:
                        for number, _etag in parts:
                            with open(staging / f"{number:05d}", "rb") as part:
                                while chunk := part.read(4 * 1024 * 1024):
                                    digest.update(chunk)
                                    out.write(chunk)
                    if expected_sha256 is not None and digest.hexdigest() != expected_sha256:
                        raise DigestMismatch(
                            f"the assembled parts hash to {digest.hexdigest()}, not {expected_sha256}; nothing stored"
                        )
                    os.replace(tmp, final)
                except BaseException:
                    Path(tmp).unlink(missing_ok=True)
                    raise
                shutil.rmtree(staging, ignore_errors=True)
                return digest.hexdigest()

            return self._guard(assemble)
        bucket, name = self._bucket_key(key)
        listed: list[dict[str, Any]] = []
        for n, etag in parts:
            entry: dict[str, Any] = {"PartNumber": n, "ETag": f'"{etag}"'}
            if checksums and checksums.get(n):
                entry[CHECKSUM_FIELD] = checksums[n]
            listed.append(entry)
        body = {"Parts": listed}
        self._guard(
            lambda: self.fs.call_s3(
                "complete_multipart_upload", Bucket=bucket, Key=name, UploadId=upload_id, MultipartUpload=body
            )
        )
        return None

    def multipart_abort(self, key: str, upload_id: str) -> None:
        if self.is_local:
            shutil.rmtree(self._staging(key, upload_id), ignore_errors=True)
            return
        bucket, name = self._bucket_key(key)
        try:
            self._guard(lambda: self.fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=name, UploadId=upload_id))
        except FileNotFoundError:
            pass

"""Blobs fetched into the data cache from their source (a local path or a presigned http(s) URL), verified.

Standard library only, like ``stage.py`` next to it, which uses this module (and re-exports what other code
imports from it); loaded as ``kiln.injob.blobfetch`` in the package or as a plain module from this file's
directory when the shim runs as a script. Each blob is streamed into a temp file in the cache, its size and
SHA-256 checked while streaming, then renamed to its content address (see ``datacache.py``); transient HTTP
failures are retried, and a stop shuts the socket of the download in progress down.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import secrets
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

if __package__:
    from kiln.injob import datacache as _datacache
else:  # run by the shim as a script: its directory is on sys.path
    import datacache as _datacache  # type: ignore[no-redef]

StageError = _datacache.StageError
StageStopped = _datacache.StageStopped
blob_path = _datacache.blob_path
remove_file = _datacache.remove_file

CHUNK = 1024 * 1024
STALL_SECONDS = 30.0  # a download that receives nothing for this long fails (and is retried)
HTTP_TRIES = 3  # transient HTTP failures (connection errors, 429, 5xx) are retried this often in all


class Transient(Exception):
    """A download failure worth another try."""


def shown(source: str) -> str:
    """A source as it may appear in a log: a presigned URL without its query (the signature)."""
    if source.startswith(("http://", "https://")):
        parts = urllib.parse.urlsplit(source)
        return f"{parts.scheme}://{parts.netloc}{parts.path}"
    return source


class Canceller:
    """Shuts down the socket of the download in progress once ``stop`` is set, so a stalled read ends now."""

    def __init__(self, stop: threading.Event | None) -> None:
        self.stop = stop
        self.sock: socket.socket | None = None
        self.done = threading.Event()
        self.thread: threading.Thread | None = None
        if stop is not None:
            self.thread = threading.Thread(target=self.watch, name="kiln-stage-cancel", daemon=True)
            self.thread.start()

    def watch(self) -> None:
        assert self.stop is not None
        while not self.done.wait(0.05):
            if self.stop.is_set():
                sock = self.sock
                if sock is not None:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return

    def close(self) -> None:
        self.done.set()
        if self.thread is not None:
            self.thread.join(1.0)


def open_source(source: str, canceller: Canceller) -> Any:
    """A readable file object for a blob's source: a local path, a file:// URL or an http(s) URL."""
    if source.startswith(("http://", "https://")):
        request = urllib.request.Request(source, headers={"User-Agent": "kiln-stage/1"})
        try:
            response = urllib.request.urlopen(request, timeout=STALL_SECONDS)
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code == 429 or exc.code >= 500:
                raise Transient(f"HTTP {exc.code} from {shown(source)}") from None
            hint = " (the presigned URL may have expired)" if exc.code == 403 else ""
            raise StageError(f"HTTP {exc.code} from {shown(source)}{hint}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            raise Transient(f"cannot fetch {shown(source)}: {reason}") from None
        # Best effort: the socket under the response, for Canceller (private attributes, hence getattr).
        canceller.sock = getattr(getattr(getattr(response, "fp", None), "raw", None), "_sock", None)
        return response
    if source.startswith("file://"):
        path = urllib.parse.unquote(urllib.parse.urlsplit(source).path)
    elif source.startswith("/"):
        path = source
    else:
        raise StageError(f"unsupported source {shown(source)!r} (a local path or an http(s) URL)")
    try:
        return open(path, "rb")
    except OSError as exc:
        raise StageError(f"cannot read {path}: {exc.strerror or exc}") from None


def fetch(
    source: str,
    dest: str,
    sha: str,
    size: int,
    stop: threading.Event | None,
    canceller: Canceller,
    progress: Callable[[int], None],
) -> None:
    """Copy one source into ``dest``, checking size and SHA-256 while streaming (StageError on a mismatch)."""
    digest = hashlib.sha256()
    got = 0
    with open(dest, "xb") as out:
        reader = open_source(source, canceller)
        remote = source.startswith(("http://", "https://"))
        try:
            length = reader.headers.get("Content-Length", "") if remote else ""
            if length.isdigit() and int(length) != size:
                raise StageError(f"{shown(source)} has {length} bytes, the manifest says {size}")
            read = getattr(reader, "read1", reader.read)
            while True:
                if stop is not None and stop.is_set():
                    raise StageStopped("stopped during the download")
                try:
                    chunk = read(CHUNK)
                except (OSError, ValueError, http.client.HTTPException) as exc:
                    if stop is not None and stop.is_set():
                        raise StageStopped("stopped during the download") from None
                    if remote and isinstance(exc, OSError | http.client.HTTPException):
                        raise Transient(f"reading {shown(source)} failed: {exc}") from None
                    raise StageError(f"reading {shown(source)} failed: {exc}") from None
                if not chunk:
                    if stop is not None and stop.is_set():  # the canceller shut the socket down
                        raise StageStopped("stopped during the download")
                    break
                got += len(chunk)
                if got > size:
                    raise StageError(f"{shown(source)} has more than the manifest's {size} bytes")
                digest.update(chunk)
                out.write(chunk)
                progress(len(chunk))
        finally:
            canceller.sock = None
            reader.close()
        if got != size:
            if remote:  # the connection ended early (the length was checked above)
                raise Transient(f"{shown(source)} ended after {got} of {size} bytes")
            raise StageError(f"{shown(source)} had {got} bytes, the manifest says {size}")
        if digest.hexdigest() != sha:
            raise StageError(f"the content of {shown(source)} does not match its SHA-256 (got {digest.hexdigest()})")
        out.flush()
        os.fsync(out.fileno())  # a blob is trusted by its name and size: it must not be torn by a crash


def download(
    root: str,
    sha: str,
    size: int,
    source: str,
    stop: threading.Event | None,
    canceller: Canceller,
    progress: Callable[[int], None],
) -> None:
    """Put a verified blob into the cache (the caller holds its lock): temp file, check, rename, 0444."""
    dest = blob_path(root, sha)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = os.path.join(root, "tmp", f"{os.getpid()}.{secrets.token_hex(4)}.{sha}")
    tries = HTTP_TRIES if source.startswith(("http://", "https://")) else 1
    try:
        for attempt in range(1, tries + 1):
            remove_file(tmp)
            try:
                fetch(source, tmp, sha, size, stop, canceller, progress)
                break
            except Transient as exc:
                if attempt == tries:
                    raise StageError(f"{exc} ({tries} tries)") from None
            delay = 0.5 * 2**attempt
            if stop is not None and stop.wait(delay):
                raise StageStopped("stopped during the download")
            if stop is None:
                time.sleep(delay)
        os.chmod(tmp, 0o444)
        os.replace(tmp, dest)
    except OSError as exc:
        raise StageError(f"cannot write to the data cache: {exc}") from None
    finally:
        remove_file(tmp)

"""Dataset versions staged into a job through a content-addressed cache shared by the jobs of one machine.

Standard library only: the shim imports this and runs as ``python -I -S``. The executor resolves each input
(``NAME@VERSION``) to a manifest and passes it in the shim's config; ``stage_inputs`` makes each dataset
available, read-only, before the job's prepare/command run, and returns the environment additions
``{KILN_INPUT_<NAME>: real path of the tree}``. A blob's ``source`` is a local file path (the default object
store is a directory) or a short-lived presigned ``http(s)://`` GET URL (S3); the same code handles both.

Layout under ``cache["dir"]``::

    lock                                  the cache lock: shared while a job registers what it will use,
                                          exclusive while evicting (so eviction sees every registration)
    blobs/<sha[:2]>/<sha256>              one verified blob per content hash, mode 0444; mtime = last used
    locks/<sha256>.lock                   held (flock) while a blob is checked, downloaded or linked; the
                                          holder removes it, a waiter that finds another inode retries
    tmp/<pid>.<rand>.<sha256>             a download in progress (verified while streaming, then renamed)
    trees/<name>@<version>-<digest12>/    one dataset version: hardlinks to the blobs (copies where a link
                                          fails), directories 0555; built in the temp dir below and renamed
                                          into place when complete, so a tree that exists is complete
    trees/.tmp.<pid>.<rand>.<tree>/       a tree being built
    trees/.del.<rand>.<tree>/             a tree being evicted (renamed away first, then removed)
    index/<tree>.json                     the tree's blobs and sizes, written when a job registers it;
                                          its mtime is the tree's last use
    inuse/<holder>                        {"pid", "start", "trees"}: a job using these trees; a record whose
                                          process is gone (or whose pid was reused) is stale and removed

``digest`` is the SHA-256 of the manifest's (path, size, sha256) triples, so a version whose files change
under the same number (it should not) gets a new tree. Eviction (``evict``, run before downloading to make
room and after staging) removes least-recently-used trees and blobs until the cache is under
``cache["max_bytes"]``: never a tree in use (by a live holder) nor a blob some remaining tree (or a tree being
built) refers to. Sizes are apparent sizes (``st_size``); a hardlinked tree costs nothing beyond its blobs.

The job's root is its work dir: an absolute ``path`` such as ``/data/mnist`` is taken relative to it, as is a
relative one, and becomes a symlink ``<work_dir>/data/mnist`` to the tree. Nothing is created outside the work
dir: ``..`` is refused and every parent is opened without following symlinks.

``mode: mount`` (FUSE, via s3fs or rclone) is not implemented: ``can_mount`` says why (missing /dev/fuse,
missing tool, and in any case no mount support in this version) and ``stage_inputs`` refuses such inputs.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import heapq
import http.client
import json
import os
import re
import secrets
import shutil
import socket
import stat
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

CHUNK = 1024 * 1024
STALL_SECONDS = 30.0  # a download that receives nothing for this long fails (and is retried)
HTTP_TRIES = 3  # transient HTTP failures (connection errors, 429, 5xx) are retried this often in all
PROGRESS_SECONDS = 10.0  # a progress line while downloading, at most this often
FUSE_DEVICE = "/dev/fuse"
MOUNT_TOOLS = ("s3fs", "rclone")

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
HOLDER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,199}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
LINK_FALLBACK = {errno.EXDEV, errno.EMLINK, errno.EPERM, errno.EACCES, errno.ENOTSUP, errno.EOPNOTSUPP}


class StageError(Exception):
    """Staging failed; the message names the dataset (and the file) and says why."""


class StageStopped(StageError):
    """``stop`` was set while staging (the job is being cancelled)."""


# -- the config ------------------------------------------------------------------------------------------


def manifest_path_problem(path: object) -> str | None:
    """Why a manifest file path is unacceptable, or None: relative, '/'-separated, no '', '.' or '..' parts,
    no backslash or NUL. Checked again here although the server checked it."""
    if not isinstance(path, str) or not path:
        return "an empty path"
    if "\x00" in path or "\\" in path:
        return "a backslash or NUL in the path"
    if path.startswith("/"):
        return "an absolute path"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return "an empty, '.' or '..' part in the path"
    return None


def place_parts(path: object) -> list[str]:
    """The parts of where the job sees a dataset, relative to its work dir (absolute paths included)."""
    if not isinstance(path, str):
        raise ValueError("not a path")
    if "\x00" in path or "\\" in path:
        raise ValueError("a backslash or NUL in the path")
    raw = path.split("/")
    if ".." in raw:
        raise ValueError("'..' in the path")
    parts = [p for p in raw if p not in ("", ".")]
    if not parts:
        raise ValueError("no path (it would replace the work dir)")
    return parts


class Input:
    """One checked input of the config."""

    def __init__(self, item: object) -> None:
        if not isinstance(item, dict):
            raise StageError(f"input {item!r}: not an object")
        name, version = item.get("name"), item.get("version")
        label = f"{name}@{version}"
        if not isinstance(name, str) or not NAME.match(name) or ".." in name:
            raise StageError(f"input {label}: not a dataset name")
        if isinstance(version, bool) or not isinstance(version, int | str) or not VERSION.match(str(version)):
            raise StageError(f"input {label}: not a dataset version")
        self.name, self.version, self.label = name, str(version), label
        env = item.get("env")
        if not isinstance(env, str) or not ENV_NAME.match(env):
            raise StageError(f"input {label}: not an environment variable name: {env!r}")
        self.env = env
        self.mode = item.get("mode", "stage")
        if self.mode not in ("stage", "mount"):
            raise StageError(f"input {label}: unknown mode {self.mode!r} (stage or mount)")
        self.path = item.get("path")
        try:
            self.parts = place_parts(self.path)
        except ValueError as exc:
            raise StageError(f"input {label}: path {self.path!r} refused: {exc}") from None
        files = item.get("files")
        if not isinstance(files, list):
            raise StageError(f"input {label}: no file list")
        self.files: list[tuple[str, int, str, str]] = []
        seen: set[str] = set()
        dirs: set[str] = set()
        for entry in files:
            if not isinstance(entry, dict):
                raise StageError(f"input {label}: a manifest entry is not an object: {entry!r}")
            path, size, sha, source = entry.get("path"), entry.get("size"), entry.get("sha256"), entry.get("source")
            problem = manifest_path_problem(path)
            if problem:
                raise StageError(f"input {label}: file {path!r} refused: {problem}")
            assert isinstance(path, str)
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise StageError(f"input {label}: file {path}: not a size: {size!r}")
            if not isinstance(sha, str) or not SHA256.match(sha):
                raise StageError(f"input {label}: file {path}: not a SHA-256: {sha!r}")
            if not isinstance(source, str) or not source:
                raise StageError(f"input {label}: file {path}: no source")
            if path in seen:
                raise StageError(f"input {label}: file {path} is listed twice")
            seen.add(path)
            parts = path.split("/")
            dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
            self.files.append((path, size, sha, source))
        clash = sorted(seen & dirs)
        if clash:
            raise StageError(f"input {label}: {clash[0]} is both a file and a directory")
        self.dirs = sorted(dirs)
        triples = sorted((p, s, h) for p, s, h, _ in self.files)
        self.digest = hashlib.sha256(json.dumps(triples, separators=(",", ":")).encode()).hexdigest()
        self.tree = f"{name}@{self.version}-{self.digest[:12]}"
        self.blobs: dict[str, int] = {}
        for path, size, sha, _ in self.files:
            if self.blobs.setdefault(sha, size) != size:
                raise StageError(f"input {label}: file {path}: SHA-256 {sha} listed with two sizes")
        self.bytes = sum(size for _, size, _, _ in self.files)


def cache_root(cache: dict) -> str:
    root = cache.get("dir") if isinstance(cache, dict) else None
    if not isinstance(root, str) or not root:
        raise StageError(f"the data cache has no directory: {cache!r}")
    root = os.path.realpath(root)
    for sub in ("blobs", "locks", "tmp", "trees", "index", "inuse"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    return root


def max_bytes(cache: dict) -> int | None:
    """The cache's size limit; None (absent) is no limit."""
    value = cache.get("max_bytes")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise StageError(f"the data cache's max_bytes is not a size: {value!r}")
    return value


def check_holder(holder: str) -> str:
    if not isinstance(holder, str) or not HOLDER.match(holder):
        raise StageError(f"not a cache holder name: {holder!r}")
    return holder


# -- mount -----------------------------------------------------------------------------------------------


def can_mount() -> str | None:
    """None where ``mode: mount`` inputs can run here, else why not (the server refuses such jobs with it).

    Mounting is not implemented in this version (the executor hands the shim one presigned URL per blob,
    not credentials a FUSE filesystem could use), so this never answers None; it names what is missing first.
    """
    missing = []
    if not os.path.exists(FUSE_DEVICE):
        missing.append(f"{FUSE_DEVICE} does not exist")
    if not any(shutil.which(tool) for tool in MOUNT_TOOLS):
        missing.append(f"neither {' nor '.join(MOUNT_TOOLS)} is on PATH")
    found = "; ".join(missing) + "; " if missing else ""
    return f"mode 'mount' is not available on this machine: {found}this Kiln version only stages (mode: stage)"


# -- processes and locks ---------------------------------------------------------------------------------


def proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of a process, from /proc; None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    if len(fields) < 20:
        return None
    return fields[0].decode(), fields[19].decode()


def proc_start(pid: int) -> str | None:
    """The process's start time, which tells a reused pid apart; None where /proc does not say."""
    info = proc_stat(pid)
    return info[1] if info else None


def alive(pid: object, start: object) -> bool:
    """Whether the process that wrote a record (its pid and start time) still runs."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    info = proc_stat(pid)
    if info is None:
        return not os.path.isdir("/proc")  # no /proc at all: trust kill(); else it exited meanwhile
    if info[0] in ("Z", "X"):
        return False  # exited, not yet reaped
    return not isinstance(start, str) or start == info[1]


def wait_flock(fd: int, op: int, stop: threading.Event | None, what: str) -> None:
    """flock, polling so that ``stop`` ends the wait."""
    delay = 0.005
    while True:
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        if stop is not None and stop.is_set():
            raise StageStopped(f"stopped while waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


@contextmanager
def cache_lock(root: str, op: int, stop: threading.Event | None) -> Iterator[None]:
    fd = os.open(os.path.join(root, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        wait_flock(fd, op, stop, "the data cache lock")
        yield
    finally:
        os.close(fd)  # releases the lock


@contextmanager
def blob_lock(root: str, sha: str, stop: threading.Event | None, what: str) -> Iterator[None]:
    """The per-blob lock; its file is removed by the holder, so locks do not pile up."""
    path = os.path.join(root, "locks", sha + ".lock")
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            wait_flock(fd, fcntl.LOCK_EX, stop, what)
            mine = os.fstat(fd)
            try:
                now = os.stat(path)
            except FileNotFoundError:
                now = None
        except BaseException:
            os.close(fd)
            raise
        if now is not None and (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
            break
        os.close(fd)  # the previous holder removed that file: lock the current one
    try:
        yield
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        os.close(fd)


def write_json_atomic(path: str, data: dict) -> None:
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        with open(tmp, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)
    except BaseException:
        remove_file(tmp)
        raise


def read_json(path: str) -> dict | None:
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def remove_file(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def touch(path: str) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def remove_tree(path: str) -> None:
    """Remove a (read-only) tree: make its directories writable first (ownership suffices), then delete."""
    for top, _dirs, _files in os.walk(path):
        try:
            os.chmod(top, 0o700)
        except OSError:
            pass
    shutil.rmtree(path, ignore_errors=True)


def discard_tree(root: str, tree: str) -> None:
    """Take a tree out of use at once (rename it away), then remove it."""
    gone = os.path.join(root, "trees", f".del.{secrets.token_hex(4)}.{tree}")
    try:
        os.rename(os.path.join(root, "trees", tree), gone)
    except FileNotFoundError:
        return
    remove_tree(gone)


def blob_path(root: str, sha: str) -> str:
    return os.path.join(root, "blobs", sha[:2], sha)


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


# -- fetching ---------------------------------------------------------------------------------------------


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


# -- staging ----------------------------------------------------------------------------------------------


def register(root: str, holder: str, inputs: list[Input], stop: threading.Event | None) -> None:
    """Record (under the shared cache lock) which trees this holder uses, with their blobs: from here on no
    eviction removes them, and one that ran before has finished."""
    with cache_lock(root, fcntl.LOCK_SH, stop):
        for item in inputs:
            index = os.path.join(root, "index", item.tree + ".json")
            if os.path.exists(index):
                touch(index)
            else:
                write_json_atomic(
                    index,
                    {
                        "dataset": item.label,
                        "digest": item.digest,
                        "files": len(item.files),
                        "bytes": item.bytes,
                        "blobs": item.blobs,
                        "copied_bytes": 0,
                    },
                )
        record_path = os.path.join(root, "inuse", holder)
        trees = {item.tree for item in inputs}
        old = read_json(record_path)
        if old and old.get("pid") == os.getpid() and isinstance(old.get("trees"), list):
            trees.update(t for t in old["trees"] if isinstance(t, str))
        write_json_atomic(
            record_path,
            {"holder": holder, "pid": os.getpid(), "start": proc_start(os.getpid()), "trees": sorted(trees)},
        )


def tree_problem(path: str, item: Input) -> str | None:
    """Why an existing tree does not hold this manifest (it should always hold it), or None."""
    for rel, size, _, _ in item.files:
        try:
            st = os.stat(os.path.join(path, rel), follow_symlinks=False)
        except OSError:
            return f"{rel} is missing"
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            return f"{rel} is not a {size}-byte file"
    return None


def link_or_copy(blob: str, dest: str) -> bool:
    """Hardlink ``dest`` to the blob; copy it where a link is impossible. True when copied."""
    try:
        os.link(blob, dest)
        return False
    except OSError as exc:
        if exc.errno not in LINK_FALLBACK:
            raise
    shutil.copyfile(blob, dest)
    os.chmod(dest, 0o444)
    return True


def make_read_only(top: str) -> None:
    """Directories 0555, deepest first (files are 0444 already: links to blobs, or copies)."""
    for path, _dirs, _files in sorted(os.walk(top), key=lambda entry: -entry[0].count(os.sep)):
        os.chmod(path, 0o555)


class Progress:
    def __init__(self, label: str, total: int, log: Callable[[str], None]) -> None:
        self.label, self.total, self.log = label, total, log
        self.done = 0
        self.started = self.last = time.monotonic()

    def __call__(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= PROGRESS_SECONDS:
            self.last = now
            rate = self.done / max(now - self.started, 1e-6)
            self.log(f"input {self.label}: downloaded {human(self.done)} of {human(self.total)} ({human(rate)}/s)")


def build_tree(
    root: str, item: Input, log: Callable[[str], None], stop: threading.Event | None, canceller: Canceller
) -> tuple[str, str]:
    """The tree of one input, built (downloading what is missing) unless it is cached; (path, log line)."""
    final = os.path.join(root, "trees", item.tree)
    started = time.monotonic()
    if os.path.isdir(final):
        problem = tree_problem(final, item)
        if problem is None:
            return final, (
                f"input {item.label}: {len(item.files)} files, {human(item.bytes)}: all from the cache "
                f"(its tree was ready, {time.monotonic() - started:.1f} s)"
            )
        log(f"input {item.label}: the cached tree is damaged ({problem}); rebuilding it")
        discard_tree(root, item.tree)
    missing = sum(size for sha, size in item.blobs.items() if not os.path.isfile(blob_path(root, sha)))
    progress = Progress(item.label, missing, log)
    tmp = os.path.join(root, "trees", f".tmp.{os.getpid()}.{secrets.token_hex(4)}.{item.tree}")
    by_sha: dict[str, list[tuple[str, int, str]]] = {}
    for rel, size, sha, source in item.files:
        by_sha.setdefault(sha, []).append((rel, size, source))
    hits = fetched = fetched_bytes = copied_bytes = 0
    try:
        os.mkdir(tmp)
        for rel_dir in item.dirs:
            os.mkdir(os.path.join(tmp, rel_dir))
        for sha, entries in by_sha.items():
            if stop is not None and stop.is_set():
                raise StageStopped(f"input {item.label}: stopped")
            first, size, source = entries[0]
            blob = blob_path(root, sha)
            with blob_lock(root, sha, stop, f"{first} (another job is downloading it)"):
                try:
                    st = os.stat(blob)
                    hit = stat.S_ISREG(st.st_mode) and st.st_size == size
                    if not hit:
                        remove_file(blob)  # cannot happen (blobs are verified before they get their name)
                except FileNotFoundError:
                    hit = False
                if hit:
                    hits += len(entries)
                    touch(blob)
                else:
                    try:
                        download(root, sha, size, source, stop, canceller, progress)
                    except StageStopped:
                        raise StageStopped(f"input {item.label}: stopped while downloading {first}") from None
                    except StageError as exc:
                        raise StageError(f"input {item.label}: file {first}: {exc}") from None
                    fetched += len(entries)
                    fetched_bytes += size
                for rel, _, _ in entries:
                    if link_or_copy(blob, os.path.join(tmp, rel)):
                        copied_bytes += size
        make_read_only(tmp)
        try:
            os.rename(tmp, final)
            won = True
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY) or not os.path.isdir(final):
                raise
            won = False  # another job finished the same tree first: use theirs
        if not won:
            remove_tree(tmp)
        elif copied_bytes:
            index = os.path.join(root, "index", item.tree + ".json")
            data = read_json(index) or {}
            data["copied_bytes"] = copied_bytes
            write_json_atomic(index, data)
    except BaseException as exc:
        remove_tree(tmp)
        if isinstance(exc, OSError):
            raise StageError(f"input {item.label}: cannot build its tree in the data cache: {exc}") from None
        raise
    copies = f", {human(copied_bytes)} copied (no hardlinks)" if copied_bytes else ""
    return final, (
        f"input {item.label}: {len(item.files)} files, {human(item.bytes)}: {fetched} downloaded "
        f"({human(fetched_bytes)}), {hits} from the cache{copies} ({time.monotonic() - started:.1f} s)"
    )


def place(work_dir: str, item: Input, tree: str) -> None:
    """The symlink ``<work_dir>/<path>`` → tree, creating parents inside the work dir only (none followed)."""
    fd = os.open(work_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(item.parts[:-1]):
            try:
                os.mkdir(part, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError:
                where = "/".join(item.parts[: i + 1])
                raise StageError(
                    f"input {item.label}: cannot place it at {item.path}: {where} in the work dir is not a "
                    "directory (a file or a symlink)"
                ) from None
            os.close(fd)
            fd = sub
        leaf = item.parts[-1]
        try:
            st = os.stat(leaf, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISLNK(st.st_mode):
            raise StageError(
                f"input {item.label}: cannot place it at {item.path}: it already exists in the work dir "
                "(from the job's code?) and is not a symlink"
            )
        tmp = f".{leaf}.{secrets.token_hex(4)}.kiln"
        os.symlink(tree, tmp, dir_fd=fd)
        try:
            os.replace(tmp, leaf, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=fd)
            except OSError:
                pass
            raise
    except OSError as exc:
        raise StageError(f"input {item.label}: cannot place it at {item.path}: {exc}") from None
    finally:
        os.close(fd)


def stage_inputs(
    inputs: list[dict],
    cache: dict,
    work_dir: str,
    *,
    log: Callable[[str], None],
    stop: threading.Event | None = None,
    holder: str | None = None,
) -> dict[str, str]:
    """Make each input available read-only at its path in the work dir; returns ``{env name: tree path}``.

    ``holder`` names this job in the cache's in-use records (``<job-id>-<attempt>-<member>``; default
    ``pid<pid>``): pass the same to ``release`` when the job ends. Raises StageError (StageStopped when
    ``stop`` is set) with a message naming the dataset and file.
    """
    items = [Input(item) for item in inputs]
    envs: dict[str, str] = {}
    places: dict[str, str] = {}
    for item in items:
        if item.env in envs:
            raise StageError(f"inputs {envs[item.env]} and {item.label} would share {item.env}")
        envs[item.env] = item.label
        where = "/".join(item.parts)
        for other, label in places.items():
            if where == other or where.startswith(other + "/") or other.startswith(where + "/"):
                raise StageError(f"inputs {label} and {item.label} overlap at {item.path}")
        places[where] = item.label
    for item in items:
        if item.mode == "mount":
            raise StageError(f"input {item.label}: {can_mount()}")
    if not items:
        return {}
    holder = check_holder(holder or f"pid{os.getpid()}")
    try:
        root = cache_root(cache)
        limit = max_bytes(cache)
        work = os.path.abspath(work_dir)
        os.makedirs(work, exist_ok=True)
        register(root, holder, items, stop)
        if limit is not None:
            need = sum(
                size
                for sha, size in {sha: s for item in items for sha, s in item.blobs.items()}.items()
                if not os.path.isfile(blob_path(root, sha))
            )
            safe_evict(cache, need, log, stop)
    except OSError as exc:
        raise StageError(f"the data cache at {cache.get('dir')}: {exc}") from None
    env: dict[str, str] = {}
    canceller = Canceller(stop)
    try:
        for item in items:
            tree, line = build_tree(root, item, log, stop, canceller)
            place(work, item, tree)
            touch(os.path.join(root, "index", item.tree + ".json"))
            log(f"{line}; at {item.path} (${item.env})")
            env[item.env] = tree
    finally:
        canceller.close()
    if limit is not None:
        safe_evict(cache, 0, log, stop)
    return env


def release(cache: dict, holder: str) -> None:
    """The job has ended: its trees are no longer in use (their last use is now). Idempotent."""
    root = cache_root(cache)
    path = os.path.join(root, "inuse", check_holder(holder))
    record = read_json(path)
    if record and isinstance(record.get("trees"), list):
        for tree in record["trees"]:
            if isinstance(tree, str) and "/" not in tree:
                touch(os.path.join(root, "index", tree + ".json"))
    remove_file(path)


# -- eviction ---------------------------------------------------------------------------------------------


def safe_evict(cache: dict, need: int, log: Callable[[str], None], stop: threading.Event | None) -> None:
    """Eviction that never fails staging (only a stop ends it)."""
    try:
        evict(cache, need=need, log=log, stop=stop)
    except StageStopped:
        raise
    except (OSError, StageError) as exc:
        log(f"data cache eviction failed: {exc}")


def in_use(root: str) -> set[str]:
    """The trees live holders use; stale records (their process is gone) are removed."""
    trees: set[str] = set()
    folder = os.path.join(root, "inuse")
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if name.endswith(".tmp"):
            continue
        record = read_json(path)
        if record is None or not alive(record.get("pid"), record.get("start")):
            remove_file(path)
            continue
        trees.update(t for t in record.get("trees") or [] if isinstance(t, str))
    return trees


def sweep(root: str) -> None:
    """Leftovers of processes that died mid-way: downloads, half-built trees, trees being removed."""
    for name in os.listdir(os.path.join(root, "tmp")):
        pid = name.split(".", 1)[0]
        if not pid.isdigit() or not alive(int(pid), None):
            remove_file(os.path.join(root, "tmp", name))
    for name in os.listdir(os.path.join(root, "trees")):
        if name.startswith(".del."):
            remove_tree(os.path.join(root, "trees", name))
        elif name.startswith(".tmp."):
            pid = name.split(".")[2]
            if not pid.isdigit() or not alive(int(pid), None):
                remove_tree(os.path.join(root, "trees", name))
    for folder in ("inuse", "index"):
        for name in os.listdir(os.path.join(root, folder)):
            if name.endswith(".tmp"):  # write_json_atomic's <name>.<pid>.<rand>.tmp
                pid = name.rsplit(".", 3)[1] if name.count(".") >= 3 else ""
                if not pid.isdigit() or not alive(int(pid), None):
                    remove_file(os.path.join(root, folder, name))


def evict(
    cache: dict, *, need: int = 0, log: Callable[[str], None] | None = None, stop: threading.Event | None = None
) -> int:
    """Remove least-recently-used trees and blobs until the cache plus ``need`` bytes fits ``max_bytes``.

    Never a tree in use by a live holder, nor a blob that a remaining (or registered) tree refers to. A tree
    costs only its copied files; its blobs that no other tree holds go right after it (their last use is the
    tree's). A blob no tree holds (left by an evicted or failed tree) is ranked by its mtime, set when it was
    downloaded or found in the cache. Returns bytes freed.
    """
    limit = max_bytes(cache)
    if limit is None:
        return 0
    root = cache_root(cache)
    with cache_lock(root, fcntl.LOCK_EX, stop):
        protected = in_use(root)
        sweep(root)
        trees = {n for n in os.listdir(os.path.join(root, "trees")) if not n.startswith(".")}
        indexes: dict[str, dict] = {}
        used: dict[str, float] = {}
        for name in os.listdir(os.path.join(root, "index")):
            if not name.endswith(".json"):
                continue
            tree, path = name[: -len(".json")], os.path.join(root, "index", name)
            if tree not in trees and tree not in protected:
                remove_file(path)
                continue
            data = read_json(path)
            try:
                used[tree] = os.stat(path).st_mtime
            except OSError:
                continue
            if data is not None and isinstance(data.get("blobs"), dict):
                indexes[tree] = data
        refs: dict[str, int] = {}
        for data in indexes.values():
            for sha in data["blobs"]:
                refs[sha] = refs.get(sha, 0) + 1
        blobs: dict[str, tuple[int, float]] = {}
        for prefix in os.listdir(os.path.join(root, "blobs")):
            folder = os.path.join(root, "blobs", prefix)
            for sha in os.listdir(folder):
                try:
                    st = os.stat(os.path.join(folder, sha))
                except OSError:
                    continue
                blobs[sha] = (st.st_size, st.st_mtime)

        def copied(tree: str) -> int:
            value = indexes.get(tree, {}).get("copied_bytes", 0)
            return value if isinstance(value, int) and not isinstance(value, bool) else 0

        total = sum(size for size, _ in blobs.values()) + sum(copied(t) for t in trees)
        target = limit - need
        if total <= target:
            return 0
        heap: list[tuple[float, str, str]] = [(used.get(t, 0.0), "tree", t) for t in trees if t not in protected]
        heap += [(mtime, "blob", sha) for sha, (_, mtime) in blobs.items() if not refs.get(sha)]
        heapq.heapify(heap)
        freed = gone_trees = gone_blobs = 0
        while total > target and heap:
            when, kind, key = heapq.heappop(heap)
            if kind == "tree":
                discard_tree(root, key)
                remove_file(os.path.join(root, "index", key + ".json"))
                total -= copied(key)
                freed += copied(key)
                gone_trees += 1
                for sha in indexes.get(key, {}).get("blobs", {}):
                    refs[sha] -= 1
                    if not refs[sha] and sha in blobs:
                        heapq.heappush(heap, (when, "blob", sha))  # the tree's last use: next out
            else:
                remove_file(blob_path(root, key))
                total -= blobs[key][0]
                freed += blobs[key][0]
                gone_blobs += 1
        if log is not None:
            if gone_trees or gone_blobs:
                log(
                    f"data cache: evicted {gone_trees} trees and {gone_blobs} blobs ({human(freed)}) least "
                    f"recently used; {human(total)} cached, limit {human(limit)}"
                )
            if total > target:
                log(
                    f"data cache: {human(total)} cached{f' + {human(need)} to download' if need else ''} is "
                    f"over its limit of {human(limit)}, but the rest is in use"
                )
        return freed

"""The content-addressed data cache the shim stages datasets through: its layout, locks and LRU eviction.

Standard library only, like ``stage.py`` next to it, which uses this module (and re-exports what other code
imports from it); loaded as ``kiln.injob.datacache`` in the package or as a plain module from this file's
directory when the shim runs as a script. The fetching of blobs is in ``blobfetch.py``.

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
"""

from __future__ import annotations

import fcntl
import heapq
import json
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

if __package__:
    from kiln.injob.units import human
else:  # loaded by the shim as a plain module: its directory is on sys.path
    from units import human  # type: ignore[no-redef]

HOLDER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,199}$")


class StageError(Exception):
    """Staging failed; the message names the dataset (and the file) and says why."""


class StageStopped(StageError):
    """``stop`` was set while staging (the job is being cancelled)."""


# -- the cache's directory and settings ------------------------------------------------------------------


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

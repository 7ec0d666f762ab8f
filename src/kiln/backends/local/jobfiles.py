"""What the local executor does with a job's files once the job wrote them: checkpoints and outputs copied into
the store, and the job's directory freed when it ends.

Everything here reads directories the job owns, as the server: each file is found and opened without following a
link at any level (``os.fwalk``, ``O_NOFOLLOW``), since the job — still running, for a checkpoint sync — could
swap any part of a path for a link to files the server must not copy into its store.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kiln.backends.capabilities import NotebookAddress, OutputsNotKept
from kiln.backends.local.attemptdir import read_json, write_json_atomic
from kiln.domain.quantities import format_bytes
from kiln.storage.store import ObjectStore, safe_key

log = logging.getLogger(__name__)

# Freed when the job ends; metrics/ stays until the ingester has read it (small, and part of the disk limit),
# attempts/ holds the small records of how each attempt ended.
RELEASED = ("work", "outputs", "checkpoints", "site", "home", "tensorboard", "code.tar.gz")
RELEASE_MARKER = "release.json"
NOTEBOOK_STATE = ".kiln-notebook.json"  # written by the notebook launcher (kiln.injob.statefile)


def files_beneath(root: Path) -> Iterator[tuple[str, int]]:
    """(path relative to ``root``, an open read-only fd) of every regular file under ``root``, sorted; the caller
    closes each fd."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    for dirpath, dirnames, filenames, dirfd in os.fwalk(root, follow_symlinks=False):
        dirnames.sort()
        base = Path(dirpath).relative_to(root)
        for name in sorted(filenames):
            try:
                fd = os.open(name, flags, dir_fd=dirfd)
            except OSError:
                continue  # a link, or gone
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                continue
            yield (base / name).as_posix(), fd


def tree_bytes(root: Path) -> int:
    """The apparent size of every regular file under ``root``: what copying them into the store writes (the holes
    of a sparse file are copied as zeros, and S3 keeps no holes)."""
    total = 0
    for _, fd in files_beneath(root):
        try:
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return total


def copy_tree(
    store: ObjectStore,
    root: Path,
    dest_prefix: str,
    admit: Callable[[int], None] | None = None,
    most: int | None = None,
) -> tuple[int, int]:
    """Every regular file under ``root`` into the store under ``dest_prefix``, all or none; (files, bytes).

    The files are sized first: over ``most`` bytes (the job's disk limit), or refused by ``admit`` (called with
    their size: the organisation's storage quota), nothing is written (``OutputsNotKept``). A copy that fails or
    finds the files grown past what was admitted removes what it wrote, so no part of a refused tree stays."""
    if not root.is_dir():
        return 0, 0
    total = tree_bytes(root)
    if most is not None and total > most:
        raise OutputsNotKept(f"they hold {format_bytes(total)}, more than the job's disk limit of {format_bytes(most)}")
    if admit is not None and total:
        admit(total)
    written: list[str] = []
    size = 0
    try:
        for rel, fd in files_beneath(root):
            with os.fdopen(fd, "rb") as fh:
                size += os.fstat(fh.fileno()).st_size
                if size > total:
                    raise OutputsNotKept(f"they grew past the {format_bytes(total)} counted before copying")
                key = f"{dest_prefix}/{rel}"
                store.put_file(Path(f"/proc/self/fd/{fh.fileno()}"), key)
                written.append(key)
    except BaseException:
        for key in written:
            with contextlib.suppress(Exception):
                store.delete(key)
        raise
    return len(written), size


def _signature(fd: int) -> list[int]:
    st = os.fstat(fd)
    return [st.st_size, st.st_mtime_ns]


def sync_checkpoints(
    store: ObjectStore, job_dir: Path, dest_prefix: str, admit: Callable[[int], None] | None = None
) -> tuple[int, int]:
    """Incremental: a file is copied again only when its size or mtime changed (write checkpoints to a temporary
    name and rename them, so a copy never catches one half-written). The changed files are sized first, and
    ``admit`` gets what the store will hold under ``dest_prefix`` once they are copied (what it holds now, listed,
    each changed file's older copy replaced by its apparent size): it may refuse them all before any byte is
    written. Then only files still as they were sized are copied (one changed since waits for the next sync).
    Returns (files copied, bytes the store holds under ``dest_prefix``; 0 when nothing changed)."""
    source = job_dir / "checkpoints"
    if not source.is_dir():
        return 0, 0
    state_path = job_dir / "checkpoints.synced.json"
    synced: dict[str, Any] = read_json(state_path) or {}
    changed: dict[str, list[int]] = {}
    for rel, fd in files_beneath(source):
        try:
            signature = _signature(fd)
        finally:
            os.close(fd)
        if synced.get(rel) != signature:
            changed[rel] = signature
    if not changed:
        return 0, 0
    # The store's own listing, not this server's record of what it copied: an attempt another server ran may
    # have left checkpoints there that this one never saw.
    listed = dict(store.list(dest_prefix))
    held = dict(listed)
    for rel, signature in changed.items():
        held[safe_key(rel)] = signature[0]
    if admit is not None:
        admit(sum(held.values()))
    copied: set[str] = set()
    try:
        for rel, fd in files_beneath(source):
            with os.fdopen(fd, "rb") as fh:
                sized = changed.get(rel)
                if sized is None or _signature(fh.fileno()) != sized:
                    continue
                key = safe_key(rel)
                store.put_file(Path(f"/proc/self/fd/{fh.fileno()}"), f"{dest_prefix}/{key}")
                after = _signature(fh.fileno())
            if after == sized:
                synced[rel] = sized
            else:  # rewritten in place while it was copied: copied again next time, counted as it is now
                held[key] = after[0]
            copied.add(rel)
    finally:
        write_json_atomic(state_path, synced)
    for rel in changed.keys() - copied:  # gone, or changed again since it was sized: its older copy, if any, stays
        key = safe_key(rel)
        held.pop(key, None)
        if key in listed:
            held[key] = listed[key]
    return len(copied), sum(held.values())


EVENT_FILE = "events.out.tfevents."
EVENTS_SYNCED = "events.synced.json"


def _open_dir_beneath(root: Path, rel: str) -> int | None:
    """``root/rel`` opened as a directory without following a link at any level of ``rel`` (the job may have
    swapped any of them for a link to another job's files); None when it is not there."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in Path(rel).parts:
            if part in ("", ".", "..", "/"):
                raise OSError(f"{rel!r}: not a plain relative path")
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = inner
    except OSError:
        os.close(fd)
        return None
    return fd


def events_dir(members: list[tuple[str, int, Path]], job_dir: Path) -> str:
    """An attempt's TensorBoard dir relative to its job directory: ``tensorboard``, or the spec's
    ``metrics.tensorboard_dir`` under ``work``, as its shim was told (the server wrote the members' shim.json)."""
    for _, _, member_dir in members[:1]:
        named = ((read_json(member_dir / "shim.json") or {}).get("metrics") or {}).get("tensorboard_dir")
        if isinstance(named, str):
            with contextlib.suppress(ValueError):
                return Path(named).relative_to(job_dir).as_posix()
    return "tensorboard"


def sync_events(
    store: ObjectStore,
    job_dir: Path,
    rel: str,
    dest_prefix: str,
    max_bytes: int,
    admit: Callable[[int], None] | None = None,
) -> tuple[int, int]:
    """The TensorBoard event files (``events.out.tfevents.*``, at any depth) under ``job_dir/rel`` that changed
    since the last call, copied into the store under ``dest_prefix`` at their relative paths; at most
    ``max_bytes`` kept for the job in all (a file that would pass it is left out, and said once). Before a file is
    written, ``admit`` gets the bytes then kept in all (the organisation's storage quota) and may refuse it
    (``OutputsNotKept``: left out this time, tried again next time). Event files only grow, so a copy is at worst
    a little behind. Returns (files copied, bytes kept in all)."""
    state_path = job_dir / EVENTS_SYNCED
    synced: dict[str, Any] = read_json(state_path) or {}
    top = _open_dir_beneath(job_dir, rel)
    if top is None:
        return 0, sum(int(v[0]) for v in synced.values() if isinstance(v, list))
    files, changed = 0, False
    try:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        for dirpath, dirnames, filenames, dirfd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.startswith(EVENT_FILE) or name.endswith(".tmp"):
                    continue
                rel_name = os.path.normpath(os.path.join(dirpath, name))
                try:
                    fd = os.open(name, flags, dir_fd=dirfd)
                except OSError:
                    continue  # a link, or gone
                with os.fdopen(fd, "rb") as fh:
                    st = os.fstat(fh.fileno())
                    signature = [st.st_size, st.st_mtime_ns]
                    if not stat.S_ISREG(st.st_mode) or synced.get(rel_name) == signature:
                        continue
                    kept = sum(int(v[0]) for k, v in synced.items() if k != rel_name and isinstance(v, list))
                    if kept + st.st_size > max_bytes:
                        if synced.get(rel_name) != "over":
                            log.warning(
                                "%s: TensorBoard file %s not kept: the job's event files would pass %d bytes",
                                job_dir.name,
                                rel_name,
                                max_bytes,
                            )
                            synced[rel_name] = "over"
                            changed = True
                        continue
                    if admit is not None:
                        try:
                            admit(kept + st.st_size)
                        except OutputsNotKept:
                            continue  # the gate said so on the job, once
                    store.put_file(Path(f"/proc/self/fd/{fh.fileno()}"), f"{dest_prefix}/{safe_key(rel_name)}")
                synced[rel_name] = signature
                files += 1
    finally:
        os.close(top)
    if files or changed:
        write_json_atomic(state_path, synced)
    return files, sum(int(v[0]) for v in synced.values() if isinstance(v, list))


def release(job_dir: Path, keep_seconds: float) -> None:
    """The job ended: free its files now, or (``keep_seconds``: it failed) mark them to go after that long."""
    if not job_dir.is_dir():
        return
    if keep_seconds > 0:
        write_json_atomic(job_dir / RELEASE_MARKER, {"keep_until": time.time() + keep_seconds})
        log.info("job %s failed: its work dir is kept for %gs (%s)", job_dir.name, keep_seconds, job_dir)
        return
    free(job_dir)


def sweep(jobs_dir: Path) -> None:
    """Free the kept files whose time is up."""
    now = time.time()
    for marker in jobs_dir.glob(f"*/{RELEASE_MARKER}"):
        info = read_json(marker) or {}
        if float(info.get("keep_until") or 0) <= now:
            free(marker.parent)


def free(job_dir: Path) -> None:
    for name in RELEASED:
        remove_tree(job_dir / name)
    (job_dir / RELEASE_MARKER).unlink(missing_ok=True)


def remove_tree(path: Path) -> None:
    """``path`` gone, whatever it is: a directory with what is in it (a link in it is removed, never followed),
    or a file or a link. Nothing there is no error."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def notebook_address(work: Path) -> NotebookAddress | None:
    """Where the notebook server of a job answers, from the launcher's state file in its work dir (``socket``:
    the Unix socket's name in that dir, ``token``); None before the file is there. The job wrote it: the socket
    must be a plain name in the work dir, and the file is read without following a link."""
    try:
        fd = os.open(work / NOTEBOOK_STATE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd) as fh:
            data = json.loads(fh.read(65536))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    name, token = data.get("socket"), data.get("token")
    if not isinstance(name, str) or not name or "/" in name or "\x00" in name or name in (".", ".."):
        return None
    if not isinstance(token, str) or not token or len(token) > 256 or not token.isascii() or not token.isprintable():
        return None
    return NotebookAddress("http://notebook", token, os.path.abspath(work / name))

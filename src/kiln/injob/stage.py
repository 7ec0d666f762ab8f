"""Dataset versions staged into a job through a content-addressed cache shared by the jobs of one machine.

Standard library only: the shim imports this and runs as ``python -I -S``. The executor resolves each input
(``NAME@VERSION``) to a manifest and passes it in the shim's config; ``stage_inputs`` makes each dataset
available, read-only, before the job's prepare/command run, and returns the environment additions
``{KILN_INPUT_<NAME>: real path of the tree}``. A blob's ``source`` is a local file path (the default object
store is a directory) or a short-lived presigned ``http(s)://`` GET URL (S3); the same code handles both.

The cache itself (its layout under ``cache["dir"]``, locks, in-use records and LRU eviction) is in
``datacache.py``, the fetching and verifying of blobs in ``blobfetch.py``. Like this module, they are loaded as
``kiln.injob.<name>`` in the package or as plain modules from this file's directory when the shim runs as a
script; what other code imports from them is re-exported here.

The job's root is its work dir: an absolute ``path`` such as ``/data/mnist`` is taken relative to it, as is a
relative one, and becomes a symlink ``<work_dir>/data/mnist`` to the tree. Nothing is created outside the work
dir: ``..`` is refused and every parent is opened without following symlinks.

``mode: mount`` inputs are not copied: ``mount.py`` mounts the organisation's blobs read-only through FUSE
(rclone or s3fs) and gives each such input a tree of links into the mount, placed the same way; ``release``
unmounts it.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import threading
import time
from collections.abc import Callable

if __package__:
    from kiln.injob import blobfetch as _blobfetch
    from kiln.injob import datacache as _datacache
    from kiln.injob import mount as _mount
else:  # run by the shim as a script: its directory is on sys.path
    import blobfetch as _blobfetch  # type: ignore[no-redef]
    import datacache as _datacache  # type: ignore[no-redef]
    import mount as _mount  # type: ignore[no-redef]

# The pieces next to this module, used here and imported from here by other modules and the tests.
StageError = _datacache.StageError
StageStopped = _datacache.StageStopped
alive = _datacache.alive
blob_lock = _datacache.blob_lock
blob_path = _datacache.blob_path
cache_lock = _datacache.cache_lock
cache_root = _datacache.cache_root
check_holder = _datacache.check_holder
discard_tree = _datacache.discard_tree
evict = _datacache.evict
human = _datacache.human
max_bytes = _datacache.max_bytes
proc_start = _datacache.proc_start
read_json = _datacache.read_json
remove_file = _datacache.remove_file
remove_tree = _datacache.remove_tree
safe_evict = _datacache.safe_evict
touch = _datacache.touch
write_json_atomic = _datacache.write_json_atomic
Canceller = _blobfetch.Canceller
download = _blobfetch.download
Mount = _mount.Mount

PROGRESS_SECONDS = 10.0  # a progress line while downloading, at most this often
_MOUNTS: dict[str, Mount] = {}  # holder → the FUSE mount of its mounted inputs, until ``release``

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
LINK_FALLBACK = {errno.EXDEV, errno.EMLINK, errno.EPERM, errno.EACCES, errno.ENOTSUP, errno.EOPNOTSUPP}


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
            if self.mode == "stage" and (not isinstance(source, str) or not source):
                raise StageError(f"input {label}: file {path}: no source")  # a mounted file is found by its hash
            if path in seen:
                raise StageError(f"input {label}: file {path} is listed twice")
            seen.add(path)
            parts = path.split("/")
            dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
            self.files.append((path, size, sha, source if isinstance(source, str) else ""))
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


# -- mount -----------------------------------------------------------------------------------------------


def mount_inputs(
    mount: Mount,
    items: list[Input],
    work: str,
    log: Callable[[str], None],
    stop: threading.Event | None,
    holder: str,
    helpers: set[int] | None,
) -> dict[str, str]:
    """Mount the organisation's blobs (or join the attempt's mount), then give each input its tree of links into
    the mount, placed at its path: ``{env name: tree}``. One file of each input is looked up through the mount
    (the store answers and holds it); the rest are read when the job opens them."""
    started = time.monotonic()
    mount.acquire(holder, stop, helpers)
    env: dict[str, str] = {}
    for item in items:
        tree = mount.tree(item.label, item.tree, [(rel, sha) for rel, _, sha, _ in item.files], item.dirs)
        if item.files:
            rel, size, sha, _ = item.files[0]
            mount.check(item.label, rel, sha, size)
        place(work, item, tree)
        log(
            f"input {item.label}: {len(item.files)} files, {human(item.bytes)}: mounted read-only with "
            f"{mount.tool}, nothing downloaded ({time.monotonic() - started:.1f} s); "
            f"at {item.path} (${item.env})"
        )
        env[item.env] = tree
    return env


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


def exposed_marker(root: str, tree: str) -> str:
    """Exists while a tree has been shown to a job that ran unsandboxed (``KILN_SANDBOX=none``): as root, such a
    job could write through the tree's read-only modes into the cache's blobs (hard links), size unchanged."""
    return os.path.join(root, "index", tree + ".exposed")


def digest_problem(path: str, item: Input) -> str | None:
    """Why the tree's files do not hash to the manifest's SHA-256 (each distinct blob read once), or None."""
    seen: set[str] = set()
    for rel, _, sha, _ in item.files:
        if sha in seen:
            continue
        seen.add(sha)
        digest = hashlib.sha256()
        try:
            with open(os.path.join(path, rel), "rb") as fh:
                while block := fh.read(1 << 20):
                    digest.update(block)
        except OSError as exc:
            return f"{rel}: {exc.strerror}"
        if digest.hexdigest() != sha:
            return f"{rel} no longer has SHA-256 {sha[:12]}…"
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
    root: str,
    item: Input,
    log: Callable[[str], None],
    stop: threading.Event | None,
    canceller: Canceller,
    exposed: bool = False,
) -> tuple[str, str]:
    """The tree of one input, built (downloading what is missing) unless it is cached; (path, log line).
    A tree an unsandboxed job was shown is hashed again before it is used; ``exposed``: this job is one."""
    final = os.path.join(root, "trees", item.tree)
    started = time.monotonic()
    marker = exposed_marker(root, item.tree)
    if os.path.isdir(final):
        problem = tree_problem(final, item)
        if problem is None and os.path.exists(marker):
            problem = digest_problem(final, item)
            if problem is None:
                log(f"input {item.label}: an unsandboxed job had it; every file still has its SHA-256")
            else:
                for _, _, sha, _ in item.files:  # the blobs share their inodes with the tree's files
                    remove_file(blob_path(root, sha))
        if exposed:
            write_json_atomic(marker, {"at": time.time()})
        elif problem is None:
            try:
                os.unlink(marker)
            except FileNotFoundError:
                pass
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
        if exposed:
            write_json_atomic(marker, {"at": time.time()})
        elif os.path.exists(marker):
            os.unlink(marker)  # built afresh, from verified blobs
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
    mount: dict | None = None,
    helpers: set[int] | None = None,
    exposed: bool = False,
) -> dict[str, str]:
    """Make each input available read-only at its path in the work dir; returns ``{env name: tree path}``.
    ``exposed``: the job runs unsandboxed (as the server's user), so the cached trees it is shown are hashed
    again before the next job uses them.

    ``holder`` names this job in the cache's in-use records (``<job-id>-<attempt>-<member>``; default
    ``pid<pid>``): pass the same to ``release`` when the job ends (it also unmounts). ``mount`` is the mount
    config (see ``mount.py``) that ``mode: mount`` inputs need; the pid of the tool serving it is added to
    ``helpers``. Raises StageError (StageStopped when ``stop`` is set) with a message naming the dataset and
    file; nothing stays mounted then.
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
    if not items:
        return {}
    holder = check_holder(holder or f"pid{os.getpid()}")
    mounted = [item for item in items if item.mode == "mount"]
    env: dict[str, str] = {}
    try:
        if mounted:
            work = os.path.abspath(work_dir)
            os.makedirs(work, exist_ok=True)
            _MOUNTS[holder] = Mount(mount)
            env.update(mount_inputs(_MOUNTS[holder], mounted, work, log, stop, holder, helpers))
        staged = [item for item in items if item.mode == "stage"]
        env.update(stage_copies(staged, cache, work_dir, log, stop, holder, exposed))
    except BaseException:
        if holder in _MOUNTS:
            _MOUNTS.pop(holder).release(holder)
        raise
    return env


def stage_copies(
    items: list[Input],
    cache: dict,
    work_dir: str,
    log: Callable[[str], None],
    stop: threading.Event | None,
    holder: str,
    exposed: bool = False,
) -> dict[str, str]:
    """The inputs copied into the machine's cache (``mode: stage``), each placed at its path."""
    if not items:
        return {}
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
            tree, line = build_tree(root, item, log, stop, canceller, exposed)
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
    """The job has ended: its mount (if any) is unmounted and its trees are no longer in use (their last use is
    now). Idempotent."""
    mount = _MOUNTS.pop(check_holder(holder), None)
    if mount is not None:
        mount.release(holder)
    if not isinstance(cache, dict) or not os.path.isdir(os.path.join(str(cache.get("dir")), "inuse")):
        return  # nothing was ever staged through this cache
    root = cache_root(cache)
    path = os.path.join(root, "inuse", check_holder(holder))
    record = read_json(path)
    if record and isinstance(record.get("trees"), list):
        for tree in record["trees"]:
            if isinstance(tree, str) and "/" not in tree:
                touch(os.path.join(root, "index", tree + ".json"))
    remove_file(path)

"""Dataset versions mounted into a job through FUSE instead of staged (``mode: mount``), with rclone or s3fs.

Standard library only, like ``stage.py``, which uses it (loaded as ``kiln.injob.mount`` in the package or as a
plain module from this file's directory when the shim runs as a script).

One FUSE filesystem per attempt, mounted read-only, of the organisation's blob prefix in the object store
(``orgs/<org>/data/sha256``: nothing of another organisation is below it), shared by the attempt's members (the
shims of a distributed job share its work dir, so they must share what its links lead to). Each mounted input is
a tree of symlinks, one per file of the manifest, to its blob in the mount (``<mount>/<sha[:2]>/<sha256>``), and
the job sees that tree at its path exactly as a staged one. Nothing is downloaded before the command starts:
the job reads the bytes it opens, when it opens them.

The shim's config (``shim.json`` → ``mount``), written by the local executor::

    {"dir": "<attempt dir>/mount",
     "secret_file": "<attempt dir>/mount-secret.json",
     "tools": ["rclone", "s3fs"],              in order of preference (rclone mounts any store, s3fs only S3)
     "source": {"kind": "local", "path": "/.../orgs/<org>/data/sha256"}
             | {"kind": "s3", "bucket": "b", "prefix": "p/orgs/<org>/data/sha256", "endpoint": "http://..." | null,
                "region": "us-east-1" | null},
     "cache_bytes": 0}                         > 0: rclone keeps what was read on disk, up to this size

Credentials never go in the config: the executor writes them to ``secret_file`` (mode 0600):
``{"access_key_id", "secret_access_key"}``, or ``{"env": {AWS_* variables}}`` for the usual AWS chain. The
member that mounts hands them to the tool in a private file and deletes both as soon as the filesystem is
mounted, before any command of the job runs. The tool runs in a session of its own: it is not part of the job's
process tree (not killed with it, not counted in its memory).

Layout of ``dir``: ``lock`` (held while a member mounts, joins or leaves), ``mnt/`` (the mount point),
``daemon.json`` (the tool's pid), ``users/<holder>`` (the members using it), ``trees/<name>@<version>-<digest>/``
(the symlink trees, directories 0555), ``private/`` (0700: the tool's configuration while it starts),
``<tool>.log`` (what the tool printed) and, with ``cache_bytes``, ``cache/``. The last member to leave unmounts
and removes all but ``lock`` and the log.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

if __package__:
    from kiln.injob import datacache as _datacache
    from kiln.injob import fusetools as _fusetools
else:  # run by the shim as a script: its directory is on sys.path
    import datacache as _datacache  # type: ignore[no-redef]
    import fusetools as _fusetools  # type: ignore[no-redef]

StageError = _datacache.StageError
StageStopped = _datacache.StageStopped
# The machine's side (what it can mount, the tools' commands, mount points), next to this module.
TOOLS = _fusetools.TOOLS
is_mounted = _fusetools.is_mounted
last_lines = _fusetools.last_lines
mount_problem = _fusetools.mount_problem
probe = _fusetools.probe
rclone_command = _fusetools.rclone_command
s3fs_command = _fusetools.s3fs_command
stop_pid = _fusetools.stop_pid
stop_process = _fusetools.stop_process
unmount = _fusetools.unmount
usable_tools = _fusetools.usable_tools

MOUNT_SECONDS = 30.0  # the longest a tool may take to mount before the attempt fails
SECRET_FILE = "mount-secret.json"


def read_secret(path: str | None) -> dict:
    """The credentials the executor left for this shim's mount ({} when there are none)."""
    if not path:
        return {}
    try:
        with open(path) as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise StageError(f"the mount's credentials at {path} cannot be read: {exc}") from None
    return data if isinstance(data, dict) else {}


def _write_private(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


class Mount:
    """The attempt's read-only FUSE mount of the organisation's blobs, shared by its members (each shim of a
    distributed job), and the symlink trees of the mounted inputs.

    The first member to ``acquire`` it mounts; the others use that mount; each records itself under ``users/``
    and the last to ``release`` unmounts. The tool runs in a session of its own and outlives the shim that
    started it (another member may still read through it); a member that dies without releasing leaves a stale
    record, which the next look ignores, and the executor's cleanup unmounts what an attempt whose shims all died
    left mounted."""

    def __init__(self, cfg: object) -> None:
        """``cfg``: the shim config's ``mount`` (see the module's docstring)."""
        if not isinstance(cfg, dict) or not isinstance(cfg.get("source"), dict) or not cfg.get("dir"):
            raise StageError("the job's inputs are to be mounted, but the executor gave no mount configuration")
        self.cfg, self.source = cfg, cfg["source"]
        self.kind = self.source.get("kind")
        if self.kind not in ("local", "s3"):
            raise StageError(f"mount: unknown kind of store {self.kind!r}")
        self.top = str(cfg["dir"])
        self.secret_path = cfg.get("secret_file") if isinstance(cfg.get("secret_file"), str) else None
        self.point = os.path.join(self.top, "mnt")
        self.trees = os.path.join(self.top, "trees")
        self.private = os.path.join(self.top, "private")
        self.proc: subprocess.Popen | None = None  # the tool, when this shim started it
        self.tool = ""

    # -- sharing ------------------------------------------------------------------------------------------------

    @contextmanager
    def locked(self, stop: threading.Event | None) -> Iterator[None]:
        os.makedirs(self.top, exist_ok=True)
        fd = os.open(os.path.join(self.top, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            _datacache.wait_flock(fd, fcntl.LOCK_EX, stop, "the attempt's mount")
            yield
        finally:
            os.close(fd)

    def _users(self) -> list[str]:
        """The holders whose process still runs (stale records are removed)."""
        users = os.path.join(self.top, "users")
        live = []
        for name in sorted(os.listdir(users)) if os.path.isdir(users) else []:
            record = _datacache.read_json(os.path.join(users, name)) or {}
            if _datacache.alive(record.get("pid"), record.get("start")):
                live.append(name)
            else:
                _datacache.remove_file(os.path.join(users, name))
        return live

    def _daemon(self) -> dict | None:
        """The record of the tool serving the mount, when it still runs and the filesystem is mounted."""
        record = _datacache.read_json(os.path.join(self.top, "daemon.json"))
        if record and _datacache.alive(record.get("pid"), record.get("start")) and is_mounted(self.point):
            return record
        return None

    def acquire(self, holder: str, stop: threading.Event | None, helpers: set[int] | None = None) -> None:
        """Mount, or join the mount another member made (waiting until the kernel shows the filesystem). Raises
        StageError naming the tool and what it said, StageStopped when ``stop`` is set meanwhile. The credentials
        file is deleted whatever happens: once mounted, nothing needs it."""
        try:
            with self.locked(stop):
                self._users()
                daemon = self._daemon()
                if daemon is None:
                    self._shut_down()  # what a mount that died left behind
                    self._start(stop, helpers)
                else:
                    self.tool = str(daemon.get("tool") or "")
                os.makedirs(os.path.join(self.top, "users"), exist_ok=True)
                _datacache.write_json_atomic(
                    os.path.join(self.top, "users", holder),
                    {"pid": os.getpid(), "start": _datacache.proc_start(os.getpid())},
                )
        finally:
            shutil.rmtree(self.private, ignore_errors=True)
            if self.secret_path:
                _datacache.remove_file(self.secret_path)

    def release(self, holder: str) -> None:
        """This member is done; the last one unmounts and removes the mount's directory. Never raises."""
        try:
            with self.locked(None):
                _datacache.remove_file(os.path.join(self.top, "users", holder))
                if not self._users():
                    self._shut_down()
        except Exception:
            pass

    # -- the tool ------------------------------------------------------------------------------------------------

    def _start(self, stop: threading.Event | None, helpers: set[int] | None) -> None:
        tools = self.cfg.get("tools") or list(TOOLS)
        found = usable_tools(self.kind, tools)
        if not found:
            raise StageError(f"mode 'mount' is not available on this machine: {mount_problem(self.kind, tools)}")
        self.tool = found[0]
        if self.secret_path and not os.path.exists(self.secret_path) and self.kind == "s3":
            raise StageError("the mount's credentials are gone (the attempt mounted once already); restart the job")
        secret = read_secret(self.secret_path)
        for path in (self.point, self.trees):
            os.makedirs(path, exist_ok=True)
        os.makedirs(self.private, mode=0o700, exist_ok=True)
        cache = os.path.join(self.top, "cache")
        cache_bytes = self.cfg.get("cache_bytes") or 0
        if self.tool == "rclone":
            argv, env, files = rclone_command(self.source, secret, self.point, self.private, cache, cache_bytes)
        else:
            argv, env, files = s3fs_command(self.source, secret, self.point, self.private)
        for path, text in files.items():
            _write_private(path, text)
        exe = shutil.which(self.tool)
        assert exe is not None
        with open(os.path.join(self.top, f"{self.tool}.log"), "ab") as out:
            try:
                # Its own session: not part of the job's process tree, and it outlives this shim.
                self.proc = subprocess.Popen(
                    [exe, *argv],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                raise StageError(f"cannot run {self.tool}: {exc}") from None
        if helpers is not None:
            helpers.add(self.proc.pid)
        pid = self.proc.pid
        _datacache.write_json_atomic(
            os.path.join(self.top, "daemon.json"), {"pid": pid, "start": _datacache.proc_start(pid), "tool": self.tool}
        )
        deadline = time.monotonic() + MOUNT_SECONDS
        while not is_mounted(self.point):
            code = self.proc.poll()
            if code is not None:
                said = self._said() or "it printed nothing"
                self._shut_down()
                raise StageError(f"{self.tool} could not mount the store (exit code {code}): {said}")
            if stop is not None and stop.is_set():
                self._shut_down()
                raise StageStopped("stopped while mounting the inputs")
            if time.monotonic() > deadline:
                said = self._said() or "it printed nothing"
                self._shut_down()
                raise StageError(f"{self.tool} did not mount the store within {MOUNT_SECONDS:.0f} s: {said}")
            time.sleep(0.05)

    def _shut_down(self) -> None:
        shut_down(self.top, self.proc)
        self.proc = None

    def _said(self, lines: int = 3) -> str:
        """The last lines the tool printed ("" when none)."""
        try:
            with open(os.path.join(self.top, f"{self.tool}.log"), errors="replace") as fh:
                return last_lines(fh.read(), lines)
        except OSError:
            return ""

    # -- the inputs --------------------------------------------------------------------------------------------

    def tree(self, label: str, tree: str, files: Iterable[tuple[str, str]], dirs: Sequence[str]) -> str:
        """The symlink tree of one input, ``rel → <mount>/<sha[:2]>/<sha>`` for each (rel, sha), read-only; built
        once per attempt (another member may have built it), in a temporary directory renamed into place."""
        path = os.path.join(self.trees, tree)
        if os.path.isdir(path):
            return path
        tmp = os.path.join(self.trees, f".tmp.{os.getpid()}.{tree}")
        _datacache.remove_tree(tmp)
        try:
            os.makedirs(self.trees, exist_ok=True)
            os.mkdir(tmp)
            for rel in dirs:
                os.mkdir(os.path.join(tmp, rel))
            for rel, sha in files:
                os.symlink(os.path.join(self.point, sha[:2], sha), os.path.join(tmp, rel))
            # Read-only without walking the tree (that would look every link's target up through the mount).
            for rel in sorted(dirs, key=lambda d: -d.count("/")):
                os.chmod(os.path.join(tmp, rel), 0o555)
            os.chmod(tmp, 0o555)
            os.rename(tmp, path)
        except OSError as exc:
            _datacache.remove_tree(tmp)
            if os.path.isdir(path):
                return path  # another member renamed the same tree into place first
            raise StageError(f"input {label}: cannot build its tree of links into the mount: {exc}") from None
        return path

    def check(self, label: str, rel: str, sha: str, size: int) -> None:
        """One file through the mount (the store is reachable and holds the blob with its manifest size)."""
        try:
            st = os.stat(os.path.join(self.point, sha[:2], sha))
        except OSError as exc:
            said = self._said(lines=1)
            raise StageError(
                f"input {label}: file {rel} cannot be read through the {self.tool} mount: {exc.strerror}"
                + (f" ({self.tool} said: {said})" if said else "")
            ) from None
        if st.st_size != size:
            raise StageError(f"input {label}: file {rel} has {st.st_size} bytes in the store, the manifest says {size}")


def shut_down(top: str, proc: subprocess.Popen | None = None) -> bool:
    """Unmount the mount under ``top``, stop its tool (``proc`` when this process started it, else by the pid
    it recorded) and remove what the mount used; True when nothing stays mounted. Keeps ``lock`` and the tool's
    log (the attempt's record of what happened)."""
    point = os.path.join(top, "mnt")
    unmount(point)
    record = _datacache.read_json(os.path.join(top, "daemon.json")) or {}
    if proc is not None and proc.pid == record.get("pid"):
        stop_process(proc)
    elif _datacache.alive(record.get("pid"), record.get("start")):
        stop_pid(int(record["pid"]), record.get("start"))
    if is_mounted(point):
        return False  # still busy: the executor's cleanup tries again
    _datacache.remove_file(os.path.join(top, "daemon.json"))
    for sub in ("trees", "users", "cache", "private"):
        _datacache.remove_tree(os.path.join(top, sub))
    try:
        os.rmdir(point)
    except OSError:
        pass
    return True


def cleanup(top: str, secret_path: str | None = None) -> None:
    """What an attempt whose shims died left of its mount: unmount, stop the tool, remove its files."""
    if secret_path:
        _datacache.remove_file(secret_path)
    if os.path.isdir(top):
        shut_down(top)

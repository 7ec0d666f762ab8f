"""``python -m kiln.injob.notebook``: the process a notebook's job runs. Standard library only: it runs in the
notebook's runtime (the ``+lab`` variant, which has ``jupyterlab``), with none of Kiln's dependencies.

Its config is the job's params, read from the JSON file ``$KILN_PARAMS_FILE``::

    {"notebook_id": "nb-…", "base_url": "/notebooks/nb-…/", "sync_seconds": 60}

with ``$HOME`` (the notebook's home: JupyterLab's root, the directory that persists), ``$KILN_WORK_DIR`` (the
job's work dir, also the cwd), ``$KILN_ENDPOINT`` and ``$KILN_JOB_TOKEN`` (Kiln's API, as this job).

1. It restores the home: ``GET /api/v1/notebooks/{id}/home`` is a gzip'd tar (200) or nothing yet (204). Only
   regular files, directories and symbolic links that stay in the home are written, never through a symbolic
   link (each directory on a path is opened with ``O_NOFOLLOW``); anything else is skipped and said. A home that
   cannot be restored fails the job (exit 4): starting empty would overwrite the saved home at the first save.
2. It starts JupyterLab on a Unix socket in the work dir, ``.kiln-notebook.sock`` (mode 0600, bound by its
   relative name, so a work dir's path of any length fits), with a random token, and waits until
   ``GET {base_url}api/status`` answers 200 with that token. Then it writes ``{"socket", "token", "pid",
   "base_url"}`` to ``$KILN_WORK_DIR/.kiln-notebook.json`` (atomically, mode 0600): Kiln's proxy connects to
   the socket's file from outside the job's network namespace with that token (kiln.api.notebook_proxy). No
   TCP port is opened.
3. Every ``sync_seconds`` it saves the home when something in it changed (``PUT`` of a gzip'd tar, built
   outside the home), leaving out caches (``NOT_SAVED``). A refused save (413: over the organisation's quota)
   is said in the log and tried again at the next round; the previous save stays.
4. SIGTERM or SIGINT: JupyterLab gets SIGTERM (SIGKILL after 2 s), the home is saved if it changed, the state
   file is removed, exit 0. JupyterLab exiting on its own: the home is saved the same way, and its exit code is
   the job's (1 if it exits 0 before it was ever ready). A bad config: exit 2.

Lines starting ``kiln: `` are Kiln's own (never parsed as metrics); the first says which directory persists.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import secrets
import select
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import time
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote, urlsplit

STATE_FILE = ".kiln-notebook.json"
SOCKET_FILE = ".kiln-notebook.sock"
INPUTS_LINK = "data"  # in the home: the job's inputs (a link to the work dir's data/)
RUNTIME_DIR = ".kiln-jupyter-runtime"  # in the work dir: its files (one holds the token) are not the home's
UPLOAD_FILE = ".kiln-home-upload.tar.gz"
EXIT_CONFIG = 2
EXIT_RESTORE = 4
SYNC_SECONDS = 60.0
READY_POLL = 0.1
LOOP_POLL = 0.2  # how soon a stop or JupyterLab's exit is noticed
STOP_GRACE = 2.0
HTTP_TIMEOUT = 60.0  # seconds one read or write to Kiln's API may stall
ANSWER_TIMEOUT = 600.0  # seconds for the answer to a saved home: Kiln stores it before it answers
PROBE_TIMEOUT = 5.0
CHUNK = 1024 * 1024
MAX_SAID = 20  # skipped entries named one by one; the rest are counted
# Under the home and never saved: caches, JupyterLab's runtime files, the trash (what was deleted stays deleted).
NOT_SAVED = (".cache", ".local/share/jupyter/runtime", ".local/share/Trash", ".npm/_cacache", ".npm/_logs")
NOTEBOOK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
BASE_URL = re.compile(r"/(?:[A-Za-z0-9._~-]+/)*")


@dataclass(frozen=True)
class NotebookConfig:
    """The job's params and environment (see the module docstring)."""

    notebook_id: str
    base_url: str
    sync_seconds: float
    endpoint: str
    job_token: str
    home: Path
    work_dir: Path

    @property
    def home_url(self) -> str:
        return f"{self.endpoint}/api/v1/notebooks/{quote(self.notebook_id)}/home"


def read_config(env: Mapping[str, str]) -> NotebookConfig:
    """The config from ``env`` and the params file it names; ValueError says what is wrong."""
    missing = [name for name in ("KILN_PARAMS_FILE", "KILN_ENDPOINT", "KILN_JOB_TOKEN", "HOME") if not env.get(name)]
    if missing:
        raise ValueError(f"{', '.join(missing)} not set")
    try:
        params = json.loads(Path(env["KILN_PARAMS_FILE"]).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the params file {env['KILN_PARAMS_FILE']}: {exc}") from exc
    if not isinstance(params, dict):
        raise ValueError("the params file does not hold a JSON object")
    notebook_id, base_url = params.get("notebook_id"), params.get("base_url")
    if not isinstance(notebook_id, str) or not NOTEBOOK_ID.fullmatch(notebook_id):
        raise ValueError(f"notebook_id: a notebook's id, got {notebook_id!r}")
    if not isinstance(base_url, str) or not BASE_URL.fullmatch(base_url):
        raise ValueError(f"base_url: a path starting and ending with '/', got {base_url!r}")
    sync = params.get("sync_seconds", SYNC_SECONDS)
    if isinstance(sync, bool) or not isinstance(sync, int | float) or not 0 < sync < 86400:
        raise ValueError(f"sync_seconds: seconds between saves of the home (0 < s < 86400), got {sync!r}")
    endpoint = env["KILN_ENDPOINT"].rstrip("/")
    if urlsplit(endpoint).scheme not in ("http", "https"):
        raise ValueError(f"KILN_ENDPOINT: an http(s) URL, got {endpoint!r}")
    home = Path(os.path.realpath(env["HOME"]))
    if not home.is_dir():
        raise ValueError(f"HOME: {home} is not a directory")
    work_dir = Path(os.path.realpath(env.get("KILN_WORK_DIR") or os.getcwd()))
    if not work_dir.is_dir():
        raise ValueError(f"KILN_WORK_DIR: {work_dir} is not a directory")
    return NotebookConfig(notebook_id, base_url, float(sync), endpoint, env["KILN_JOB_TOKEN"], home, work_dir)


def say(message: str, *, error: bool = False) -> None:
    print(f"kiln: {message}", file=sys.stderr if error else sys.stdout, flush=True)


# --- Kiln's API ------------------------------------------------------------------------------------------------


def _connect(url: str) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    return cls(parts.hostname or "", parts.port, timeout=HTTP_TIMEOUT), target


def _why(response: http.client.HTTPResponse) -> str:
    """``HTTP 413 <the server's message>`` from an error answer of Kiln's API (``{"code", "message"}``)."""
    try:
        body = response.read(64 * 1024)
        message = json.loads(body).get("message") or ""
    except (OSError, ValueError, AttributeError, http.client.HTTPException):
        message = ""
    return f"HTTP {response.status} {message or response.reason}".rstrip()


class HomeUnavailable(Exception):
    """The stored home could not be fetched or read: the notebook must not start."""


def restore_home(config: NotebookConfig) -> tuple[int, list[str]] | None:
    """Fetch the stored home and extract it into ``config.home``: (entries written, entries skipped), or None
    when nothing is stored yet (204). HomeUnavailable says why it could not."""
    conn, target = _connect(config.home_url)
    try:
        try:
            conn.request("GET", target, headers={"Authorization": f"Bearer {config.job_token}"})
            response = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            raise HomeUnavailable(f"GET {config.home_url}: {type(exc).__name__}: {exc}") from exc
        if response.status == 204:
            return None
        if response.status != 200:
            raise HomeUnavailable(f"GET {config.home_url}: {_why(response)}")
        try:
            return extract_home(response, config.home)
        except (tarfile.TarError, EOFError, zlib.error, OSError, http.client.HTTPException) as exc:
            raise HomeUnavailable(f"restoring the stored home: {type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()


def upload_home(config: NotebookConfig, archive: Path) -> str | None:
    """PUT ``archive`` as the notebook's home; None when Kiln took it, else why not. The body is streamed; an
    answer that comes before all of it is sent (a 413 decided on its Content-Length) is read, not lost."""
    size = archive.stat().st_size
    conn, target = _connect(config.home_url)
    try:
        conn.putrequest("PUT", target)
        conn.putheader("Authorization", f"Bearer {config.job_token}")
        conn.putheader("Content-Type", "application/gzip")
        conn.putheader("Content-Length", str(size))
        conn.endheaders()
        with archive.open("rb") as fh:
            while chunk := fh.read(CHUNK):
                if conn.sock is not None and select.select([conn.sock], [], [], 0)[0]:
                    break  # the server answered (or closed) already
                try:
                    conn.send(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    break  # its answer, if it sent one, is read below
        if conn.sock is not None:
            conn.sock.settimeout(ANSWER_TIMEOUT)
        response = conn.getresponse()
        if 200 <= response.status < 300:
            return None
        return _why(response)
    except (OSError, http.client.HTTPException) as exc:
        return f"PUT {config.home_url}: {type(exc).__name__}: {exc}"
    finally:
        conn.close()


# --- extracting a stored home ----------------------------------------------------------------------------------


class _Refused(Exception):
    pass


def _member_parts(member: tarfile.TarInfo) -> list[str]:
    """The member's path in the home as components, or _Refused."""
    name = member.name
    if name.startswith("/"):
        raise _Refused("an absolute name")
    if "\0" in name:
        raise _Refused("a NUL in its name")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise _Refused("a '..' in its name")
    return parts


def _refusal(member: tarfile.TarInfo, parts: list[str], home: str) -> str | None:
    """Why ``member`` is not written into ``home``, or None."""
    if member.islnk():
        return "a hard link"
    if member.ischr() or member.isblk():
        return "a device"
    if member.isfifo():
        return "a fifo"
    if not (member.isreg() or member.isdir() or member.issym()):
        return f"an entry of type {member.type!r}"
    if member.issym():
        if not member.linkname or "\0" in member.linkname:
            return "a symbolic link to nothing"
        if member.linkname.startswith("/"):
            return f"a symbolic link to an absolute path ({member.linkname})"
        resolved = os.path.normpath(os.path.join(*parts[:-1], member.linkname) if parts[:-1] else member.linkname)
        if resolved == ".." or resolved.startswith("../"):
            return f"a symbolic link out of the home ({member.linkname})"
    data_filter = getattr(tarfile, "data_filter", None)  # Python 3.11.4+: its checks too, against what is there now
    if data_filter is not None:
        try:
            data_filter(member, home)
        except tarfile.TarError as exc:
            return str(exc)
    return None


def _open_dirs(root_fd: int, parts: list[str]) -> int:
    """A descriptor of the directory ``parts`` under ``root_fd``, made where missing, never through a link."""
    fd = os.dup(root_fd)
    try:
        for index, part in enumerate(parts):
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                raise _Refused(f"{'/'.join(parts[: index + 1])} is not a directory ({exc.strerror})") from exc
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, root_fd: int, parts: list[str]) -> None:
    if member.isdir():
        os.close(_open_dirs(root_fd, parts))
        return
    parent = _open_dirs(root_fd, parts[:-1])
    name = parts[-1]
    try:
        try:
            there = os.lstat(name, dir_fd=parent)
        except FileNotFoundError:
            pass
        else:
            if stat.S_ISDIR(there.st_mode):
                raise _Refused("a directory is in its place")
            os.unlink(name, dir_fd=parent)  # a file or a link: replaced, never written through
        if member.issym():
            os.symlink(member.linkname, name, dir_fd=parent)
            return
        source = tar.extractfile(member)
        if source is None:
            raise _Refused("no data")
        mode = (member.mode & 0o755) | 0o600  # no setuid/setgid/sticky, no group or other write
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=parent)
        with os.fdopen(fd, "wb") as out:
            while chunk := source.read(CHUNK):
                out.write(chunk)
            out.flush()
            os.fchmod(out.fileno(), mode)
            os.utime(out.fileno(), (member.mtime, member.mtime))
    finally:
        os.close(parent)


def extract_home(stream: IO[bytes], home: Path) -> tuple[int, list[str]]:
    """Extract the gzip'd tar read from ``stream`` into ``home``: (entries written, ``"name: why"`` of each entry
    skipped: what could harm or leave the home). Raises tarfile.TarError (or zlib.error, EOFError) for a stream
    that is not one, OSError for what could not be written: a home restored in part must not be saved over the
    whole one."""
    root = os.path.realpath(home)
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    written, skipped = 0, []
    try:
        with tarfile.open(fileobj=stream, mode="r|gz") as tar:
            for member in tar:
                try:
                    parts = _member_parts(member)
                    if not parts:
                        continue  # the home itself
                    reason = _refusal(member, parts, root)
                    if reason is not None:
                        raise _Refused(reason)
                    _write_member(tar, member, root_fd, parts)
                    written += 1
                except _Refused as exc:  # anything else (a full disk, a broken stream) fails the restore
                    skipped.append(f"{member.name}: {exc}")
    finally:
        os.close(root_fd)
    return written, skipped


# --- saving the home -------------------------------------------------------------------------------------------


def _walk(home: Path, excluded: tuple[str, ...], problems: list[str]) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """(relative path, entry) of every directory, symbolic link and regular file under ``home``, parents first,
    in a stable order, never following a link; what cannot be read is added to ``problems``."""
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            with os.scandir(home / rel if rel else home) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError as exc:
            problems.append(f"{rel or '.'}: {exc.strerror}")
            continue
        subdirs = []
        for entry in entries:
            path = f"{rel}/{entry.name}" if rel else entry.name
            if path in excluded:
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append(path)
                elif not (entry.is_symlink() or entry.is_file(follow_symlinks=False)):
                    continue  # sockets, fifos, devices: not a home's
            except OSError:
                continue
            yield path, entry
        stack.extend(reversed(subdirs))


def _excluded(config_home: Path, work_dir: Path | None) -> tuple[str, ...]:
    excluded: tuple[str, ...] = NOT_SAVED
    if work_dir is not None and work_dir != config_home and work_dir.is_relative_to(config_home):
        excluded += (work_dir.relative_to(config_home).as_posix(),)  # the state file holds the token
    if work_dir is not None and _is_inputs_link(config_home / INPUTS_LINK, work_dir):
        excluded += (INPUTS_LINK,)  # the job's inputs, linked in: not the home's to keep
    return excluded


def _is_inputs_link(link: Path, work_dir: Path) -> bool:
    try:
        return link.is_symlink() and os.readlink(link) == str(work_dir / INPUTS_LINK)
    except OSError:
        return False


def link_inputs(home: Path, work_dir: Path) -> None:
    """The job's inputs (staged under the work dir's ``data/``) as ``data`` in the home, where JupyterLab's file
    browser and a notebook's relative paths find them (``data/NAME``), unless the home has a ``data`` of its own."""
    staged, link = work_dir / INPUTS_LINK, home / INPUTS_LINK
    if not staged.is_dir():
        return
    if link.is_symlink():
        link.unlink()  # a link saved by an earlier start (or made by the user): this start's inputs replace it
    if link.exists():
        say(f"inputs: {link} is the home's own, so the inputs are at {staged} (and $KILN_INPUT_<NAME>)")
        return
    link.symlink_to(staged, target_is_directory=True)
    say(f"inputs: at {link} (and $KILN_INPUT_<NAME>)")


def home_signature(home: Path, work_dir: Path | None = None) -> str:
    """A digest of what a save of ``home`` would hold: each entry's path and kind, a file's size and mtime_ns,
    a link's target. Equal digests: nothing to save."""
    digest = hashlib.sha256()
    for path, entry in _walk(home, _excluded(home, work_dir), []):
        try:
            info = entry.stat(follow_symlinks=False)
            if entry.is_symlink():
                line = f"l {path}\0{os.readlink(entry.path)}"
            elif stat.S_ISDIR(info.st_mode):
                line = f"d {path}"
            else:
                line = f"f {path}\0{info.st_size}\0{info.st_mtime_ns}"
        except OSError:
            continue
        digest.update(line.encode("utf-8", "surrogateescape") + b"\n")
    return digest.hexdigest()


class _Exactly:
    """``size`` bytes of ``fh``: a file that shrank while it was read is padded with zeros (it changed, so the
    next round saves it again), one that grew is cut."""

    def __init__(self, fh: IO[bytes], size: int) -> None:
        self.fh, self.left = fh, size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = self.fh.read(n)
        data += b"\0" * (n - len(data))
        self.left -= n
        return data


def build_archive(home: Path, target: Path, work_dir: Path | None = None) -> list[str]:
    """Write ``home`` as a gzip'd tar to ``target`` (mode 0600): directories, regular files and symbolic links
    (as links), without ``NOT_SAVED``. Returns ``"path: why"`` of what could not be read."""
    problems: list[str] = []
    target.unlink(missing_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz", compresslevel=6) as tar:
        for path, entry in _walk(home, _excluded(home, work_dir), problems):
            try:
                if entry.is_symlink() or entry.is_dir(follow_symlinks=False):
                    info = tar.gettarinfo(entry.path, arcname=path)
                    _anonymous(info)
                    tar.addfile(info)
                    continue
                file_fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError as exc:
                problems.append(f"{path}: {exc.strerror}")
                continue
            with os.fdopen(file_fd, "rb") as fh:
                if not stat.S_ISREG(os.fstat(file_fd).st_mode):
                    continue  # replaced by something else since it was listed
                info = tar.gettarinfo(arcname=path, fileobj=fh)
                _anonymous(info)
                tar.addfile(info, _Exactly(fh, info.size))  # type: ignore[arg-type]
        raw.flush()
        os.fsync(raw.fileno())
    return problems


def _anonymous(info: tarfile.TarInfo) -> None:
    info.uid = info.gid = 0
    info.uname = info.gname = ""


def _said(items: list[str]) -> str:
    more = f" (and {len(items) - MAX_SAID} more)" if len(items) > MAX_SAID else ""
    return "; ".join(items[:MAX_SAID]) + more


class HomeSync:
    """Saves the home when it changed since the last save Kiln took (``saved``: that save's signature)."""

    def __init__(self, config: NotebookConfig, saved: str | None) -> None:
        self.config = config
        self.saved = saved

    def run(self) -> str:
        """Save the home if it changed: ``"saved"``, ``"unchanged"`` or ``"failed"`` (said on stderr)."""
        home, work_dir = self.config.home, self.config.work_dir
        signature = home_signature(home, work_dir)  # before the archive: a change while it is built is saved next
        if signature == self.saved:
            return "unchanged"
        archive = work_dir / UPLOAD_FILE
        try:
            problems = build_archive(home, archive, work_dir)
            if problems:
                say(f"notebook home: not saved (unreadable): {_said(problems)}", error=True)
            why = upload_home(self.config, archive)
        except (OSError, tarfile.TarError, ValueError) as exc:
            why = f"building the archive in {work_dir}: {type(exc).__name__}: {exc}"
        finally:
            archive.unlink(missing_ok=True)
        if why is not None:
            say(f"notebook home not saved: {why}", error=True)
            return "failed"
        self.saved = signature
        return "saved"


# --- JupyterLab ------------------------------------------------------------------------------------------------


def lab_command(config: NotebookConfig, token: str) -> list[str]:
    """JupyterLab on ``SOCKET_FILE`` (relative to the work dir, its cwd) under ``config.base_url``."""
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        f"--ServerApp.sock={SOCKET_FILE}",
        "--ServerApp.sock_mode=0600",
        f"--IdentityProvider.token={token}",  # jupyter_server 2.x: ServerApp.token is its deprecated alias
        f"--ServerApp.base_url={config.base_url}",
        f"--ServerApp.root_dir={config.home}",
        "--ServerApp.allow_remote_access=True",  # the Host header is Kiln's server's, not localhost
        "--ServerApp.terminals_enabled=True",
        "--LabApp.news_url=None",  # the job's network may not reach the internet: no news, no update checks,
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",  # and no pip installs into the shared runtime
    ]
    if os.geteuid() == 0:  # a container that runs jobs as root; the sandbox is the boundary, not the uid
        command.append("--ServerApp.allow_root=True")
    return command


def lab_env(config: NotebookConfig) -> dict[str, str]:
    runtime = config.work_dir / RUNTIME_DIR
    runtime.mkdir(mode=0o700, exist_ok=True)
    return {**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime)}


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def lab_status(socket_path: str, base_url: str, token: str | None) -> int | None:
    """The HTTP status of ``GET {base_url}api/status`` over the Unix socket (None: nothing answers yet)."""
    conn = _UnixConnection(socket_path, PROBE_TIMEOUT)
    try:
        headers = {"Authorization": f"token {token}"} if token else {}
        conn.request("GET", f"{base_url}api/status", headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def write_state(directory: Path, state: dict[str, Any]) -> Path:
    """``state`` as ``directory/.kiln-notebook.json``, readable by this user only, appearing whole or not at all."""
    path = directory / STATE_FILE
    tmp = directory / f".{STATE_FILE}.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode  # killed by signal N: 128 + N, as a shell says


class _Stop:
    """SIGTERM/SIGINT once JupyterLab runs: pass SIGTERM on at once (a save in progress finishes), and let the
    main loop, which looks at ``requested`` every LOOP_POLL, wind down. JupyterLab gets one SIGTERM: a second
    one restarts its shutdown (its kernels' included)."""

    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.requested = False

    def __call__(self, signum: int, frame: object) -> None:
        if not self.requested:
            self.requested = True
            self.terminate()

    def terminate(self) -> None:
        if self.child is not None and self.child.returncode is None:
            try:
                os.kill(self.child.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def wait(self) -> None:
        """JupyterLab stopped: STOP_GRACE seconds after SIGTERM, then SIGKILL."""
        if self.child is None:
            return
        try:
            self.child.wait(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            say(f"jupyterlab did not stop within {STOP_GRACE:g}s of SIGTERM: SIGKILL", error=True)
            self.child.kill()
            self.child.wait()


def _exit_now(signum: int, frame: object) -> None:
    raise SystemExit(0)  # stopped while the home is restored: nothing is newer than the stored home


def main() -> int:
    try:
        config = read_config(os.environ)
    except ValueError as exc:
        say(f"notebook: {exc}", error=True)
        return EXIT_CONFIG
    os.chdir(config.work_dir)  # the socket is named relative to it
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_now)
    say(
        f"notebook home {config.home}: the files under it persist (saved every {config.sync_seconds:g}s when "
        "something changed, and when the notebook stops); anything outside it is gone when it stops"
    )
    try:
        restored = restore_home(config)
    except HomeUnavailable as exc:
        say(f"notebook home not restored: {exc}", error=True)
        return EXIT_RESTORE
    if restored is None:
        say("notebook home: nothing saved yet, starting with an empty home")
    else:
        written, skipped = restored
        say(f"notebook home restored: {written} entries")
        if skipped:
            say(f"notebook home: skipped {len(skipped)} entries of the stored home: {_said(skipped)}", error=True)
    link_inputs(config.home, config.work_dir)
    sync = HomeSync(config, home_signature(config.home, config.work_dir) if restored is not None else None)
    token = secrets.token_urlsafe(32)
    (config.work_dir / STATE_FILE).unlink(missing_ok=True)
    stop = _Stop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    child = subprocess.Popen(
        lab_command(config, token), cwd=config.work_dir, env=lab_env(config), stdin=subprocess.DEVNULL
    )
    stop.child = child
    if stop.requested:  # it came while JupyterLab was being started
        stop.terminate()
    state: Path | None = None
    while not stop.requested and child.poll() is None:
        if lab_status(SOCKET_FILE, config.base_url, token) == 200:
            state = write_state(
                config.work_dir,
                {"socket": SOCKET_FILE, "token": token, "pid": child.pid, "base_url": config.base_url},
            )
            say(f"notebook ready (the files under $HOME persist: {config.home})")
            break
        time.sleep(READY_POLL)
    if state is None and child.returncode is not None and not stop.requested:
        code = exit_status(child.returncode)
        say(f"jupyterlab exited with {code} before it was ready", error=True)
        return code or 1
    next_sync = time.monotonic() + config.sync_seconds
    while not stop.requested and child.poll() is None:
        if time.monotonic() >= next_sync:
            sync.run()
            next_sync = time.monotonic() + config.sync_seconds
        time.sleep(LOOP_POLL)
    if stop.requested:
        stop.wait()
        code = 0
    else:
        code = exit_status(child.wait())
        say(f"jupyterlab exited with {code}", error=code != 0)
    if state is not None:
        state.unlink(missing_ok=True)
    outcome = sync.run()
    if outcome != "failed":
        say(f"notebook home {outcome}")
    return code


if __name__ == "__main__":
    sys.exit(main())

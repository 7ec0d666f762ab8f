"""``python -m kiln.injob.notebook``: the process a notebook's job runs. Standard library only: it runs in the
notebook's runtime (the ``+lab`` variant, which has ``jupyterlab``), with none of Kiln's dependencies.

Its config is the job's params, read from the JSON file ``$KILN_PARAMS_FILE``::

    {"notebook_id": "nb-…", "base_url": "/notebooks/nb-…/", "sync_seconds": 60, "port": 8888}

(``port`` optional: see 2.) with ``$HOME`` (the notebook's home: JupyterLab's root, the directory that
persists), ``$KILN_WORK_DIR`` (the job's work dir, also the cwd), ``$KILN_ENDPOINT`` and ``$KILN_JOB_TOKEN``
(Kiln's API, as this job).

1. It restores the home: ``GET /api/v1/notebooks/{id}/home`` is a gzip'd tar (200) or nothing yet (204). Only
   regular files, directories and symbolic links that stay in the home are written, never through a symbolic
   link (each directory on a path is opened with ``O_NOFOLLOW``); anything else is skipped and said. A home that
   cannot be restored fails the job (exit 4): starting empty would overwrite the saved home at the first save.
2. It starts JupyterLab on a Unix socket in the work dir, ``.kiln-notebook.sock`` (mode 0600, bound by its
   relative name, so a work dir's path of any length fits), with a random token, and waits until
   ``GET {base_url}api/status`` answers 200 with that token. Then it writes ``{"socket", "token", "pid",
   "base_url"}`` to ``$KILN_WORK_DIR/.kiln-notebook.json`` (atomically, mode 0600): Kiln's proxy connects to
   the socket's file from outside the job's network namespace with that token (kiln.api.notebook_proxy). No
   TCP port is opened. With ``port`` (a Kubernetes pod: kiln.backends.kubernetes.notebooks), JupyterLab listens
   on ``0.0.0.0:<port>`` (or the param ``ip``) instead, with the token Kiln injects as ``$KILN_NOTEBOOK_TOKEN``
   (required then), is probed on ``127.0.0.1:<port>`` (on ``ip`` when it names one address), and the state
   file says ``{"port", "pid", "base_url"}`` (the token is Kiln's already); the pod's NetworkPolicy admits only
   Kiln's server pods to that port.
3. Every ``sync_seconds`` it saves the home when something in it changed (``PUT`` of a gzip'd tar, built
   outside the home), leaving out caches (``NOT_SAVED``). A refused save (413: over the organisation's quota)
   is said in the log and tried again at the next round; the previous save stays.
4. SIGTERM or SIGINT: JupyterLab gets SIGTERM (SIGKILL after 2 s), the home is saved if it changed, the state
   file is removed, exit 0. JupyterLab exiting on its own: the home is saved the same way, and its exit code is
   the job's (1 if it exits 0 before it was ever ready). A bad config: exit 2.

Lines starting ``kiln: `` are Kiln's own (never parsed as metrics); the first says which directory persists. The
notebook says it too: a new home gets ``Welcome to Kiln.ipynb`` (its first cell), and each JupyterLab terminal
prints it first: where there is bash, a terminal runs ``bash --rcfile .kiln-bashrc -i`` (in the work dir, not the
home: it prints the banner, then reads /etc/bash.bashrc and ~/.bashrc as bash would), set as
``ServerApp.terminado_settings`` in a ``jupyter_server_config.json`` of Kiln's own config dir in the work dir, named
by ``$JUPYTER_CONFIG_PATH`` (not ``--config``, which would skip the user's ``~/.jupyter`` and the image's config).
``$SHELL`` is left alone: IPython runs ``!cmd`` with it, and a banner there would be in every command's output.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import re
import secrets
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from kiln.injob import statefile
from kiln.injob.notebook_home import (  # noqa: F401 - NOT_SAVED and home_signature: part of this module's face
    NOT_SAVED,
    _said,
    build_archive,
    extract_home,
    home_signature,
    link_inputs,
    say,
)

STATE_FILE = ".kiln-notebook.json"
SOCKET_FILE = ".kiln-notebook.sock"
RUNTIME_DIR = ".kiln-jupyter-runtime"  # in the work dir: its files (one holds the token) are not the home's
TOKEN_FILE = "token"  # in RUNTIME_DIR (0700), mode 0600: JupyterLab reads its token from it ($JUPYTER_TOKEN_FILE)
UPLOAD_FILE = ".kiln-home-upload.tar.gz"
RC_FILE = ".kiln-bashrc"  # in the work dir: a terminal's bash reads it, and it prints the banner
CONFIG_DIR = ".kiln-jupyter-config"  # in the work dir: on $JUPYTER_CONFIG_PATH, Kiln's jupyter_server_config.json
TOKEN_ENV = "KILN_NOTEBOOK_TOKEN"  # with a port: JupyterLab's token, injected by Kiln (a Kubernetes Secret)
WELCOME_FILE = "Welcome to Kiln.ipynb"  # written into a new home
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
    port: int | None = None  # None: the Unix socket SOCKET_FILE; else TCP on every address of the pod
    lab_token: str = ""  # with a port: $KILN_NOTEBOOK_TOKEN
    ip: str = "0.0.0.0"  # with a port: the address JupyterLab listens on (every IPv4 one of the pod; "::" for IPv6)

    @property
    def probe_host(self) -> str:
        """Where the launcher itself asks JupyterLab whether it is up: loopback when it listens everywhere."""
        return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.ip, self.ip)

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
    port, lab_token, ip = params.get("port"), "", params.get("ip", "0.0.0.0")
    try:
        if not isinstance(ip, str):
            raise ValueError(ip)
        ipaddress.ip_address(ip)
    except ValueError:
        raise ValueError(
            f"ip: the address JupyterLab listens on with a port (0.0.0.0, ::, or one), got {ip!r}"
        ) from None
    if port is not None:
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError(f"port: the TCP port JupyterLab listens on (1..65535), got {port!r}")
        lab_token = env.get(TOKEN_ENV, "")
        if not lab_token.strip():
            raise ValueError(f"{TOKEN_ENV} not set: with a port, JupyterLab's token is the one Kiln injects")
    return NotebookConfig(
        notebook_id, base_url, float(sync), endpoint, env["KILN_JOB_TOKEN"], home, work_dir, port, lab_token, ip
    )


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


def lab_command(config: NotebookConfig) -> list[str]:
    """JupyterLab on ``SOCKET_FILE`` (relative to the work dir, its cwd), or on TCP ``config.port`` of every
    address, under ``config.base_url``. Never its token: a command line is anyone's to read on the host (``ps``,
    ``/proc/PID/cmdline``); the token comes from a file only the job's user reads (:func:`lab_env`)."""
    if config.port is None:
        listen = [f"--ServerApp.sock={SOCKET_FILE}", "--ServerApp.sock_mode=0600"]
    else:  # port_retries=0: a port taken fails the start, never a silent move to the next port
        listen = [f"--ServerApp.ip={config.ip}", f"--ServerApp.port={config.port}", "--ServerApp.port_retries=0"]
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        *listen,
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


def banner(config: NotebookConfig) -> str:
    """What the notebook says of what persists: in each terminal it opens and in a new home's welcome notebook."""
    return (
        f"Kiln notebook: the files under {config.home} (your home, ~) persist: saved every "
        f"{config.sync_seconds:g}s when something changed, and when the notebook stops. Anything outside it is "
        "gone when the notebook stops. The job's inputs are under ~/data (read-only, not saved)."
    )


def terminal_rcfile(config: NotebookConfig) -> Path:
    """What a terminal's bash reads (``--rcfile``): the banner, then what an interactive bash reads itself
    (--rcfile replaces both). In the work dir, not the home: it is Kiln's, not the user's to keep."""
    path = config.work_dir / RC_FILE
    path.write_text(
        "# Kiln: JupyterLab's terminals run `bash --rcfile <this file> -i`.\n"
        f"printf '%s\\n\\n' {shlex.quote(banner(config))}\n"
        "if [ -f /etc/bash.bashrc ]; then . /etc/bash.bashrc; fi\n"
        'if [ -f "$HOME/.bashrc" ]; then . "$HOME/.bashrc"; fi\n'
    )
    return path


def lab_settings(config: NotebookConfig) -> Path:
    """Kiln's config dir for JupyterLab (its ``jupyter_server_config.json``): where there is bash, terminals run
    it with :func:`terminal_rcfile`; else JupyterLab's default shell (no banner)."""
    directory = config.work_dir / CONFIG_DIR
    directory.mkdir(mode=0o700, exist_ok=True)
    settings: dict[str, Any] = {}
    bash = shutil.which("bash")
    if bash is not None:
        shell = [bash, "--rcfile", str(terminal_rcfile(config)), "-i"]
        settings["ServerApp"] = {"terminado_settings": {"shell_command": shell}}
    (directory / "jupyter_server_config.json").write_text(json.dumps(settings, indent=1))
    return directory


def welcome(config: NotebookConfig) -> Path | None:
    """A new home's first notebook, its first cell saying what persists (never over a file of that name)."""
    path = config.home / WELCOME_FILE
    cell = {
        "cell_type": "markdown",
        "id": "kiln-welcome",  # nbformat 4.5: every cell has an id
        "metadata": {},
        "source": [f"## Welcome\n\n{banner(config)}\n\nDelete this notebook when you no longer need it."],
    }
    body = {"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except OSError:
        return None
    with os.fdopen(fd, "w") as fh:
        json.dump(body, fh, indent=1)
    return path


def lab_env(config: NotebookConfig, token: str) -> dict[str, str]:
    """JupyterLab's environment: its runtime files and Kiln's config dir in the work dir. The config dir comes
    after the user's own (``~/.jupyter`` is read first and wins) and before the image's. The token is written to
    ``TOKEN_FILE`` (0600, in the 0700 runtime dir) and named by ``$JUPYTER_TOKEN_FILE`` (jupyter_server 2.x reads
    it): not ``$JUPYTER_TOKEN``, which every kernel and terminal would inherit, nor argv, which the host's ``ps``
    shows to everyone."""
    runtime = config.work_dir / RUNTIME_DIR
    runtime.mkdir(mode=0o700, exist_ok=True)
    token_file = runtime / TOKEN_FILE
    token_file.unlink(missing_ok=True)  # never written through a link a previous run left
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token)  # no newline: jupyter_server takes the file's text as the token, whole
    paths = [str(lab_settings(config)), *filter(None, os.environ.get("JUPYTER_CONFIG_PATH", "").split(os.pathsep))]
    env = {k: v for k, v in os.environ.items() if k != "JUPYTER_TOKEN"}  # it would win over the file
    return {
        **env,
        "JUPYTER_RUNTIME_DIR": str(runtime),
        "JUPYTER_CONFIG_PATH": os.pathsep.join(paths),
        "JUPYTER_TOKEN_FILE": str(token_file),
    }


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


def lab_status(address: str | tuple[str, int], base_url: str, token: str | None) -> int | None:
    """The HTTP status of ``GET {base_url}api/status`` over the Unix socket ``address``, or TCP ``(host, port)``
    (None: nothing answers yet)."""
    conn: http.client.HTTPConnection
    if isinstance(address, tuple):
        conn = http.client.HTTPConnection(*address, timeout=PROBE_TIMEOUT)
    else:
        conn = _UnixConnection(address, PROBE_TIMEOUT)
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
    """``state`` as the state file in ``directory`` (kiln.injob.statefile: mode 0600, whole or not at all)."""
    return statefile.write_state(directory / STATE_FILE, state)


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
        welcome(config)
    else:
        written, skipped = restored
        say(f"notebook home restored: {written} entries")
        if skipped:
            say(f"notebook home: skipped {len(skipped)} entries of the stored home: {_said(skipped)}", error=True)
    link_inputs(config.home, config.work_dir)
    sync = HomeSync(config, home_signature(config.home, config.work_dir) if restored is not None else None)
    token = config.lab_token if config.port is not None else secrets.token_urlsafe(32)
    address = SOCKET_FILE if config.port is None else (config.probe_host, config.port)
    where: dict[str, Any] = {"socket": SOCKET_FILE, "token": token} if config.port is None else {"port": config.port}
    (config.work_dir / STATE_FILE).unlink(missing_ok=True)
    stop = _Stop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    child = subprocess.Popen(
        lab_command(config), cwd=config.work_dir, env=lab_env(config, token), stdin=subprocess.DEVNULL
    )
    stop.child = child
    if stop.requested:  # it came while JupyterLab was being started
        stop.terminate()
    state: Path | None = None
    while not stop.requested and child.poll() is None:
        if lab_status(address, config.base_url, token) == 200:
            state = write_state(config.work_dir, {**where, "pid": child.pid, "base_url": config.base_url})
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

"""``python -m kiln.injob.tensorboard``: the process a TensorBoard's job runs (``kiln tensorboard JOB…``). Standard
library only: it runs in the ``+tensorboard`` variant of a catalog runtime, with none of Kiln's dependencies.

Its config is the job's params, read from the JSON file ``$KILN_PARAMS_FILE``::

    {"notebook_id": "nb-…", "base_url": "/notebooks/nb-…/", "runs": "job-…=train,job-…=eval"}

with ``$KILN_WORK_DIR`` (the job's work dir, also the cwd), ``$KILN_ENDPOINT`` and ``$KILN_JOB_TOKEN`` (Kiln's
API, as this job).

1. It copies the event files of each job in ``runs`` into ``logs/<run>/`` of the work dir: ``GET
   /api/v1/notebooks/{id}/events`` lists what Kiln keeps of each job (the server copies a job's
   ``events.out.tfevents.*`` files into the store while it runs and when it ends), and ``GET
   …/events/{job}/{path}?offset=N`` sends what a file gained since the last copy (event files only grow), appended
   to the local copy. Again every ``PULL_SECONDS`` while any job has not ended, then every ``IDLE_PULL_SECONDS``.
2. TensorBoard (``tensorboard.main``) serves ``logs/`` on 127.0.0.1 of the job's own network namespace, under
   ``base_url`` (its ``--path_prefix``). Kiln's proxy reaches it through a Unix socket in the work dir,
   ``.kiln-notebook.sock`` (mode 0600), which this process relays to that port; once TensorBoard answers, the state
   file ``.kiln-notebook.json`` says where (as a notebook's launcher writes it: kiln.injob.notebook).
3. SIGTERM or SIGINT: TensorBoard gets SIGTERM, the state file is removed, exit 0. TensorBoard exiting on its own:
   its exit code is the job's. A bad config: exit 2.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote, urlsplit

from kiln.injob import statefile

STATE_FILE = ".kiln-notebook.json"
SOCKET_FILE = ".kiln-notebook.sock"
LOG_DIR = "logs"
EXIT_CONFIG = 2
PULL_SECONDS = 5.0
IDLE_PULL_SECONDS = 60.0
READY_POLL = 0.2
HTTP_TIMEOUT = 60.0
CHUNK = 1024 * 1024
NOTEBOOK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
BASE_URL = re.compile(r"/(?:[A-Za-z0-9._~-]+/)*")
JOB_ID = re.compile(r"job-[0-9a-z]{16}")
RUN_NAME = re.compile(r"(?!\.)[A-Za-z0-9._-]{1,128}")  # a directory name of the log dir: not . or ..
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "DELETED"}


def say(message: str) -> None:
    print(f"kiln: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Config:
    notebook_id: str
    base_url: str
    runs: dict[str, str]
    endpoint: str
    job_token: str
    work_dir: Path

    def url(self, tail: str) -> str:
        return f"{self.endpoint}/api/v1/notebooks/{quote(self.notebook_id)}/{tail}"


def read_config(env: Mapping[str, str]) -> Config:
    """The config from ``env`` and the params file it names; ValueError says what is wrong."""
    missing = [name for name in ("KILN_PARAMS_FILE", "KILN_ENDPOINT", "KILN_JOB_TOKEN") if not env.get(name)]
    if missing:
        raise ValueError(f"{', '.join(missing)} not set")
    try:
        params = json.loads(Path(env["KILN_PARAMS_FILE"]).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the params file {env['KILN_PARAMS_FILE']}: {exc}") from exc
    if not isinstance(params, dict):
        raise ValueError("the params file does not hold a JSON object")
    notebook_id, base_url, runs = params.get("notebook_id"), params.get("base_url"), params.get("runs")
    if not isinstance(notebook_id, str) or not NOTEBOOK_ID.fullmatch(notebook_id):
        raise ValueError(f"notebook_id: a notebook's id, got {notebook_id!r}")
    if not isinstance(base_url, str) or not BASE_URL.fullmatch(base_url):
        raise ValueError(f"base_url: a path starting and ending with '/', got {base_url!r}")
    if not isinstance(runs, str) or not runs:
        raise ValueError(f"runs: 'JOB=RUN,…' naming at least one job, got {runs!r}")
    pairs = [item.partition("=") for item in runs.split(",")]
    for job_id, _, run in pairs:
        if not JOB_ID.fullmatch(job_id) or not RUN_NAME.fullmatch(run):
            raise ValueError(f"runs: {job_id}={run} is not a job id and a run name")
    named = {job_id: run for job_id, _, run in pairs}
    if len(set(named.values())) != len(pairs):
        raise ValueError("runs: a job named twice, or two jobs with the same run name")
    endpoint = env["KILN_ENDPOINT"].rstrip("/")
    if urlsplit(endpoint).scheme not in ("http", "https"):
        raise ValueError(f"KILN_ENDPOINT: an http(s) URL, got {endpoint!r}")
    work_dir = Path(os.path.realpath(env.get("KILN_WORK_DIR") or os.getcwd()))
    if not work_dir.is_dir():
        raise ValueError(f"KILN_WORK_DIR: {work_dir} is not a directory")
    return Config(notebook_id, base_url, named, endpoint, env["KILN_JOB_TOKEN"], work_dir)


# --- the event files ---------------------------------------------------------------------------------------


def _get(config: Config, tail: str) -> http.client.HTTPResponse:
    parts = urlsplit(config.url(tail))
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.netloc, timeout=HTTP_TIMEOUT)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    conn.request("GET", path, headers={"Authorization": f"Bearer {config.job_token}"})
    response = conn.getresponse()
    if response.status != 200:
        detail = response.read(2000).decode("utf-8", "replace")
        conn.close()
        raise OSError(f"GET {parts.path}: {response.status} {detail}")
    return response


def local_name(run: str, path: str) -> Path | None:
    """Where a job's event file goes under the log dir: ``<run>/<path>``; None for a path that would leave it."""
    pure = PurePosixPath(path)
    if pure.is_absolute() or any(part in ("", ".", "..") for part in pure.parts) or "\x00" in path:
        return None
    if not pure.name.startswith("events.out.tfevents."):
        return None
    return Path(run, *pure.parts)


class Puller:
    """Copies what each job's event files gained into ``logs/`` (appends: event files only grow)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.root = config.work_dir / LOG_DIR
        self.said: set[str] = set()
        for run in config.runs.values():
            (self.root / run).mkdir(parents=True, exist_ok=True)  # every job is a run, even before it has files

    def pull(self) -> bool:
        """One round; True while some job has not ended (more may come)."""
        response = _get(self.config, "events")
        try:
            listing = json.loads(response.read())
        finally:
            response.close()
        going = False
        for source in listing.get("items", []):
            job_id = source.get("job_id")
            run = self.config.runs.get(job_id)
            if run is None:
                continue
            if source.get("state") not in TERMINAL:
                going = True
            for item in source.get("files", []):
                self._file(job_id, run, str(item.get("path")), int(item.get("size") or 0))
        return going

    def _file(self, job_id: str, run: str, path: str, size: int) -> None:
        name = local_name(run, path)
        if name is None:
            if path not in self.said:
                self.said.add(path)
                say(f"{job_id}: event file {path!r} skipped (not a plain relative path of an event file)")
            return
        target = self.root / name
        have = target.stat().st_size if target.is_file() else 0
        if size == have:
            return
        if size < have:  # replaced by a shorter one (a rerun wrote anew): start over
            target.unlink()
            have = 0
        target.parent.mkdir(parents=True, exist_ok=True)
        response = _get(self.config, f"events/{quote(job_id)}/{quote(path)}?offset={have}")
        try:
            with open(target, "ab") as out:
                while block := response.read(CHUNK):
                    out.write(block)
        finally:
            response.close()


def pull_forever(puller: Puller, stop: threading.Event) -> None:
    going = True
    while not stop.wait(PULL_SECONDS if going else IDLE_PULL_SECONDS):
        try:
            going = puller.pull()
        except (OSError, ValueError, http.client.HTTPException) as exc:
            say(f"reading the jobs' event files failed (tried again in {PULL_SECONDS:g}s): {exc}")


# --- TensorBoard and its socket ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tensorboard_command(config: Config, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tensorboard.main",
        f"--logdir={LOG_DIR}",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--path_prefix={config.base_url.rstrip('/')}",
        "--reload_interval=5",
        "--load_fast=false",  # the Python loader: no data server binary to start, the same on every machine
    ]


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while block := source.recv(65536):
            sink.sendall(block)
    except OSError:
        pass
    finally:
        for sock, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
            try:
                sock.shutdown(how)
            except OSError:
                pass


def _relay(client: socket.socket, port: int) -> None:
    try:
        upstream = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError:
        client.close()
        return
    upstream.settimeout(None)
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def serve_socket(listener: socket.socket, port: int) -> None:
    """Relay each connection to the Unix socket to TensorBoard's port, until the listener closes."""
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_relay, args=(client, port), daemon=True).start()


def unix_listener(name: str) -> socket.socket:
    """A Unix socket bound to ``name`` in the cwd, mode 0600 (the proxy is root; nothing else in the job's
    sandbox reaches TensorBoard through it)."""
    Path(name).unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(name)
    finally:
        os.umask(old)
    os.chmod(name, 0o600)
    listener.listen(64)
    return listener


def answers(port: int, base_url: str) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", f"{base_url}data/environment")
        response = conn.getresponse()
        response.read()
        return response.status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def main() -> int:
    try:
        config = read_config(os.environ)
    except ValueError as exc:
        say(f"tensorboard: {exc}")
        return EXIT_CONFIG
    os.chdir(config.work_dir)
    stopping = threading.Event()

    def stop(signum: int, frame: object) -> None:
        stopping.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    (config.work_dir / STATE_FILE).unlink(missing_ok=True)
    say(f"tensorboard over {len(config.runs)} job(s): " + ", ".join(f"{r} ({j})" for j, r in config.runs.items()))
    puller = Puller(config)
    try:
        puller.pull()
    except (OSError, ValueError, http.client.HTTPException) as exc:
        say(f"reading the jobs' event files failed (tried again in {PULL_SECONDS:g}s): {exc}")
    threading.Thread(target=pull_forever, args=(puller, stopping), daemon=True).start()
    port = free_port()
    child = subprocess.Popen(tensorboard_command(config, port), cwd=config.work_dir, stdin=subprocess.DEVNULL)
    listener = unix_listener(SOCKET_FILE)
    threading.Thread(target=serve_socket, args=(listener, port), daemon=True).start()
    state: Path | None = None
    while not stopping.is_set() and child.poll() is None:
        if state is None and answers(port, config.base_url):
            state_value: dict[str, Any] = {
                "socket": SOCKET_FILE,
                "token": secrets.token_urlsafe(32),  # TensorBoard checks none: the socket's mode is the lock
                "pid": child.pid,
                "base_url": config.base_url,
            }
            state = statefile.write_state(config.work_dir / STATE_FILE, state_value)
            say("tensorboard ready")
        time.sleep(READY_POLL)
    if state is not None:
        state.unlink(missing_ok=True)
    listener.close()
    if stopping.is_set():
        child.terminate()
        try:
            child.wait(5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        return 0
    code = exit_status(child.wait())
    say(f"tensorboard exited with {code}")
    return code or 1


if __name__ == "__main__":
    sys.exit(main())

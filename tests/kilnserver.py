"""Start real Kiln servers as subprocesses for tests (a helper module, not a fake)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import psutil

from kiln.sdk.client import Client
from kiln.sdk.config import read_config_file

if TYPE_CHECKING:
    from tests.slurm_cluster import SlurmCluster

REPO = Path(__file__).resolve().parent.parent
TEST_RUNTIMES = REPO / ".cache" / "test-runtimes"
# The interpreter the tests run with (a venv, and the installation it was made from): what their jobs name as
# runtime.python, allowed on every test server as an operator would allow it.
TEST_PYTHON_ROOTS = sorted({sys.prefix, sys.base_prefix})


MIGRATIONS = REPO / "src" / "kiln" / "db" / "migrations" / "versions"
TEST_DATABASES = REPO / ".cache" / "test-db"


def migrated_sqlite() -> Path:
    """A SQLite database migrated to head and holding nothing else, made once per machine for this set of
    migrations (``.cache/test-db``, named by their digest): a test server's new home starts with a copy, so that
    the suite's hundreds of servers do not each run every migration on an empty database (2 to 4 CPU-seconds
    each). The migrations themselves run from an empty database, and with rows in every table, in
    tests/integration/database/ and tests/unit/db/."""
    digest = hashlib.sha256()
    for path in sorted(MIGRATIONS.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    target = TEST_DATABASES / f"{digest.hexdigest()[:16]}.db"
    if target.exists():
        return target
    from kiln.db.migrate import upgrade
    from kiln.db.session import Database

    TEST_DATABASES.mkdir(parents=True, exist_ok=True)
    work = TEST_DATABASES / f"{target.stem}.{os.getpid()}.work"
    database = Database(f"sqlite:///{work}")
    try:
        upgrade(database.engine)
    finally:
        database.dispose()
    copy = work.with_suffix(".tmp")
    with sqlite3.connect(work) as source, sqlite3.connect(copy) as into:
        source.backup(into)  # one self-contained file, whatever the journal mode left beside it
    os.replace(copy, target)  # workers that made it at once each put a whole one in place
    for leftover in TEST_DATABASES.glob(f"{work.name}*"):
        leftover.unlink()
    return target


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class KilnServer:
    """One ``kiln server`` process with its own $KILN_HOME."""

    migrated_copy = True  # a new home's database starts as a copy of migrated_sqlite() (this code's migrations)

    def __init__(self, home: Path, database_url: str | None = None, **settings: str) -> None:
        self.home = home
        self.port = free_port()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
        self.env.update(
            {
                "KILN_HOME": str(home),
                "KILN_PORT": str(self.port),
                "KILN_RUNTIMES_DIR": str(TEST_RUNTIMES),
                "KILN_KILL_GRACE_SECONDS": "3",
                "KILN_RECONCILE_INTERVAL": "0.2",
                "KILN_ALLOWED_PYTHON_ROOTS": json.dumps(TEST_PYTHON_ROOTS),
                # A server that never gets ready is sent SIGABRT (below): Python then writes every thread's stack
                # to the log, which says where it hung.
                "PYTHONFAULTHANDLER": "1",
            }
        )
        if database_url:
            self.env["KILN_DATABASE_URL"] = database_url
        for key, value in settings.items():
            self.env[f"KILN_{key.upper()}"] = str(value)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = home.parent / f"{home.name}-server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120) -> KilnServer:
        """Start and wait for /readyz: on a loaded two-CPU machine a server's start (migrations, imports, the
        sandbox probe) has taken over 30 s."""
        self.home.mkdir(parents=True, exist_ok=True)
        database = self.home / "kiln.db"  # the server's own (Settings.database_url's default)
        if self.migrated_copy and "KILN_DATABASE_URL" not in self.env and not database.exists():
            shutil.copyfile(migrated_sqlite(), database)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kiln.api.serve"], env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kiln server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self._abort()
        raise RuntimeError(f"kiln server not ready after {timeout}s:\n{self.log()}")

    def _abort(self) -> None:
        """SIGABRT a server that hangs: its fault handler writes the stack of every thread to the log."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGABRT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-12000:]
        except OSError:
            return ""

    def credentials(self) -> dict[str, str]:
        return read_config_file(self.home / "admin.env")

    def client(self) -> Client:
        creds = self.credentials()
        return Client(self.url, creds["KILN_ACCESS_KEY"], creds["KILN_SECRET_KEY"])

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks run (the crash case)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, jobs: bool = True) -> None:
        """Stop the server and (``jobs``) what it left running: the shims outlive a server by design, and a
        test's leftover jobs would otherwise compete with the next tests for the CPUs until their timeouts."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        if jobs:
            self.stop_jobs()

    def stop_jobs(self) -> None:
        """SIGTERM every shim still running under this home (each cancels its job), SIGKILL them after a few
        seconds, then unmount what a killed one left mounted (its /dev/shm and /tmp)."""
        shims: list[psutil.Process] = []
        # Each attempt's and each member's shim.pid, named: a recursive glob walked into the scratch dirs the shims
        # were removing meanwhile and failed on a directory gone between listing and reading.
        pid_files = [
            *self.home.glob("jobs/*/attempts/*/shim.pid"),
            *self.home.glob("jobs/*/attempts/*/members/*/shim.pid"),
        ]
        for pid_file in pid_files:
            try:
                info = json.loads(pid_file.read_text())
                proc = psutil.Process(int(info["pid"]))
                if abs(proc.create_time() - float(info.get("create_time") or 0)) < 1.0:
                    proc.terminate()
                    shims.append(proc)
            except (OSError, ValueError, KeyError, psutil.Error):
                continue
        _, alive = psutil.wait_procs(shims, timeout=8)
        for proc in alive:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=5)
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4]
            if point.startswith(str(self.home) + "/"):
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)


class SlurmServer(KilnServer):
    """A Kiln server whose jobs run on the Slurm test cluster (tests/slurm_cluster.py): ``KILN_BACKEND=slurm``, the
    cluster's ``SLURM_CONF``, listening on the cluster's bridge, where the nodes reach it; the nodes' Python is
    this interpreter (the nodes see this machine's files)."""

    def __init__(self, home: Path, cluster: SlurmCluster, **settings: str) -> None:
        scratch, logs = home.parent / "slurm-scratch", home.parent / "slurm-logs"
        scratch.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        super().__init__(
            home,
            backend="slurm",
            host=cluster.bridge_address,
            slurm_python=sys.executable,
            slurm_scratch_dir=str(scratch),
            slurm_log_dir=str(logs),
            **settings,
        )
        self.env["KILN_PUBLIC_ENDPOINT"] = self.url
        self.env["SLURM_CONF"] = str(cluster.conf_path)
        self.scratch = scratch

    @property
    def url(self) -> str:
        return f"http://{self.env['KILN_HOST']}:{self.port}"

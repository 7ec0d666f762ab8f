"""A private, throwaway PostgreSQL cluster that a test may stop and start (a helper module, not a fake).

The shared PostgreSQL at 127.0.0.1:5432 serves every other test and must never go down: a test of what Kiln does
when its database goes away runs its own cluster (``initdb`` into a temporary directory, its own port and socket
directory, ``fsync=off``) and stops it with ``pg_ctl`` as an operator or a crash would."""

from __future__ import annotations

import os
import pwd
import random
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

PG_BIN = Path(os.environ.get("KILN_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
PG_USER = "postgres"


def port_outside_the_ephemeral_range() -> int:
    """A free port that no ``bind(0)`` (every other test's free_port) and no outgoing connection is given: the
    cluster keeps its port while it is stopped, and another test's server must not take it meanwhile."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(100):
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port below {low} for a private PostgreSQL cluster")


def pg_cluster_problem() -> str | None:
    """None when a private cluster can be made here (the binaries, and a ``postgres`` user to run them), else why
    not."""
    if not (PG_BIN / "initdb").exists():
        return f"no PostgreSQL server binaries at {PG_BIN} (KILN_TEST_PG_BIN)"
    try:
        pwd.getpwnam(PG_USER)
    except KeyError:
        return f"no {PG_USER!r} user to run a private PostgreSQL cluster as"
    if os.geteuid() != 0 and pwd.getpwuid(os.geteuid()).pw_name != PG_USER:
        return "a private PostgreSQL cluster is run as the postgres user: run the tests as root or as postgres"
    return None


class PgCluster:
    """One cluster in its own directory: ``start``, ``stop(mode)``, ``url`` (for Kiln) and ``remove``."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="kiln-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "postgres.log"
        self.port = port_outside_the_ephemeral_range()
        user = pwd.getpwnam(PG_USER)
        os.chown(self.dir, user.pw_uid, user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", PG_USER, "--no-sync")

    def _run(self, tool: str, *args: str) -> None:
        command = [str(PG_BIN / tool), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", PG_USER, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stdout}{done.stderr}\n{self.log_tail()}")

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{PG_USER}@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.log), "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """``immediate``: the server processes exit at once, as in a crash (recovery on the next start);
        ``fast``: open transactions are rolled back and connections closed, as in an operator's restart."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def remove(self) -> None:
        if self.running():
            try:
                self.stop("immediate")
            except RuntimeError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)

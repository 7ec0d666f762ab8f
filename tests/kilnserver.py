"""Start real Kiln servers as subprocesses for tests (a helper module, not a fake)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from kiln.sdk.client import Client
from kiln.sdk.config import read_config_file

REPO = Path(__file__).resolve().parent.parent
TEST_RUNTIMES = REPO / ".cache" / "test-runtimes"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class KilnServer:
    """One ``kiln server`` process with its own $KILN_HOME."""

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

    def start(self, timeout: float = 30) -> KilnServer:
        self.home.mkdir(parents=True, exist_ok=True)
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
        raise RuntimeError(f"kiln server not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
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

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

"""The notebook launcher (``python -m kiln.injob.notebook``) with the real JupyterLab, run by the interpreter of
an environment that has ``jupyterlab`` (the ``lab_python`` fixture), against a fake of Kiln's home endpoints on
127.0.0.1: the stored home restored, JupyterLab on the Unix socket only (no TCP port), its token required, the
state file, and the home saved by the final sync after SIGTERM."""

from __future__ import annotations

import http.client
import io
import json
import os
import signal
import socket
import stat
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kiln.injob import notebook
from tests.kilnserver import TEST_RUNTIMES, KilnServer
from tests.unit.test_injob_notebook import BASE_URL, JOB_TOKEN, NOTEBOOK_ID, SRC, FakeHomeApi, make_tar


@pytest.fixture(scope="module")
def lab_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The python runtime's ``+lab`` variant (what a notebook on the python runtime runs in), from the test
    runtimes, built through a Kiln server (``kiln runtimes install``) where it is not yet."""
    python = TEST_RUNTIMES / "python-3+lab" / "bin" / "python"
    if not (TEST_RUNTIMES / "python-3+lab" / ".kiln-ready").exists():
        server = KilnServer(tmp_path_factory.mktemp("lab-runtime") / "home").start()
        try:
            with server.client() as client:
                client.install_runtime("python", "3+lab")
                client.wait_runtime("python-3+lab", timeout=600)
        finally:
            server.stop()
    return str(python)


@pytest.fixture
def api() -> Iterator[FakeHomeApi]:
    fake = FakeHomeApi()
    yield fake
    fake.close()


class UnixConnection(http.client.HTTPConnection):
    """HTTP over the socket's file, named through the work dir's descriptor (its path may exceed 108 bytes)."""

    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=10)
        self.socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def lab_request(
    sock: str, path: str, method: str = "GET", token: str | None = None, body: dict[str, Any] | None = None
) -> http.client.HTTPResponse:
    conn = UnixConnection(sock)
    headers = {"Authorization": f"token {token}"} if token else {}
    if body is not None:
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    response = conn.getresponse()
    response.read()
    conn.close()
    return response


def tcp_listeners(pid: int) -> list[str]:
    """The TCP sockets of ``pid`` that listen (state 0A in /proc/net/tcp and tcp6)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                listening.append(fields[1])
    return listening


@pytest.mark.timeout(900)  # the python runtime's +lab variant may be built first (about 40 s; more on a loaded machine)
def test_jupyterlab_serves_the_restored_home_on_its_socket_and_the_home_is_saved_on_stop(
    lab_python: str, api: FakeHomeApi, tmp_path: Path
) -> None:
    notebook_json = json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}).encode()
    api.stored = make_tar(("file", "restored.txt", b"from last time"), ("file", "work/old.ipynb", notebook_json))
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / ("w" * 80) / "work"  # longer than a socket address holds
    work.mkdir(parents=True)
    params = tmp_path / "params.json"
    params.write_text(json.dumps({"notebook_id": NOTEBOOK_ID, "base_url": BASE_URL, "sync_seconds": 60}))
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("KILN_", "JUPYTER"))}
    environ.update(
        HOME=str(home),
        KILN_WORK_DIR=str(work),
        KILN_PARAMS_FILE=str(params),
        KILN_ENDPOINT=api.url,
        KILN_JOB_TOKEN=JOB_TOKEN,
        KILN_JOB_ID="job-1",
        PYTHONPATH=SRC,
    )
    proc = subprocess.Popen(
        [lab_python, "-m", "kiln.injob.notebook"],
        cwd=work,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    work_fd = os.open(work, os.O_PATH | os.O_DIRECTORY)
    try:
        state_file = work / notebook.STATE_FILE
        deadline = time.monotonic() + 60
        while not state_file.exists():
            assert proc.poll() is None, f"the launcher exited {proc.returncode}: {proc.communicate()[0]}"
            assert time.monotonic() < deadline, "JupyterLab was not ready within 60 s"
            time.sleep(0.1)
        state = json.loads(state_file.read_text())
        assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
        assert (home / "restored.txt").read_text() == "from last time"
        sock = f"/proc/self/fd/{work_fd}/{state['socket']}"
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        assert tcp_listeners(state["pid"]) == [], "JupyterLab must not listen on TCP"
        token = state["token"]

        assert lab_request(sock, f"{BASE_URL}api/status", token=token).status == 200
        assert lab_request(sock, f"{BASE_URL}api/status").status == 403
        assert lab_request(sock, f"{BASE_URL}api/contents").status == 403
        login = lab_request(sock, f"{BASE_URL}lab")
        assert login.status == 302 and (login.getheader("Location") or "").startswith(f"{BASE_URL}login")
        assert lab_request(sock, f"{BASE_URL}lab", token=token).status == 200
        # The token in the Authorization header makes a request "token-authenticated": no _xsrf cookie needed.
        created = lab_request(
            sock,
            f"{BASE_URL}api/contents/made-in-lab.txt",
            "PUT",
            token=token,
            body={"type": "file", "format": "text", "content": "saved through JupyterLab"},
        )
        assert created.status == 201
        (home / "work" / "written.txt").write_text("written in a terminal")

        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    finally:
        os.close(work_fd)
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0, output
    assert not state_file.exists()
    assert "kiln: notebook home saved" in output.splitlines()[-1], output[-2000:]
    names = api.names()
    assert {"restored.txt", "made-in-lab.txt", "work/old.ipynb", "work/written.txt"} <= set(names), names
    assert not [name for name in names if name.startswith((".local/share/jupyter/runtime", ".cache"))], names
    with tarfile.open(fileobj=io.BytesIO(api.saved[-1])) as tar:
        member = tar.extractfile("made-in-lab.txt")
        assert member is not None and member.read() == b"saved through JupyterLab"

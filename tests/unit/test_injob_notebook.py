"""The notebook launcher (``python -m kiln.injob.notebook``) without JupyterLab: the home's safe extraction (with
and without tarfile's "data" filter), its signature and archive, the saves and restores against a fake of Kiln's
home endpoints on 127.0.0.1, and the launcher as a real process with a fake ``jupyterlab`` module (a Unix-socket
HTTP server answering ``api/status``): ready, state file, periodic saves, a refused save, SIGTERM, JupyterLab
exiting on its own or never getting ready, a home that cannot be restored. The real JupyterLab runs in
tests/integration/notebooks/test_notebook_launcher.py."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kiln.injob import notebook, notebook_home
from kiln.injob.notebook import NotebookConfig

SRC = str(Path(notebook.__file__).resolve().parents[2])
JOB_TOKEN = "job-token-1"
NOTEBOOK_ID = "nb-test1"
BASE_URL = f"/notebooks/{NOTEBOOK_ID}/"


# --- a gzip'd tar to restore -----------------------------------------------------------------------------------


def make_tar(*entries: tuple[str, str, Any]) -> bytes:
    """A gzip'd tar of ``(kind, name, value)``: ``file`` (bytes), ``dir``, ``symlink`` (target), ``hardlink``
    (target), ``chr`` (a device), ``fifo``."""
    kinds = {
        "file": tarfile.REGTYPE,
        "dir": tarfile.DIRTYPE,
        "symlink": tarfile.SYMTYPE,
        "hardlink": tarfile.LNKTYPE,
        "chr": tarfile.CHRTYPE,
        "fifo": tarfile.FIFOTYPE,
    }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for kind, name, value in entries:
            info = tarfile.TarInfo(name)
            info.type = kinds[kind]
            info.mtime = 1_700_000_000
            info.mode = 0o755 if kind == "dir" else 0o644
            if kind in ("symlink", "hardlink"):
                info.linkname = value
            if kind == "chr":
                info.devmajor, info.devminor = 1, 3
            if kind == "file":
                info.size = len(value)
                tar.addfile(info, io.BytesIO(value))
            else:
                tar.addfile(info)
    return out.getvalue()


@pytest.fixture(params=["data-filter", "own-checks-only"])
def extraction(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each extraction test twice: with tarfile's "data" filter, and as on a Python before 3.11.4 without it."""
    if request.param == "own-checks-only":
        monkeypatch.delattr(tarfile, "data_filter")
    return str(request.param)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the home that a hostile archive tries to write into."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "victim").write_text("untouched")
    return path


def extract(home: Path, data: bytes) -> tuple[int, list[str]]:
    return notebook.extract_home(io.BytesIO(data), home)


def skipped_names(skipped: list[str]) -> list[str]:
    return [line.split(":", 1)[0] for line in skipped]


def test_a_home_is_restored_with_its_files_dirs_links_and_times(home: Path, extraction: str) -> None:
    data = make_tar(
        ("dir", "work", None),
        ("file", "work/train.ipynb", b"{}"),
        ("file", "./notes.txt", b"hello"),
        ("symlink", "work/latest", "train.ipynb"),
        ("symlink", "up", "work/../notes.txt"),
        ("file", "deep/er/x.py", b"print(1)\n"),
    )
    written, skipped = extract(home, data)
    assert skipped == [] and written == 6
    assert (home / "notes.txt").read_bytes() == b"hello"
    assert (home / "work" / "train.ipynb").stat().st_mtime == 1_700_000_000
    assert os.readlink(home / "work" / "latest") == "train.ipynb"
    assert (home / "up").read_text() == "hello"
    assert (home / "deep" / "er" / "x.py").read_text() == "print(1)\n"


def test_names_that_leave_the_home_are_refused(home: Path, outside: Path, extraction: str) -> None:
    data = make_tar(
        ("file", "../outside/victim", b"owned"),
        ("file", "/abs-kiln-notebook-test", b"owned"),
        ("file", "a/../../outside/victim", b"owned"),
        ("file", "fine.txt", b"ok"),
    )
    written, skipped = extract(home, data)
    assert skipped_names(skipped) == ["../outside/victim", "/abs-kiln-notebook-test", "a/../../outside/victim"]
    assert written == 1 and (home / "fine.txt").read_text() == "ok"
    assert (outside / "victim").read_text() == "untouched"
    assert not Path("/abs-kiln-notebook-test").exists()


def test_a_link_out_of_the_home_is_refused_and_never_written_through(
    home: Path, outside: Path, extraction: str
) -> None:
    data = make_tar(
        ("symlink", "etc", "/etc"),
        ("file", "etc/kiln-notebook-test", b"owned"),
        ("symlink", "out", "../outside"),
        ("file", "out/victim", b"owned"),
        ("symlink", "sub/esc", "../../outside/victim"),
        ("symlink", "nothing", ""),
    )
    written, skipped = extract(home, data)
    assert skipped_names(skipped) == ["etc", "out", "sub/esc", "nothing"]
    assert "absolute" in skipped[0] and "out of the home" in skipped[1]
    assert not Path("/etc/kiln-notebook-test").exists()
    assert (outside / "victim").read_text() == "untouched"
    # The refused links were not made, so the files under their names are plain files in the home.
    assert not (home / "etc").is_symlink() and (home / "etc" / "kiln-notebook-test").read_text() == "owned"
    assert (home / "out" / "victim").read_text() == "owned"
    assert written == 2


def test_a_link_already_in_the_home_is_replaced_never_followed(home: Path, outside: Path, extraction: str) -> None:
    (home / "linkdir").symlink_to(outside)
    (home / "linkfile").symlink_to(outside / "victim")
    data = make_tar(
        ("file", "linkdir/victim", b"owned"),  # through a link on its path: refused
        ("file", "linkfile", b"mine"),  # a link in its place: the link is replaced
    )
    written, skipped = extract(home, data)
    assert (outside / "victim").read_text() == "untouched"
    if extraction == "data-filter":  # its check resolves the link there now: it refuses the member
        assert skipped_names(skipped) == ["linkdir/victim", "linkfile"] and written == 0
        assert (home / "linkfile").is_symlink()
    else:
        assert skipped_names(skipped) == ["linkdir/victim"] and written == 1
        assert not (home / "linkfile").is_symlink() and (home / "linkfile").read_text() == "mine"


def test_devices_fifos_and_hard_links_are_refused(home: Path, extraction: str) -> None:
    data = make_tar(
        ("file", "a.txt", b"a"),
        ("chr", "null", None),
        ("fifo", "pipe", None),
        ("hardlink", "b.txt", "a.txt"),
    )
    written, skipped = extract(home, data)
    assert written == 1
    assert skipped_names(skipped) == ["null", "pipe", "b.txt"]
    assert [why.split(": ", 1)[1] for why in skipped] == ["a device", "a fifo", "a hard link"]
    assert sorted(p.name for p in home.iterdir()) == ["a.txt"]


def test_modes_lose_setuid_and_group_write(home: Path, extraction: str) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        info = tarfile.TarInfo("tool")
        info.mode, info.size = 0o6777, 2
        tar.addfile(info, io.BytesIO(b"#!"))
    extract(home, out.getvalue())
    assert stat.S_IMODE((home / "tool").stat().st_mode) == 0o755


def test_a_stream_that_is_not_a_gzipped_tar_raises(home: Path) -> None:
    with pytest.raises(tarfile.TarError):
        extract(home, b"not a tar at all")
    with pytest.raises((tarfile.TarError, EOFError)):
        extract(home, make_tar(("file", "big", os.urandom(100_000)))[:50_000])


# --- the home's signature and archive -------------------------------------------------------------------------


def test_the_signature_changes_with_the_home_but_not_with_what_is_not_saved(home: Path) -> None:
    (home / "a.txt").write_text("1")
    for excluded in notebook.NOT_SAVED:  # their parents (.local/share, .npm) are the home's
        (home / excluded).parent.mkdir(parents=True, exist_ok=True)
    first = notebook.home_signature(home)
    assert notebook.home_signature(home) == first
    for excluded in notebook.NOT_SAVED:
        (home / excluded).mkdir(exist_ok=True)
        (home / excluded / "junk").write_text("x")
    assert notebook.home_signature(home) == first, "caches and runtime files count for nothing"
    os.utime(home / "a.txt", ns=(1, 1))
    second = notebook.home_signature(home)
    assert second != first
    (home / "a.txt").write_text("22")
    os.utime(home / "a.txt", ns=(1, 1))
    assert notebook.home_signature(home) != second, "same mtime, other size"
    third = notebook.home_signature(home)
    (home / "empty-dir").mkdir()
    assert notebook.home_signature(home) != third
    fourth = notebook.home_signature(home)
    (home / "link").symlink_to("a.txt")
    assert notebook.home_signature(home) != fourth
    (home / ".ipynb_checkpoints").mkdir()
    assert notebook.home_signature(home) != fourth


def test_the_archive_holds_the_home_and_round_trips(tmp_path: Path, home: Path) -> None:
    (home / "work").mkdir()
    (home / "work" / "a.ipynb").write_text("{}")
    (home / "tool").write_text("#!")
    (home / "tool").chmod(0o755)
    for path in (home / "work" / "a.ipynb", home / "tool"):
        os.utime(path, (1_700_000_000, 1_700_000_000))
    (home / "link").symlink_to("/etc/passwd")  # kept as the link it is, never followed
    (home / "empty").mkdir()
    (home / ".cache" / "pip").mkdir(parents=True)
    (home / ".cache" / "pip" / "wheel").write_bytes(b"w")
    os.mkfifo(home / "fifo")
    work_dir = home / "jobwork"  # a work dir inside the home (its state file holds the token): left out
    work_dir.mkdir()
    (work_dir / notebook.STATE_FILE).write_text("{}")
    archive = tmp_path / "home.tar.gz"
    assert notebook.build_archive(home, archive, work_dir) == []
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert sorted(members) == ["empty", "link", "tool", "work", "work/a.ipynb"]
    assert members["link"].issym() and members["link"].linkname == "/etc/passwd"
    assert members["tool"].uid == 0 and members["tool"].uname == ""
    restored = tmp_path / "restored"
    restored.mkdir()
    with archive.open("rb") as fh:
        written, skipped = notebook.extract_home(fh, restored)
    assert written == 4 and skipped_names(skipped) == ["link"]  # a link out of the home is not restored
    assert (restored / "work" / "a.ipynb").read_text() == "{}"
    assert stat.S_IMODE((restored / "tool").stat().st_mode) == 0o755
    (restored / "link").symlink_to("/etc/passwd")
    assert notebook.home_signature(restored) == notebook.home_signature(home, work_dir)


def test_a_file_that_shrinks_while_it_is_archived_does_not_break_the_archive(tmp_path: Path) -> None:
    source = io.BytesIO(b"abc")
    padded = notebook_home._Exactly(source, 6)
    assert padded.read(4) + padded.read(4) + padded.read(4) == b"abc\0\0\0"


# --- Kiln's home endpoints (a fake) ----------------------------------------------------------------------------


class FakeHomeApi:
    """A fake of Kiln's ``/api/v1/notebooks/{id}/home`` on 127.0.0.1: GET answers ``stored`` (gzip'd tar bytes;
    None: 204) or ``get_status``; PUT bodies are appended to ``saved``; ``put_answers`` are the statuses of the
    next PUTs (then 204); a 413 is answered before the body is read, as Kiln decides it on Content-Length."""

    def __init__(self, stored: bytes | None = None, get_status: int = 200, put_answers: tuple[int, ...] = ()) -> None:
        self.stored, self.get_status, self.put_answers = stored, get_status, list(put_answers)
        self.saved: list[bytes] = []
        self.refused = 0
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _authorised(self) -> bool:
                if (
                    self.path != f"/api/v1/notebooks/{NOTEBOOK_ID}/home"
                    or self.headers.get("Authorization") != f"Bearer {JOB_TOKEN}"
                ):
                    self._answer(401, {"code": "unauthenticated", "message": "who are you"})
                    return False
                return True

            def _answer(self, status: int, body: dict[str, str] | bytes | None = None) -> None:
                data = json.dumps(body).encode() if isinstance(body, dict) else body or b""
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if not self._authorised():
                    return
                if api.get_status != 200:
                    self._answer(api.get_status, {"code": "internal", "message": "the store is down"})
                else:
                    self._answer(200 if api.stored is not None else 204, api.stored)

            def do_PUT(self) -> None:
                length = int(self.headers["Content-Length"])
                if not self._authorised():
                    return
                answer = api.put_answers.pop(0) if api.put_answers else 204
                if answer == 413:
                    api.refused += 1
                    self._answer(413, {"code": "payload_too_large", "message": "over the storage quota"})
                    self.wfile.flush()
                    while self.rfile.read(65536):  # drained, as a server lingers before it closes
                        pass
                    self.close_connection = True
                    return
                assert self.headers["Content-Type"] == "application/gzip"
                api.saved.append(self.rfile.read(length))
                self._answer(answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def names(self, index: int = -1) -> list[str]:
        with tarfile.open(fileobj=io.BytesIO(self.saved[index])) as tar:
            return sorted(tar.getnames())

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api() -> Iterator[FakeHomeApi]:
    fake = FakeHomeApi()
    yield fake
    fake.close()


def config_for(api: FakeHomeApi, home: Path, work_dir: Path) -> NotebookConfig:
    return NotebookConfig(NOTEBOOK_ID, BASE_URL, 60.0, api.url, JOB_TOKEN, home, work_dir)


def test_a_stored_home_is_restored_and_an_empty_store_is_none(api: FakeHomeApi, tmp_path: Path, home: Path) -> None:
    config = config_for(api, home, tmp_path)
    assert notebook.restore_home(config) is None
    api.stored = make_tar(("file", "notes.txt", b"hi"))
    assert notebook.restore_home(config) == (1, [])
    assert (home / "notes.txt").read_text() == "hi"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"get_status": 500}, "HTTP 500 the store is down"),
        ({"token": "wrong"}, "HTTP 401 who are you"),
        ({"stored": b"garbage"}, "restoring the stored home: ReadError: not a gzip file"),
        ({"endpoint": "http://127.0.0.1:9"}, "ConnectionRefusedError"),
    ],
)
def test_a_home_that_cannot_be_restored_says_why(
    api: FakeHomeApi, tmp_path: Path, home: Path, change: dict[str, Any], expected: str
) -> None:
    api.get_status = change.get("get_status", 200)
    api.stored = change.get("stored", b"")
    config = NotebookConfig(
        NOTEBOOK_ID, BASE_URL, 60, change.get("endpoint", api.url), change.get("token", JOB_TOKEN), home, tmp_path
    )
    with pytest.raises(notebook.HomeUnavailable, match=expected):
        notebook.restore_home(config)


def test_an_upload_refused_before_its_body_is_sent_still_reads_the_answer(api: FakeHomeApi, tmp_path: Path) -> None:
    archive = tmp_path / "big.tar.gz"
    archive.write_bytes(os.urandom(32 * 1024 * 1024))  # far more than the socket buffers hold
    api.put_answers = [413]
    why = notebook.upload_home(config_for(api, tmp_path, tmp_path), archive)
    assert why == "HTTP 413 over the storage quota"
    assert notebook.upload_home(config_for(api, tmp_path, tmp_path), archive) is None
    assert api.saved[-1] == archive.read_bytes()


def test_the_sync_saves_only_a_changed_home_and_retries_a_refused_save(
    api: FakeHomeApi, tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work_dir = tmp_path / "work"
    work_dir.mkdir()
    sync = notebook.HomeSync(config_for(api, home, work_dir), saved=None)
    assert sync.run() == "saved" and len(api.saved) == 1 and api.names() == []  # a new notebook: its empty home
    assert sync.run() == "unchanged" and len(api.saved) == 1
    (home / "model.py").write_text("x = 1")
    api.put_answers = [413]
    assert sync.run() == "failed"
    assert "kiln: notebook home not saved: HTTP 413 over the storage quota" in capsys.readouterr().err
    api.put_answers = [500]
    assert sync.run() == "failed"
    assert "kiln: notebook home not saved: HTTP 500 Internal Server Error" in capsys.readouterr().err
    assert sync.run() == "saved" and api.names() == ["model.py"]
    assert list(work_dir.iterdir()) == [], "the archive is removed after each try"


# --- the launcher as a process, with a fake jupyterlab ---------------------------------------------------------

FAKE_LAB = '''
"""A fake ``python -m jupyterlab`` for the launcher's tests: answers GET {base_url}api/status with 200 to its
token (403 otherwise) on its Unix socket (or, with --ServerApp.port, TCP on 127.0.0.1); FAKE_LAB_EXIT=N: exits
N after 0.5 s; FAKE_LAB_NEVER_READY: answers 503; FAKE_LAB_IGNORE_TERM: ignores SIGTERM."""
import json, os, signal, socketserver, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = dict(arg[2:].split("=", 1) for arg in sys.argv[1:] if "=" in arg)
with open("fake-lab-argv.json", "w") as fh:
    json.dump(sys.argv[1:], fh)
token, base = open(os.environ["JUPYTER_TOKEN_FILE"]).read(), args["ServerApp.base_url"]

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == base + "api/status" and self.headers.get("Authorization") == "token " + token
        status = 503 if os.environ.get("FAKE_LAB_NEVER_READY") else 200 if ok else 403
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

if os.environ.get("FAKE_LAB_IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *a: (open("fake-lab-terminated", "w").close(), os._exit(0)))
if os.environ.get("FAKE_LAB_EXIT"):
    threading.Timer(0.5, lambda: os._exit(int(os.environ["FAKE_LAB_EXIT"]))).start()
time.sleep(float(os.environ.get("FAKE_LAB_DELAY", "0.3")))  # not ready at once: the launcher polls
if "ServerApp.port" in args:
    server = ThreadingHTTPServer(("127.0.0.1", int(args["ServerApp.port"])), Handler)
else:
    server = Server(args["ServerApp.sock"], Handler)
    os.chmod(args["ServerApp.sock"], int(args["ServerApp.sock_mode"], 8))
print("fake jupyterlab serving", flush=True)
server.serve_forever()
'''


class Launcher:
    """One ``python -m kiln.injob.notebook`` with the fake jupyterlab, its work dir's path longer than a socket
    address holds (108 bytes)."""

    def __init__(
        self, root: Path, api: FakeHomeApi, sync_seconds: float = 60, params: dict[str, Any] | None = None, **env: str
    ) -> None:
        fake = root / "fakelab"
        (fake / "jupyterlab").mkdir(parents=True)
        (fake / "jupyterlab" / "__init__.py").write_text("")
        (fake / "jupyterlab" / "__main__.py").write_text(FAKE_LAB)
        self.home = root / "home"
        self.home.mkdir()
        self.work = root / ("w" * 60) / ("o" * 60) / "work"
        self.work.mkdir(parents=True)
        params_file = root / "params.json"
        config = {"notebook_id": NOTEBOOK_ID, "base_url": BASE_URL, "sync_seconds": sync_seconds, **(params or {})}
        params_file.write_text(json.dumps(config))
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("KILN_", "FAKE_LAB_"))}
        environ.update(
            HOME=str(self.home),
            KILN_WORK_DIR=str(self.work),
            KILN_PARAMS_FILE=str(params_file),
            KILN_ENDPOINT=api.url,
            KILN_JOB_TOKEN=JOB_TOKEN,
            KILN_JOB_ID="job-1",
            PYTHONPATH=os.pathsep.join([SRC, str(fake)]),
            **env,
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kiln.injob.notebook"],
            cwd=self.work,
            env=environ,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.state_file = self.work / notebook.STATE_FILE

    def wait_ready(self, timeout: float = 10) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not self.state_file.exists():
            assert self.proc.poll() is None, f"the launcher exited: {self.proc.communicate()}"
            assert time.monotonic() < deadline, "no state file"
            time.sleep(0.05)
        state: dict[str, Any] = json.loads(self.state_file.read_text())
        return state

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 10) -> tuple[int, str, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, err


@pytest.mark.timeout(30)
def test_the_launcher_restores_serves_saves_and_stops(api: FakeHomeApi, tmp_path: Path) -> None:
    api.stored = make_tar(("file", "restored.txt", b"from last time"))
    launcher = Launcher(tmp_path, api)
    state = launcher.wait_ready(timeout=10)
    assert (launcher.home / "restored.txt").read_text() == "from last time"
    assert set(state) == {"socket", "token", "pid", "base_url"}
    assert state["socket"] == notebook.SOCKET_FILE and state["base_url"] == BASE_URL
    assert stat.S_IMODE(launcher.state_file.stat().st_mode) == 0o600
    socket_file = launcher.work / state["socket"]
    assert stat.S_ISSOCK(socket_file.stat().st_mode) and stat.S_IMODE(socket_file.stat().st_mode) == 0o600
    assert len(str(socket_file).encode()) > 108
    work_fd = os.open(launcher.work, os.O_PATH | os.O_DIRECTORY)  # a short name for the socket, as Kiln's proxy
    try:
        short = f"/proc/self/fd/{work_fd}/{state['socket']}"
        assert notebook.lab_status(short, BASE_URL, state["token"]) == 200
        assert notebook.lab_status(short, BASE_URL, None) == 403
    finally:
        os.close(work_fd)
    argv = json.loads((launcher.work / "fake-lab-argv.json").read_text())
    assert f"--ServerApp.root_dir={launcher.home}" in argv
    # The token is on no command line (the host's ps shows those to everyone): in a file only the job reads.
    assert not any(state["token"] in arg or "token=" in arg.lower() for arg in argv), argv
    token_file = launcher.work / notebook.RUNTIME_DIR / notebook.TOKEN_FILE
    assert token_file.read_text() == state["token"] and stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert "--ServerApp.sock=.kiln-notebook.sock" in argv and f"--ServerApp.base_url={BASE_URL}" in argv
    (launcher.home / "new.txt").write_text("written in the notebook")
    code, out, err = launcher.stop(timeout=10)
    assert code == 0, err
    assert (launcher.work / "fake-lab-terminated").exists()
    assert not launcher.state_file.exists()
    assert api.names() == ["new.txt", "restored.txt"]
    lines = out.splitlines()
    assert lines[0].startswith(f"kiln: notebook home {launcher.home}: the files under it persist")
    assert f"kiln: notebook ready (the files under $HOME persist: {launcher.home})" in lines
    assert lines[-1] == "kiln: notebook home saved"


@pytest.mark.timeout(30)
def test_the_home_is_saved_each_round_it_changed_and_a_refused_save_is_tried_again(
    api: FakeHomeApi, tmp_path: Path
) -> None:
    api.put_answers = [413]
    launcher = Launcher(tmp_path, api, sync_seconds=0.3)
    launcher.wait_ready(timeout=10)
    (launcher.home / "a.txt").write_text("a")
    deadline = time.monotonic() + 10
    while not (api.saved and "a.txt" in api.names()):
        assert time.monotonic() < deadline, "never saved"
        time.sleep(0.05)
    saves = len(api.saved)
    time.sleep(1.0)  # rounds with nothing changed send nothing
    assert len(api.saved) == saves
    code, out, err = launcher.stop(timeout=10)
    assert code == 0
    assert len(api.saved) == saves, "unchanged since the last save: the final sync sends nothing"
    assert "kiln: notebook home unchanged" in out.splitlines()
    assert api.refused == 1 and "kiln: notebook home not saved: HTTP 413 over the storage quota" in err


@pytest.mark.timeout(30)
def test_jupyterlab_exiting_on_its_own_saves_the_home_and_is_the_exit_code(api: FakeHomeApi, tmp_path: Path) -> None:
    launcher = Launcher(tmp_path, api, FAKE_LAB_EXIT="3", FAKE_LAB_DELAY="0")
    launcher.wait_ready(timeout=10)
    (launcher.home / "b.txt").write_text("b")
    _, err = launcher.proc.communicate(timeout=10)
    assert launcher.proc.returncode == 3 and "kiln: jupyterlab exited with 3" in err
    assert not launcher.state_file.exists()
    assert api.saved and "b.txt" in api.names()


@pytest.mark.timeout(30)
def test_jupyterlab_that_ignores_sigterm_is_killed_after_the_grace(api: FakeHomeApi, tmp_path: Path) -> None:
    launcher = Launcher(tmp_path, api, FAKE_LAB_IGNORE_TERM="1")
    state = launcher.wait_ready(timeout=10)
    started = time.monotonic()
    code, _, err = launcher.stop(signal.SIGINT, timeout=10)
    assert code == 0, err
    assert notebook.STOP_GRACE <= time.monotonic() - started < notebook.STOP_GRACE + 5
    with pytest.raises(ProcessLookupError):
        os.kill(state["pid"], 0)


@pytest.mark.timeout(30)
def test_jupyterlab_that_exits_before_it_is_ready_fails_the_job(api: FakeHomeApi, tmp_path: Path) -> None:
    launcher = Launcher(tmp_path, api, FAKE_LAB_EXIT="7", FAKE_LAB_NEVER_READY="1")
    _, err = launcher.proc.communicate(timeout=10)
    assert launcher.proc.returncode == 7 and "kiln: jupyterlab exited with 7 before it was ready" in err
    assert not launcher.state_file.exists()
    assert api.saved == [], "nothing was served: nothing to save"


@pytest.mark.timeout(30)
def test_a_stop_while_jupyterlab_starts_stops_it_and_exits_0(api: FakeHomeApi, tmp_path: Path) -> None:
    launcher = Launcher(tmp_path, api, FAKE_LAB_NEVER_READY="1")
    deadline = time.monotonic() + 10
    while not (launcher.work / "fake-lab-argv.json").exists():
        assert time.monotonic() < deadline, "the fake jupyterlab did not start"
        time.sleep(0.05)
    code, out, err = launcher.stop(timeout=10)
    assert code == 0, err
    assert (launcher.work / "fake-lab-terminated").exists() and "before it was ready" not in err
    assert not launcher.state_file.exists() and "kiln: notebook ready" not in out


@pytest.mark.timeout(30)
def test_a_home_that_cannot_be_restored_fails_the_job_before_jupyterlab_starts(
    api: FakeHomeApi, tmp_path: Path
) -> None:
    api.get_status = 503
    launcher = Launcher(tmp_path, api)
    _, err = launcher.proc.communicate(timeout=10)
    assert launcher.proc.returncode == notebook.EXIT_RESTORE
    assert f"kiln: notebook home not restored: GET {api.url}/api/v1/notebooks/{NOTEBOOK_ID}/home: HTTP 503" in err
    assert not (launcher.work / "fake-lab-argv.json").exists()
    assert api.saved == []


def test_the_config_is_checked(tmp_path: Path) -> None:
    params = tmp_path / "params.json"
    env = {"KILN_PARAMS_FILE": str(params), "KILN_ENDPOINT": "http://10.0.2.2:8080/", "KILN_JOB_TOKEN": "t"}
    env |= {"HOME": str(tmp_path), "KILN_WORK_DIR": str(tmp_path)}
    params.write_text(json.dumps({"notebook_id": NOTEBOOK_ID, "base_url": BASE_URL}))
    config = notebook.read_config(env)
    assert config.sync_seconds == notebook.SYNC_SECONDS
    assert config.home_url == f"http://10.0.2.2:8080/api/v1/notebooks/{NOTEBOOK_ID}/home"
    for bad in (
        {"notebook_id": "../x", "base_url": BASE_URL},
        {"notebook_id": NOTEBOOK_ID, "base_url": "notebooks/x"},
        {"notebook_id": NOTEBOOK_ID, "base_url": "/a b/"},
        {"notebook_id": NOTEBOOK_ID, "base_url": BASE_URL, "sync_seconds": 0},
        {"notebook_id": NOTEBOOK_ID, "base_url": BASE_URL, "sync_seconds": True},
    ):
        params.write_text(json.dumps(bad))
        with pytest.raises(ValueError):
            notebook.read_config(env)
    with pytest.raises(ValueError, match="KILN_JOB_TOKEN not set"):
        notebook.read_config({**env, "KILN_JOB_TOKEN": ""})


# --- port mode (a Kubernetes pod), the welcome notebook and the terminals' banner -------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def dirs(tmp_path: Path) -> tuple[Path, Path]:
    home, work_dir = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work_dir.mkdir()
    return home, work_dir


@pytest.mark.timeout(30)
def test_port_mode_needs_a_port_and_the_injected_token(tmp_path: Path) -> None:
    params = tmp_path / "params.json"
    env = {"KILN_PARAMS_FILE": str(params), "KILN_ENDPOINT": "http://10.0.2.2:8080", "KILN_JOB_TOKEN": "t"}
    env |= {"HOME": str(tmp_path), "KILN_WORK_DIR": str(tmp_path), "KILN_NOTEBOOK_TOKEN": "injected-token"}
    params.write_text(json.dumps({"notebook_id": NOTEBOOK_ID, "base_url": BASE_URL}))
    socket_mode = notebook.read_config(env)
    assert (socket_mode.port, socket_mode.lab_token) == (None, "")  # the token env means nothing without a port
    params.write_text(json.dumps({"notebook_id": NOTEBOOK_ID, "base_url": BASE_URL, "port": 8888}))
    config = notebook.read_config(env)
    assert (config.port, config.lab_token) == (8888, "injected-token")
    for missing in ({}, {"KILN_NOTEBOOK_TOKEN": ""}, {"KILN_NOTEBOOK_TOKEN": "  "}):
        without = {k: v for k, v in env.items() if k != "KILN_NOTEBOOK_TOKEN"} | missing
        with pytest.raises(ValueError, match="KILN_NOTEBOOK_TOKEN not set"):
            notebook.read_config(without)
    assert (config.ip, config.probe_host) == ("0.0.0.0", "127.0.0.1")
    params.write_text(json.dumps({"notebook_id": NOTEBOOK_ID, "base_url": BASE_URL, "port": 8888, "ip": "127.3.4.5"}))
    assert (notebook.read_config(env).ip, notebook.read_config(env).probe_host) == ("127.3.4.5", "127.3.4.5")
    for ip in ("localhost", "0.0.0.0 --ServerApp.token=x", 7):
        params.write_text(json.dumps({"notebook_id": NOTEBOOK_ID, "base_url": BASE_URL, "port": 8888, "ip": ip}))
        with pytest.raises(ValueError, match="ip: the address"):
            notebook.read_config(env)
    for bad in (0, 65536, -1, "8888", 8888.0, True, None):
        params.write_text(json.dumps({"notebook_id": NOTEBOOK_ID, "base_url": BASE_URL, "port": bad}))
        if bad is None:  # "port": null is no port
            assert notebook.read_config(env).port is None
            continue
        with pytest.raises(ValueError, match=r"port: the TCP port"):
            notebook.read_config(env)


@pytest.mark.timeout(30)
def test_port_mode_listens_on_tcp_and_socket_mode_is_unchanged(tmp_path: Path) -> None:
    home, work_dir = dirs(tmp_path)
    on_socket = NotebookConfig(NOTEBOOK_ID, BASE_URL, 60.0, "http://127.0.0.1:1", "t", home, work_dir)
    command = notebook.lab_command(on_socket)
    assert "--ServerApp.sock=.kiln-notebook.sock" in command and "--ServerApp.sock_mode=0600" in command
    assert not any(arg.startswith(("--ServerApp.ip", "--ServerApp.port")) for arg in command)
    on_port = NotebookConfig(NOTEBOOK_ID, BASE_URL, 60.0, "http://127.0.0.1:1", "t", home, work_dir, 8888, "k")
    command = notebook.lab_command(on_port)
    assert [arg for arg in command if arg.startswith(("--ServerApp.ip", "--ServerApp.port", "--ServerApp.sock"))] == [
        "--ServerApp.ip=0.0.0.0",
        "--ServerApp.port=8888",
        "--ServerApp.port_retries=0",
    ]
    assert not any("token" in arg.lower() for arg in command) and f"--ServerApp.base_url={BASE_URL}" in command


@pytest.mark.timeout(30)
def test_the_launcher_in_port_mode_serves_on_tcp_with_the_injected_token(api: FakeHomeApi, tmp_path: Path) -> None:
    port = free_port()
    launcher = Launcher(tmp_path, api, params={"port": port}, KILN_NOTEBOOK_TOKEN="injected-token")
    state = launcher.wait_ready(timeout=10)
    assert state == {"port": port, "pid": state["pid"], "base_url": BASE_URL}  # the token is Kiln's already
    argv = json.loads((launcher.work / "fake-lab-argv.json").read_text())
    assert not any("injected-token" in arg for arg in argv) and f"--ServerApp.port={port}" in argv
    assert not any(arg.startswith("--ServerApp.sock") for arg in argv)
    assert notebook.lab_status(("127.0.0.1", port), BASE_URL, "injected-token") == 200
    assert notebook.lab_status(("127.0.0.1", port), BASE_URL, None) == 403
    assert not (launcher.work / notebook.SOCKET_FILE).exists()
    code, _, err = launcher.stop(timeout=10)
    assert code == 0, err


@pytest.mark.timeout(30)
def test_the_launcher_in_port_mode_without_a_token_is_a_config_error(api: FakeHomeApi, tmp_path: Path) -> None:
    launcher = Launcher(tmp_path, api, params={"port": free_port()})
    _, err = launcher.proc.communicate(timeout=10)
    assert launcher.proc.returncode == notebook.EXIT_CONFIG
    assert "kiln: notebook: KILN_NOTEBOOK_TOKEN not set" in err
    assert not (launcher.work / "fake-lab-argv.json").exists() and api.saved == []


@pytest.mark.timeout(30)
def test_a_new_home_gets_a_welcome_notebook_saying_what_persists_never_over_a_file(tmp_path: Path) -> None:
    home, work_dir = dirs(tmp_path)
    config = NotebookConfig("nb-1", "/notebooks/nb-1/", 30.0, "http://127.0.0.1:1", "t", home, work_dir)
    path = notebook.welcome(config)
    assert path == home / "Welcome to Kiln.ipynb"
    body = json.loads(path.read_text())
    assert (body["nbformat"], body["nbformat_minor"]) == (4, 5) and isinstance(body["metadata"], dict)
    first = body["cells"][0]
    assert first["cell_type"] == "markdown" and first["id"] and isinstance(first["metadata"], dict)
    text = "".join(first["source"])
    assert f"the files under {home} (your home, ~) persist: saved every 30s when something changed" in text
    assert "and when the notebook stops" in text and "Anything outside it is gone when the notebook stops" in text
    assert "inputs are under ~/data (read-only, not saved)" in text
    path.write_text("the user's own")
    assert notebook.welcome(config) is None and path.read_text() == "the user's own"  # never overwritten


@pytest.mark.timeout(60)
def test_the_welcome_notebook_is_written_only_for_a_new_home(api: FakeHomeApi, tmp_path: Path) -> None:
    launcher = Launcher(tmp_path / "new", api)
    launcher.wait_ready(timeout=10)
    launcher.stop(timeout=10)
    assert (launcher.home / notebook.WELCOME_FILE).exists()
    api.stored = make_tar(("file", "mine.ipynb", b"{}"))  # a home saved without it: the user deleted it
    again = Launcher(tmp_path / "restored", api)
    again.wait_ready(timeout=10)
    again.stop(timeout=10)
    assert not (again.home / notebook.WELCOME_FILE).exists() and (again.home / "mine.ipynb").exists()


@pytest.mark.timeout(30)
def test_terminals_run_bash_with_kilns_rcfile_that_prints_the_banner_then_the_users_bashrc(tmp_path: Path) -> None:
    home, work_dir = dirs(tmp_path)
    config = NotebookConfig("nb-1", "/notebooks/nb-1/", 60.0, "http://127.0.0.1:1", "t", home, work_dir)
    env = notebook.lab_env(config, "t")
    assert env.get("SHELL") == os.environ.get("SHELL")  # IPython's !cmd runs $SHELL: no banner there
    config_dir = Path(env["JUPYTER_CONFIG_PATH"].split(os.pathsep)[0])
    assert config_dir == work_dir / notebook.CONFIG_DIR  # Kiln's, in the work dir: not the home's
    settings = json.loads((config_dir / "jupyter_server_config.json").read_text())
    bash = shutil.which("bash")
    assert bash is not None, "these tests run where there is bash"
    rcfile = work_dir / notebook.RC_FILE
    assert settings == {"ServerApp": {"terminado_settings": {"shell_command": [bash, "--rcfile", str(rcfile), "-i"]}}}
    assert not any(p.name.startswith(".kiln") for p in home.iterdir())
    (home / ".bashrc").write_text("echo users-bashrc-ran\n")
    done = subprocess.run(
        [bash, "--rcfile", str(rcfile), "-i"],
        input="echo typed-command\nexit\n",
        env={"HOME": str(home), "PATH": os.environ["PATH"], "TERM": "dumb"},
        capture_output=True,
        text=True,
        timeout=20,
    )
    lines = done.stdout.splitlines()
    assert lines[0] == notebook.banner(config), done.stdout + done.stderr
    assert lines[0].startswith(f"Kiln notebook: the files under {home} (your home, ~) persist")
    assert lines.index("users-bashrc-ran") < lines.index("typed-command")


@pytest.mark.timeout(30)
def test_the_config_dir_keeps_other_config_paths_and_without_bash_leaves_the_default_shell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, work_dir = dirs(tmp_path)
    config = NotebookConfig("nb-1", "/notebooks/nb-1/", 60.0, "http://127.0.0.1:1", "t", home, work_dir)
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", f"/opt/a{os.pathsep}/opt/b")
    monkeypatch.setenv("PATH", str(tmp_path / "no-bash-here"))
    env = notebook.lab_env(config, "t")
    assert env["JUPYTER_CONFIG_PATH"].split(os.pathsep) == [str(work_dir / notebook.CONFIG_DIR), "/opt/a", "/opt/b"]
    assert json.loads((work_dir / notebook.CONFIG_DIR / "jupyter_server_config.json").read_text()) == {}
    assert not (work_dir / notebook.RC_FILE).exists()

"""kiln.log: batching into the spool, flush at exit, the HTTP path, outside Kiln, validation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import warnings
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from kiln.injob import metrics_sdk

SRC = str(Path(metrics_sdk.__file__).resolve().parents[2])


@pytest.fixture
def logger(monkeypatch: pytest.MonkeyPatch) -> metrics_sdk._Logger:
    for name in ("KILN_METRICS_DIR", "KILN_JOB_TOKEN", "KILN_ENDPOINT", "KILN_JOB_ID", "KILN_ROLE", "KILN_ATTEMPT"):
        monkeypatch.delenv(name, raising=False)
    fresh = metrics_sdk._Logger()
    monkeypatch.setattr(metrics_sdk, "_logger", fresh)
    return fresh


def test_many_calls_make_few_writes(logger, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KILN_METRICS_DIR", str(tmp_path))
    monkeypatch.setenv("KILN_ATTEMPT", "2")
    monkeypatch.setenv("KILN_ROLE", "worker")
    monkeypatch.setenv("KILN_WORKER_INDEX", "3")
    writes = []
    real_write = os.write
    monkeypatch.setattr(metrics_sdk.os, "write", lambda fd, data: writes.append(len(data)) or real_write(fd, data))
    for step in range(5000):
        metrics_sdk.log({"loss": 1 / (step + 1), "acc": step / 5000}, step=step)
    metrics_sdk.flush()
    assert 1 <= len(writes) <= 20
    path = tmp_path / f"sdk-a2-worker3-{os.getpid()}.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 5000
    assert lines[0]["s"] == 0 and lines[0]["w"] == "worker3" and lines[0]["src"] == "sdk"
    assert lines[0]["m"] == {"loss": 1.0, "acc": 0.0}
    assert [line["s"] for line in lines] == list(range(5000))


def test_the_background_flush_writes_within_about_a_second(logger, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KILN_METRICS_DIR", str(tmp_path))
    metrics_sdk.log({"loss": 0.5})
    path = tmp_path / f"sdk-a1-worker0-{os.getpid()}.jsonl"
    for _ in range(60):
        if path.exists() and path.read_text():
            break
        threading.Event().wait(0.05)
    line = json.loads(path.read_text())
    assert line["s"] is None and line["m"] == {"loss": 0.5}


def test_flush_at_interpreter_exit(tmp_path: Path) -> None:
    script = (
        "import kiln\n"
        "for i in range(10):\n"
        "    kiln.log({'loss': 1.0 / (i + 1), 'phase': 'train', 'bad': float('nan')}, step=i)\n"
    )
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": SRC,
        "KILN_METRICS_DIR": str(tmp_path),
        "KILN_ATTEMPT": "1",
    }
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    (path,) = tmp_path.glob("sdk-a1-worker0-*.jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["s"] for line in lines] == list(range(10))
    assert lines[1]["m"] == {"loss": 0.5, "phase": "train", "bad": "nan"}


def test_import_kiln_stays_light() -> None:
    code = (
        "import sys, kiln; kiln.log; print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'httpx')))"
    )
    out = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": SRC}, capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stderr


def test_outside_kiln_it_warns_once_and_records_nothing(logger) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics_sdk.log({"loss": 0.5}, step=1)
        metrics_sdk.log({"loss": 0.4}, step=2)
        metrics_sdk.flush()
    assert len(caught) == 1 and "not running inside a Kiln job" in str(caught[0].message)
    assert caught[0].filename == __file__
    assert logger.mode == "off" and logger.buffer == []


@pytest.mark.parametrize(
    ("metrics", "step", "error", "needle"),
    [
        ([("loss", 1.0)], None, TypeError, "mapping"),
        ({1: 1.0}, None, TypeError, "names must be strings"),
        ({"": 1.0}, None, ValueError, "1 to 200"),
        ({"x" * 201: 1.0}, None, ValueError, "1 to 200"),
        ({"loss": None}, None, TypeError, "'loss'"),
        ({"loss": True}, None, TypeError, "'loss'"),
        ({"loss": [1.0]}, None, TypeError, "'loss'"),
        ({"loss": 1.0}, 1.5, TypeError, "step"),
        ({"loss": 1.0}, "3", TypeError, "step"),
    ],
)
def test_validation(logger, metrics: Any, step: Any, error: type, needle: str) -> None:
    with pytest.raises(error, match=needle):
        metrics_sdk.log(metrics, step=step)


def test_numbers_of_other_libraries_are_accepted(logger, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KILN_METRICS_DIR", str(tmp_path))

    class Scalar:  # a numpy scalar or a one-element tensor
        def __float__(self) -> float:
            return 0.25

    metrics_sdk.log({"a": Scalar(), "b": 10**20, "c": float("inf")}, step=1)
    metrics_sdk.flush()
    (path,) = tmp_path.glob("sdk-*.jsonl")
    assert json.loads(path.read_text())["m"] == {"a": 0.25, "b": 1e20, "c": "inf"}


class Receiver(BaseHTTPRequestHandler):
    received: list[tuple[str, dict[str, str], bytes]] = []
    status = 200

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Receiver.received.append((self.path, dict(self.headers), body))
        self.send_response(Receiver.status)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server():
    Receiver.received = []
    Receiver.status = 200
    httpd = HTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_the_http_path_posts_ndjson_batches(logger, monkeypatch, server: str) -> None:
    monkeypatch.setenv("KILN_JOB_TOKEN", "tok-123")
    monkeypatch.setenv("KILN_ENDPOINT", server + "/")
    monkeypatch.setenv("KILN_JOB_ID", "j-42")
    for step in range(3):
        metrics_sdk.log({"loss": step / 10}, step=step)
    metrics_sdk.flush()
    assert len(Receiver.received) == 1
    path, headers, body = Receiver.received[0]
    assert path == "/api/v1/jobs/j-42/metrics"
    assert headers["Authorization"] == "Bearer tok-123"
    assert headers["Content-Type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in body.decode().splitlines()]
    assert [(line["s"], line["m"], line["src"]) for line in lines] == [(i, {"loss": i / 10}, "sdk") for i in range(3)]


def test_http_failures_warn_once_and_retry_later(logger, monkeypatch, server: str) -> None:
    monkeypatch.setenv("KILN_JOB_TOKEN", "tok")
    monkeypatch.setenv("KILN_ENDPOINT", server)
    monkeypatch.setenv("KILN_JOB_ID", "j-1")
    Receiver.status = 503
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics_sdk.log({"a": 1.0}, step=1)
        metrics_sdk.flush()
        metrics_sdk.log({"a": 2.0}, step=2)
        metrics_sdk.flush()
    assert len(caught) == 1 and "503" in str(caught[0].message)
    Receiver.status = 200
    Receiver.received = []
    metrics_sdk.flush()  # the kept batches go now
    steps = [json.loads(line)["s"] for _, _, body in Receiver.received for line in body.decode().splitlines()]
    assert steps == [1, 2]


def test_an_unreachable_endpoint_does_not_raise(logger, monkeypatch) -> None:
    monkeypatch.setenv("KILN_JOB_TOKEN", "tok")
    monkeypatch.setenv("KILN_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("KILN_JOB_ID", "j-1")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        metrics_sdk.log({"a": 1.0})
        metrics_sdk.flush()
    assert logger.retry

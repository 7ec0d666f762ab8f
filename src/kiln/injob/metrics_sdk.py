"""``kiln.log(metrics, step=None)``: metrics from inside a job. Standard library only (jobs' Pythons have none
of Kiln's dependencies); ``import kiln`` loads this lazily.

Points are buffered in memory and flushed in batches (every second, at 1000 points, at interpreter exit and on
``kiln.flush()``), never one write per value. Where they go is decided on the first call:

- ``KILN_METRICS_DIR`` set (a job of the local executor): appended to this process's own spool file there,
  ``sdk-a<attempt>-<member>-<pid>.jsonl``, one ``os.write`` per batch of complete JSON lines;
- else ``KILN_JOB_TOKEN`` and ``KILN_ENDPOINT`` set (a job on a remote backend): each batch is POSTed, as the
  same JSON lines (``application/x-ndjson``), to ``{KILN_ENDPOINT}/api/v1/jobs/{KILN_JOB_ID}/metrics``;
- else (outside Kiln): nothing is recorded, with one warning.

A line: ``{"t": 1764505801.25, "s": 120, "w": "worker0", "m": {"loss": 0.31}, "src": "sdk"}``. Failing to write
or to send warns once and never fails the job.
"""

from __future__ import annotations

import atexit
import fnmatch
import json
import math
import os
import sys
import threading
import time
import warnings
from collections.abc import Mapping
from typing import Any

__all__ = ["flush", "log", "should_prune"]

FLUSH_SECONDS = 1.0
FLUSH_POINTS = 1000
MAX_NAME = 200
MAX_TEXT = 1000
MAX_PENDING = 100_000  # points held in memory at most (a remote endpoint that is down); older ones are dropped
MAX_RETRY_BYTES = 16 * 1024 * 1024  # unsent request bodies kept for a retry
HTTP_TIMEOUT = 10.0


def _clean(name: object, value: object) -> float | str:
    if not isinstance(name, str):
        raise TypeError(f"kiln.log: metric names must be strings, got {type(name).__name__} {name!r}")
    if not name or len(name) > MAX_NAME:
        raise ValueError(f"kiln.log: metric name {name[:40]!r} must have 1 to {MAX_NAME} characters")
    if isinstance(value, bool) or value is None:
        raise TypeError(f"kiln.log: metric {name!r} must be a number or a string, got {value!r}")
    if isinstance(value, str):
        return value[:MAX_TEXT]
    if isinstance(value, int):
        number = float(value) if abs(value) >= 2**53 else value
    elif isinstance(value, float):
        number = value
    elif hasattr(value, "__float__") and not isinstance(value, bytes | bytearray):
        try:  # numpy scalars, 0-d arrays, one-element tensors
            number = float(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"kiln.log: metric {name!r} is not a number: {exc}") from None
    else:
        raise TypeError(f"kiln.log: metric {name!r} must be a number or a string, got {type(value).__name__}")
    if isinstance(number, float) and not math.isfinite(number):
        return "nan" if math.isnan(number) else ("inf" if number > 0 else "-inf")
    return number


class _Logger:
    def __init__(self) -> None:
        self.lock = threading.Lock()  # guards the buffer
        self.write_lock = threading.Lock()  # one flush at a time, in order
        self.buffer: list[tuple[float, int | None, dict[str, float | str]]] = []
        self.points = 0
        self.mode = ""  # "file", "http" or "off", decided on the first log()
        self.member = "worker0"
        self.path = ""
        self.url = ""
        self.token = ""
        self.fd = -1
        self.warned: set[str] = set()
        self.retry: list[bytes] = []  # request bodies a remote endpoint has not taken yet
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        self.pid = os.getpid()
        self.writes = 0  # batches written or sent (tests count them)
        self.started = False
        # $KILN_WATCH_METRICS (the spec's metrics.watch: a study's objective): such a point is written at once.
        self.watch = tuple(p.strip().lower() for p in os.environ.get("KILN_WATCH_METRICS", "").split(",") if p.strip())
        self.watched_step: int | None = None  # the step of the last watched point logged
        self.pruned = False

    # -- setup --

    def _setup(self) -> None:
        env = os.environ
        role = env.get("KILN_ROLE") or "worker"
        index = env.get("KILN_WORKER_INDEX") or "0"
        self.member = f"{role}{index}"
        attempt = env.get("KILN_ATTEMPT") or "1"
        directory = env.get("KILN_METRICS_DIR")
        if directory:
            safe = "".join(c if c.isalnum() or c in "_.-" else "_" for c in self.member)
            self.path = os.path.join(directory, f"sdk-a{attempt}-{safe}-{os.getpid()}.jsonl")
            self.mode = "file"
        elif env.get("KILN_JOB_TOKEN") and env.get("KILN_ENDPOINT") and env.get("KILN_JOB_ID"):
            endpoint = env["KILN_ENDPOINT"].rstrip("/")
            self.url = f"{endpoint}/api/v1/jobs/{env['KILN_JOB_ID']}/metrics"
            self.token = env["KILN_JOB_TOKEN"]
            self.mode = "http"
        else:
            self.mode = "off"
            self._warn(
                "off", "kiln.log: not running inside a Kiln job (no KILN_METRICS_DIR); metrics are not recorded", 4
            )
            return
        if not self.started:
            self.started = True
            atexit.register(self.flush)

    def _warn(self, key: str, message: str, stacklevel: int = 2) -> None:
        if key in self.warned:
            return
        self.warned.add(key)
        try:
            warnings.warn(message, RuntimeWarning, stacklevel=stacklevel + 1)
        except Exception:
            try:
                sys.stderr.write(f"warning: {message}\n")
            except Exception:
                pass

    def _after_fork(self) -> None:
        """A forked child (a DataLoader worker) starts over: its own file, its own buffer and thread."""
        self.lock = threading.Lock()
        self.write_lock = threading.Lock()
        self.buffer, self.points, self.retry = [], 0, []
        self.wake = threading.Event()
        self.thread = None
        self.fd = -1
        if self.mode == "file" and self.pid != os.getpid():
            self.mode = ""  # decided again on the next log(), with this process's pid
        self.pid = os.getpid()

    # -- logging --

    def log(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        if not isinstance(metrics, Mapping):
            raise TypeError(f"kiln.log: metrics must be a mapping of name to value, got {type(metrics).__name__}")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            if hasattr(step, "__index__") and not isinstance(step, bool):
                step = step.__index__()  # numpy integers
            else:
                raise TypeError(f"kiln.log: step must be an int or None, got {type(step).__name__} {step!r}")
        clean = {name: _clean(name, value) for name, value in metrics.items()}
        if not self.mode:
            with self.lock:
                if not self.mode:
                    self._setup()
        if self.mode == "off" or not clean:
            return
        now = time.time()
        with self.lock:
            self.buffer.append((now, step, clean))
            self.points += len(clean)
            if len(self.buffer) > MAX_PENDING:
                del self.buffer[: len(self.buffer) - MAX_PENDING]
                self._warn("overflow", "kiln.log: metrics are produced faster than they can be sent; some are dropped")
            full = self.points >= FLUSH_POINTS
            if self.watch and any(fnmatch.fnmatchcase(name.lower(), p) for name in clean for p in self.watch):
                full = True  # the server judges it now (a study's pruner), not within the next second
                self.watched_step = step
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="kiln-metrics", daemon=True)
                self.thread.start()
        if full:
            self.wake.set()

    def _run(self) -> None:
        while True:
            self.wake.wait(FLUSH_SECONDS)
            self.wake.clear()
            try:
                self.flush()
            except Exception:
                pass

    def flush(self) -> None:
        if self.mode in ("", "off"):
            return
        with self.write_lock:
            with self.lock:
                batch, self.buffer, self.points = self.buffer, [], 0
            if not batch and not self.retry:
                return
            lines = []
            for t, step, metrics in batch:
                try:
                    line = {"t": t, "s": step, "w": self.member, "m": metrics, "src": "sdk"}
                    lines.append(json.dumps(line, ensure_ascii=False, allow_nan=False, separators=(",", ":")))
                except (TypeError, ValueError):
                    continue
            body = ("\n".join(lines) + "\n").encode() if lines else b""
            if self.mode == "file":
                self._write(body)
            else:
                self._post(body)

    def _write(self, body: bytes) -> None:
        if not body:
            return
        try:
            if self.fd < 0:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            view = memoryview(body)
            while view:
                view = view[os.write(self.fd, view) :]
            self.writes += 1
        except OSError as exc:
            self._warn("write", f"kiln.log: cannot write metrics to {self.path}: {exc}; they are dropped")

    def _post(self, body: bytes) -> None:
        import urllib.error
        import urllib.request

        bodies = [*self.retry, body] if body else list(self.retry)
        self.retry = []
        for i, data in enumerate(bodies):
            request = urllib.request.Request(
                self.url,
                data=data,
                method="POST",
                headers={"Content-Type": "application/x-ndjson", "Authorization": f"Bearer {self.token}"},
            )
            try:
                with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as response:
                    response.read()
                self.writes += 1
            except urllib.error.HTTPError as exc:
                if exc.code == 429 or exc.code >= 500:
                    self._keep(bodies[i:])
                    self._warn("http", f"kiln.log: sending metrics failed (HTTP {exc.code}); retrying later")
                    return
                self._warn("http-rejected", f"kiln.log: the server refused metrics (HTTP {exc.code}); they are dropped")
            except (OSError, ValueError) as exc:
                self._keep(bodies[i:])
                self._warn("http", f"kiln.log: sending metrics failed ({exc}); retrying later")
                return

    def _keep(self, bodies: list[bytes]) -> None:
        total = 0
        kept: list[bytes] = []
        for data in reversed(bodies):  # the newest are kept when there is too much
            total += len(data)
            if total > MAX_RETRY_BYTES:
                break
            kept.append(data)
        self.retry = kept[::-1]


_logger = _Logger()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _logger._after_fork())


def log(metrics: Mapping[str, Any], step: int | None = None) -> None:
    """Record metrics of one step: ``kiln.log({"loss": 0.31, "lr": 1e-3}, step=120)``.

    Names are strings (1 to 200 characters); values numbers or strings (text metrics). NaN and infinities are
    recorded as the text "nan"/"inf". Cheap: points are buffered and written in batches.
    """
    _logger.log(metrics, step)


def flush() -> None:
    """Write (or send) what ``log`` has buffered now, instead of within the next second."""
    _logger.flush()


def should_prune(wait: float = 5.0) -> bool:
    """In a trial of a tuning study: True once the study's pruner has stopped this trial, which should end now
    (save what it wants and exit; it is stopped with SIGTERM soon after anyway). ``kiln.log`` the objective with
    its step, then ask: the call sends what ``log`` holds and waits (at most ``wait`` seconds) until the pruner has
    judged that step, so a trial that asks after each report never trains past its verdict. Outside a trial, or
    where the server cannot be asked: False (with one warning)."""
    logger = _logger
    if logger.pruned:
        return True
    env = os.environ
    endpoint, token, job_id = env.get("KILN_ENDPOINT"), env.get("KILN_JOB_TOKEN"), env.get("KILN_JOB_ID")
    if not (endpoint and token and job_id):
        logger._warn("prune-off", "kiln.should_prune: not running as a Kiln job with a job token; answering False")
        return False
    logger.flush()
    import urllib.error
    import urllib.parse
    import urllib.request

    query = {"wait": f"{max(0.0, min(wait, 10.0)):g}"}
    if logger.watched_step is not None:
        query["judged"] = str(logger.watched_step)
    url = f"{endpoint.rstrip('/')}/api/v1/jobs/{job_id}/trial?{urllib.parse.urlencode(query)}"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT + wait) as response:
            verdict = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        why = "this job is not a trial of a tuning study" if exc.code == 404 else f"HTTP {exc.code}"
        logger._warn("prune-http", f"kiln.should_prune: {why}; answering False")
        return False
    except (OSError, ValueError) as exc:
        logger._warn("prune-http", f"kiln.should_prune: cannot ask the server ({exc}); answering False")
        return False
    logger.pruned = bool(isinstance(verdict, dict) and verdict.get("prune"))
    return logger.pruned

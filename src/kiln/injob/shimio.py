"""What the shim writes and reads beside the job: log lines, status and exit records, notifications, stop requests.

Standard library only, like the shim that loads it (as ``kiln.injob.shimio`` in the package, or as a plain
module from this file's directory when the shim runs as a script). ``AttemptFiles`` holds the shim's methods for
these files; the module's functions are re-exported by ``shim.py``, where other code imports them from.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any

EXIT_DISK_FULL = 75


def timestamp(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"


def format_line(stream: str, text: bytes, now: float | None = None) -> bytes:
    now = time.time() if now is None else now
    return timestamp(now).encode() + b" " + stream.encode() + b" " + text.rstrip(b"\n") + b"\n"


def write_json_atomic(path: str, data: dict, durable: bool = False) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
        if durable:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if durable:
        dfd = os.open(os.path.dirname(path), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


EXIT_RESERVE = 4096


def reserve_exit_record(path: str) -> None:
    """Allocate the exit record's blocks up front so that it can still be written on a full disk: with
    ``fallocate`` (the blocks are the file's at once, with no data written and no fsync to wait for), else by
    writing them and syncing."""
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        try:
            os.posix_fallocate(fd, 0, EXIT_RESERVE)
            return
        except OSError:
            pass
        os.write(fd, b" " * EXIT_RESERVE)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_exit_record(path: str, data: dict) -> None:
    """Overwrite the reserved file in place (no new blocks), fsync, then rename it into place atomically."""
    payload = json.dumps(data).encode()
    tmp = path + ".tmp"
    if len(payload) > EXIT_RESERVE or not os.path.exists(tmp):
        write_json_atomic(path, data, durable=True)
        return
    fd = os.open(tmp, os.O_WRONLY)
    try:
        os.write(fd, payload)
        os.ftruncate(fd, len(payload))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class StopFlag(threading.Event):
    """A ``threading.Event`` that a signal handler may set.

    ``Event.set`` takes the event's lock, and a Python signal handler runs in the main thread between two of its
    bytecodes: a second SIGTERM arriving while the first one's handler held that lock (two cancels in a row), or
    while the main thread was inside ``wait``, blocked the shim forever, its job never stopped. Setting this one is
    a plain store, and ``wait`` polls it (the stage code waits on it only for a retry's back-off).
    """

    def set(self) -> None:
        self._flag = True  # type: ignore[attr-defined]

    def wait(self, timeout: float | None = None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            left = 0.02 if end is None else min(0.02, end - time.monotonic())
            if left <= 0:
                return False
            time.sleep(left)
        return True


class DiskFull(Exception):
    pass


class AttemptFiles:
    """The shim's job log, ``status.json``, notifications to the server and ``stop.json`` (a mixin of ``Shim``)."""

    dir: str
    cfg: Any
    me: int
    log_fd: int
    stream_tag: str
    notify_path: str | None
    notify_sock: socket.socket | None
    metrics: Any = None  # extract.Metrics while the attempt collects metrics
    cancel_reason: str
    stop_info: tuple[str, str, float] | None
    log_over = False  # the job's output was dropped at its log limit (since its step started: shimlimits.py)
    log_reached = 0  # the log's size when that first happened
    # Seconds the attempt spent on a shared runtime's build before its command (its own or another job's it waited
    # for): the platform's, not the job's, so its hold is not billed for them (kiln.usecases.usage.unbill_usage).
    unbilled = 0.0

    def notify(self, event: str) -> None:
        if not self.notify_path:
            return
        try:
            if self.notify_sock is None:
                self.notify_sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self.notify_sock.setblocking(False)
            msg = json.dumps({"job_id": self.cfg["job_id"], "attempt": self.cfg["attempt"], "event": event})
            self.notify_sock.sendto(msg.encode(), self.notify_path)
        except OSError:
            pass  # the server may be down; it re-reads our files when it comes back

    def log(self, stream: str, data: bytes) -> None:
        line = format_line(stream + self.stream_tag, data)
        if stream != "K":  # the job's output; the shim's own lines are always written
            line = self.fit_log(line)
        if line:
            self.write_log(line)

    def log_lines(self, stream: str, lines: list[bytes]) -> None:
        """Several lines of one read, with one timestamp and one write."""
        if len(lines) == 1:
            self.log(stream, lines[0])
            return
        head = timestamp(time.time()).encode() + b" " + (stream + self.stream_tag).encode() + b" "
        data = b"".join(head + line.rstrip(b"\n") + b"\n" for line in lines)
        if stream != "K":
            data = self.fit_log(data)
        if data:
            self.write_log(data)

    def fit_log(self, data: bytes) -> bytes:
        """The whole lines of ``data`` (the job's output) that fit under the job's log limit (``log_limit``, all
        its attempts and members together: the file's size is what counts); what does not is dropped and
        ``log_over`` says so."""
        limit = self.cfg.get("log_limit")
        if not limit:
            return data
        try:
            size = os.fstat(self.log_fd).st_size
        except OSError:
            return data
        room = int(limit) - size
        if len(data) <= room:
            return data
        cut = data.rfind(b"\n", 0, room) + 1 if room > 0 else 0
        if not self.log_reached:
            self.log_reached = size + cut
        self.log_over = True
        return data[:cut]

    def write_log(self, data: bytes) -> None:
        try:
            os.write(self.log_fd, data)
        except OSError as exc:
            if exc.errno in (28, 122):  # ENOSPC, EDQUOT
                raise DiskFull(str(exc)) from exc
            raise
        metrics = self.metrics
        if metrics is not None:
            metrics.log_written.set()  # the metrics thread reads the new lines now

    def say(self, text: str) -> None:
        """A line from the shim itself: best effort, so a full disk fails only jobs whose own output is lost."""
        try:
            self.log("K", text.encode())
        except (DiskFull, OSError):
            pass

    def status(self, phase: str, **extra: object) -> None:
        data = {"phase": phase, "time": time.time(), "shim_pid": self.me, **extra}
        if self.unbilled:
            data["unbilled_seconds"] = round(self.unbilled, 3)
        write_json_atomic(os.path.join(self.dir, "status.json"), data)
        if phase == "running":  # the only phase change the server acts on before the exit
            self.notify(phase)

    def stop_request(self) -> tuple[str, str, float]:
        """(reason, message, grace) of the stop: ``stop.json`` where the executor left one, else a cancel."""
        if self.stop_info is None:
            reason, message, grace = "Cancelled", self.cancel_reason, float(self.cfg.get("grace", 10))
            try:
                with open(os.path.join(self.dir, "stop.json")) as fh:
                    request = json.load(fh)
            except (OSError, ValueError):
                request = None
            if isinstance(request, dict):
                if isinstance(request.get("reason"), str) and request["reason"].strip():
                    reason = request["reason"].strip()[:64]
                if isinstance(request.get("message"), str) and request["message"]:
                    message = request["message"][:1000]
                value = request.get("grace")
                if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < float("inf"):
                    grace = float(value)
            self.stop_info = (reason, message, grace)
        return self.stop_info

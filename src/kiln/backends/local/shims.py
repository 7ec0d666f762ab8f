"""Launching the local executor's shims, stopping them, telling whether one lives, and where its attempt member is.

Shims are forked from a launcher process (a fork server that paid the shim's imports once), or started as a
fresh interpreter when the launcher fails. A launch is recorded in the member's ``launch.json`` (the pid the
launcher answered, its start time and the launch token); the shim itself writes ``shim.pid`` once it holds the
attempt's claim (``kiln.injob.claim``). So an attempt is: launched and coming up (``launch.json``'s process
lives, or the claim is held), run by a shim (``shim.pid``), ended (``exit.json``), or never launched (none).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from kiln.backends.base import AttemptStatus, Phase
from kiln.backends.local.attemptdir import read_json, write_json_atomic
from kiln.backends.local.runtime_builder import SHIM_PATH
from kiln.errors import BackendError
from kiln.injob import claim
from kiln.injob.shimio import EXIT_DISK_FULL

log = logging.getLogger(__name__)

LAUNCH_FILE = "launch.json"
# A process is the one a pid file names when its start time is the recorded one. Both are computed the same way
# (boot time + start in clock ticks, ``claim.start_time`` and psutil), so they agree exactly; this allows for
# the float's last digits, and is far below the time pids take to wrap.
SAME_START_SECONDS = 0.05


def _ts(value: float | None) -> datetime | None:
    return datetime.fromtimestamp(value, UTC) if value else None


def _seconds(value: object) -> float:
    """A non-negative number of seconds from a shim's file; 0 for anything else (a shim runs the job's machine)."""
    return float(value) if isinstance(value, int | float) and 0 < value < 10**7 else 0.0


class ShimLauncher:
    """Starts shims and keeps what the processes it started left behind (their exit codes)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._children: dict[int, subprocess.Popen[bytes]] = {}  # shims started as fresh interpreters
        self._exit_codes: dict[int, int] = {}  # such shims that exited without an exit record
        self._children_lock = threading.Lock()
        self._launcher: subprocess.Popen[bytes] | None = None
        self._launcher_buf = b""
        self._launcher_lock = threading.Lock()

    def close(self) -> None:
        with self._launcher_lock:
            self._stop_launcher()

    # -- launching ------------------------------------------------------------------------------------

    def launch(self, member_dir: Path, token: str | None, asked: float) -> int:
        """Start the shim of ``member_dir`` (its ``shim.json`` written) and record the launch: ``at`` is ``asked``,
        when the backend's start was called (a server paused in the middle of that start, or in the spawn's wait on
        the launcher process, spawns after it resumes, though it made the start before)."""
        pid = self._spawn(member_dir)
        try:
            created = claim.start_time(pid)
        except (OSError, ValueError, IndexError):
            created = 0.0
        write_json_atomic(member_dir / LAUNCH_FILE, {"pid": pid, "create_time": created, "launch": token, "at": asked})
        return pid

    def launched(self, member_dir: Path) -> bool:
        """Whether the member was launched and may still run or has run: ended, a shim running it, one coming
        up (the launch's process lives, or the claim is held)."""
        if (member_dir / claim.EXIT).exists() or (member_dir / claim.PID).exists():
            return True
        return self.alive(member_dir / LAUNCH_FILE) or claim.held(str(member_dir))

    def _spawn(self, attempt_dir: Path) -> int:
        """Fork the shim from the launcher (its imports already paid), else start it as a new interpreter."""
        with self._launcher_lock:
            for _ in range(2):
                try:
                    return self._ask_launcher(attempt_dir)
                except (OSError, ValueError, TimeoutError) as exc:
                    log.warning("shim launcher failed (%s); restarting it", exc)
                    self._stop_launcher()
        try:
            fd = os.open(attempt_dir / "shim.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
            with open(fd, "ab") as shim_log:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", str(SHIM_PATH), str(attempt_dir)],
                    stdin=subprocess.DEVNULL,
                    stdout=shim_log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as exc:
            raise BackendError(f"cannot start the job supervisor: {exc}", retryable=False) from exc
        with self._children_lock:
            self._children[proc.pid] = proc
        return proc.pid

    def _ask_launcher(self, attempt_dir: Path) -> int:
        if self._launcher is None or self._launcher.poll() is not None:
            with open(self.run_dir / "launcher.log", "ab") as launcher_log:
                self._launcher = subprocess.Popen(
                    [sys.executable, "-I", "-S", str(SHIM_PATH), "--launcher"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=launcher_log,
                    start_new_session=True,
                    close_fds=True,
                )
            self._launcher_buf = b""
        launcher = self._launcher
        assert launcher.stdin is not None and launcher.stdout is not None
        os.write(launcher.stdin.fileno(), str(attempt_dir).encode() + b"\n")
        deadline = time.monotonic() + 10
        out = launcher.stdout.fileno()
        while b"\n" not in self._launcher_buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([out], [], [], remaining)[0]:
                raise TimeoutError("no answer from the shim launcher")
            data = os.read(out, 4096)
            if not data:
                raise OSError("the shim launcher exited")
            self._launcher_buf += data
        line, self._launcher_buf = self._launcher_buf.split(b"\n", 1)
        return int(line)

    def _stop_launcher(self) -> None:
        launcher, self._launcher = self._launcher, None
        if launcher is None:
            return
        try:
            if launcher.stdin:
                launcher.stdin.close()
            launcher.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            launcher.kill()
            launcher.wait(timeout=5)
        if launcher.stdout:
            launcher.stdout.close()

    # -- stopping -------------------------------------------------------------------------------------

    def stop(self, member_dir: Path, reason: str, message: str, grace_seconds: float) -> None:
        """Ask the member's shim to stop (``stop.json``: the reason to record and the grace to give), then
        signal it; nothing where it ended or was asked before."""
        if (member_dir / "exit.json").exists() or (member_dir / "stop.json").exists():
            return
        if member_dir.is_dir():
            write_json_atomic(member_dir / "stop.json", {"reason": reason, "message": message, "grace": grace_seconds})
        self.terminate(member_dir, reason, message)

    def terminate(self, member_dir: Path, reason: str = "Cancelled", message: str = "") -> None:
        """SIGTERM the member's shim; a member no shim has claimed is ended under its claim instead (a launch
        still coming up then finds the record and runs nothing)."""
        record = {"exit_code": None, "reason": reason, "message": message or "cancelled before it started"}
        deadline = time.monotonic() + 2.0
        while not (member_dir / "exit.json").exists():
            info = read_json(member_dir / claim.PID)
            if info is not None:
                if self.alive(member_dir / claim.PID):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(info["pid"]), signal.SIGTERM)
                return
            if claim.void(str(member_dir), {**record, "finished_at": time.time()}):
                return
            if time.monotonic() > deadline:  # held and no pid written: a shim that hangs; the poll finds it
                log.warning("%s: its shim holds the claim but wrote no pid; not signalled", member_dir)
                return
            time.sleep(0.01)  # a shim took the claim and writes its pid now

    # -- watching -------------------------------------------------------------------------------------

    def poll(self, attempt_dir: Path) -> AttemptStatus:
        """Where one attempt member is, from its files and its shim's life."""
        status = read_json(attempt_dir / "status.json") or {}
        running_at = _ts(status.get("running_at"))
        unbilled = _seconds(status.get("unbilled_seconds"))
        result = read_json(attempt_dir / "exit.json")
        if result is not None:
            self.reap()
            return AttemptStatus(
                phase=Phase.EXITED,
                exit_code=result.get("exit_code"),
                reason=result.get("reason") or "",
                message=result.get("message") or "",
                running_at=running_at,
                finished_at=_ts(result.get("finished_at")),
                unbilled_seconds=unbilled,
            )
        if self.alive(attempt_dir / claim.PID):
            phase = Phase.RUNNING if status.get("phase") in ("running", "finishing") else Phase.STARTING
            return AttemptStatus(phase=phase, running_at=running_at, unbilled_seconds=unbilled)
        if (attempt_dir / "exit.json").exists():
            return self.poll(attempt_dir)  # it wrote its record and exited between our two looks
        if not (attempt_dir / claim.PID).exists():
            # No shim has claimed it: one coming up (its launch lives, or it holds the claim and is writing its
            # pid), or none was ever launched (a server stopped between recording the start and making it).
            if self.alive(attempt_dir / LAUNCH_FILE) or claim.held(str(attempt_dir)):
                return AttemptStatus(phase=Phase.STARTING)
            if (attempt_dir / "exit.json").exists() or (attempt_dir / claim.PID).exists():
                return self.poll(attempt_dir)  # claimed, or ended, between our looks
            message = "no supervisor was launched for this attempt (the server stopped before it started it)"
            return AttemptStatus(phase=Phase.UNLAUNCHED, reason="NotLaunched", message=message)
        info = read_json(attempt_dir / claim.PID) or {}
        if claim.held(str(attempt_dir)):
            # The claim is the shim's life (the kernel lets it go when the shim dies, however it dies): held, and
            # no exit record, the shim runs, whatever its pid file seemed to say.
            if (attempt_dir / "exit.json").exists():
                return self.poll(attempt_dir)
            log.warning("%s: its shim holds the claim but %s does not name it (%s)", attempt_dir, claim.PID, info)
            phase = Phase.RUNNING if status.get("phase") in ("running", "finishing") else Phase.STARTING
            return AttemptStatus(phase=phase, running_at=running_at, unbilled_seconds=unbilled)
        if (attempt_dir / "exit.json").exists():
            return self.poll(attempt_dir)
        code = self.exit_code(info)
        if code == EXIT_DISK_FULL:
            return AttemptStatus(
                Phase.LOST, reason="DiskFull", message="disk full: the exit record could not be written"
            )
        tail = ""
        try:
            tail = (attempt_dir / "shim.log").read_text(errors="replace")[-300:].strip()
        except OSError:
            pass
        message = "the job's supervisor (shim) died without recording an exit status"
        log.warning("%s: shim lost: %s, status %s, process now %s", attempt_dir, info, status, self.describe(info))
        return AttemptStatus(Phase.LOST, reason="ShimLost", message=message + (f": {tail}" if tail else ""))

    def alive(self, pid_file: Path) -> bool:
        """Whether the process a pid file (``shim.pid`` or ``launch.json``) names still runs: the same process
        (its start time matches), not a zombie."""
        info = read_json(pid_file)
        if not info:
            return False
        pid = int(info["pid"])
        with self._children_lock:
            child = self._children.get(pid)
        if child is not None and child.poll() is not None:
            with self._children_lock:  # reaped: the pid may be another process's now (looked at below)
                self._children.pop(pid, None)
                self._exit_codes[pid] = child.returncode
        try:  # its stat file and the boot time read, no more (psutil took twice as long, on every poll)
            started, state = claim.process_state(pid)
        except (OSError, ValueError, IndexError):
            return False
        if info.get("create_time") and abs(started - float(info["create_time"])) > SAME_START_SECONDS:
            return False  # the pid was reused by another process
        return state != "Z"

    def describe(self, info: dict[str, Any]) -> str:
        """What runs now under a pid file's pid (for the log of a shim found dead)."""
        try:
            proc = psutil.Process(int(info.get("pid") or 0))
            with proc.oneshot():
                return f"{proc.name()} started {proc.create_time():.2f}, {proc.status()}, session {os.getsid(proc.pid)}"
        except (psutil.Error, OSError, ValueError):
            return "none"

    def reap(self) -> None:
        """Forget the fresh-interpreter shims that exited (an attempt's end was read from its record)."""
        with self._children_lock:
            for pid, child in list(self._children.items()):
                if child.poll() is not None:
                    self._children.pop(pid, None)

    def exit_code(self, info: dict[str, Any]) -> int | None:
        """The exit code of a shim this launcher started as a fresh interpreter, once (None: unknown)."""
        with self._children_lock:
            return self._exit_codes.pop(int(info.get("pid", 0)), None)


def still_its_session(shim: dict[str, Any]) -> bool:
    """Whether the session a shim led (its id is the shim's pid) can still be only that shim's.

    The kernel hands out a pid again only once no process holds it as its id, group or session: while what a dead
    shim left running lives, its session id is not reused. Once they are gone it may be, by any process that
    starts a session (another job's shim: pids wrap at 32,768 on many machines, within minutes on a busy one),
    and killing "the session" then killed that job. A live process with the shim's pid is the shim only when its
    start time is the one the shim recorded."""
    try:
        started = psutil.Process(int(shim["pid"])).create_time()
    except psutil.NoSuchProcess:
        return True  # the shim is gone: its session id is held by what it left, or by nothing
    except (psutil.Error, KeyError, ValueError):
        return False
    return abs(started - float(shim.get("create_time") or 0)) <= SAME_START_SECONDS

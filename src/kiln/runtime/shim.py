"""The per-job supervisor ("shim") of the local executor.

Started once per attempt, in its own session, as ``python -I -S shim.py ATTEMPT_DIR``: standard library only,
so it starts in milliseconds and stays small. It outlives the server (a restarted server re-attaches by reading
the files below) and is the only parent of the job's processes.

It reads ``ATTEMPT_DIR/shim.json`` (and, on SIGTERM, the optional ``stop.json``) and writes:
- ``shim.pid``     its pid (first thing it does);
- ``status.json``  phase (preparing → running → finishing) and the job's process group;
- ``exit.json``    the outcome, written atomically and fsynced: the durable record of how the attempt ended;
- the job log      lines ``<time> <O|E|K> <text>`` appended to the log path it is given.
It sends a datagram to the server's notify socket on every phase change; that only wakes the server early,
the files stay the truth.

``shim.json`` may carry ``"procs": [{env overrides}, ...]``: with more than one entry the command is started
once per entry, concurrently (the processes of one worker of a distributed job, as ``torchrun
--nproc-per-node`` starts them), each with its overrides merged over ``env``. Their output lines are prefixed
``[RANK] `` (the override's ``RANK``, else the process's index); the first to fail stops the others (SIGTERM,
the grace, SIGKILL) and its exit code is the command's; all succeeding is 0. One entry only adds to ``env``.

``stop.json``, written by the executor before it sends SIGTERM: ``{"reason": "Preempted", "message": "...",
"grace": 30}``. Its grace (seconds from SIGTERM to the job's processes to SIGKILL) replaces the configured one,
and its reason and message are recorded in ``exit.json``; every field is optional. Without it a SIGTERM is a
cancel: reason ``Cancelled``, the configured grace. A stopped attempt does not run its finish_command.

``shim.json`` may carry ``"metrics": {"dir", "builtin", "patterns", "tensorboard_dir", "system",
"system_interval"}``: then daemon threads (``extract.py``, loaded only then) tail this attempt's part of the log
for metrics, poll TensorBoard event files and sample the process tree, writing spool files into ``dir``. They
read at their own pace, so they never slow the job down; at the end what is left of the log is drained, for at
most a few seconds, before ``exit.json`` is written.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

EXIT_DISK_FULL = 75
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
POLL_SECONDS = 0.25
PR_SET_CHILD_SUBREAPER = 36


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
    """Allocate the exit record's blocks up front so that it can still be written on a full disk."""
    with open(path + ".tmp", "wb") as fh:
        fh.write(b" " * EXIT_RESERVE)
        fh.flush()
        os.fsync(fh.fileno())


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


def proc_table() -> dict[int, tuple[int, int]]:
    """pid → (parent pid, session id) for every process we can see."""
    out: dict[int, tuple[int, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if fields[0] == b"Z":
            continue  # a zombie is dead already; it only waits to be reaped
        out[int(name)] = (int(fields[1]), int(fields[3]))
    return out


def _seconds(value: object, default: float, most: float) -> float:
    return min(most, max(0.0, float(value))) if isinstance(value, int | float) else default


def load_extract() -> Any:
    """The metrics module, next to this file; only imported when an attempt wants metrics."""
    if __package__:
        from kiln.runtime import extract
    else:  # run as a script with -I: its own directory is not on sys.path
        here = os.path.dirname(os.path.abspath(__file__))
        if here not in sys.path:
            sys.path.append(here)
        import extract  # type: ignore[no-redef]
    return extract


def load_stage() -> Any:
    """The dataset staging module, next to this file; only imported when an attempt has inputs."""
    if __package__:
        from kiln.runtime import stage
    else:
        here = os.path.dirname(os.path.abspath(__file__))
        if here not in sys.path:
            sys.path.append(here)
        import stage  # type: ignore[no-redef]
    return stage


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return 0


class DiskFull(Exception):
    pass


class Shim:
    def __init__(self, attempt_dir: str) -> None:
        self.dir = attempt_dir
        with open(os.path.join(attempt_dir, "shim.json")) as fh:
            self.cfg = json.load(fh)
        self.me = os.getpid()
        self.sid = os.getsid(0)
        self.cancelled = False
        self.cancel_reason = ""
        self.log_fd = -1
        # A distributed job's members share the job's log; each tags its streams (O@worker1) so they stay apart.
        self.stream_tag = "@" + self.cfg["log_tag"] if self.cfg.get("log_tag") else ""
        self.children: list[subprocess.Popen] = []  # the step's processes: one, or one per entry of "procs"
        self.child_index: dict[int, int] = {}  # pid → index in children
        self.exit_order: list[int] = []  # indices of children in the order they were reaped
        self.pipes: dict[int, list] = {}  # fd → [stream, line prefix, partial line] while a step runs
        self.sel: selectors.BaseSelector | None = None
        self.stop_info: tuple[str, str, float] | None = None  # (reason, message, grace) of a stop request
        self.stopped_as = ""  # the reason recorded when a stop request ended a step
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self.notify_path = self.cfg.get("notify_socket")
        self.notify_sock: socket.socket | None = None
        self.metrics: Any = None  # extract.Metrics when the attempt collects metrics
        self.stage_stop = threading.Event()  # set by a stop request while inputs are being staged
        self.stage_holder = ""  # this attempt's name in the data cache's in-use records, once it staged

    # -- plumbing -------------------------------------------------------------------------------------

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
        self.write_log(format_line(stream + self.stream_tag, data))

    def log_lines(self, stream: str, lines: list[bytes]) -> None:
        """Several lines of one read, with one timestamp and one write."""
        if len(lines) == 1:
            self.log(stream, lines[0])
            return
        head = timestamp(time.time()).encode() + b" " + (stream + self.stream_tag).encode() + b" "
        self.write_log(b"".join(head + line.rstrip(b"\n") + b"\n" for line in lines))

    def write_log(self, data: bytes) -> None:
        try:
            os.write(self.log_fd, data)
        except OSError as exc:
            if exc.errno in (28, 122):  # ENOSPC, EDQUOT
                raise DiskFull(str(exc)) from exc
            raise

    def say(self, text: str) -> None:
        """A line from the shim itself: best effort, so a full disk fails only jobs whose own output is lost."""
        try:
            self.log("K", text.encode())
        except (DiskFull, OSError):
            pass

    def status(self, phase: str, **extra: object) -> None:
        data = {"phase": phase, "time": time.time(), "shim_pid": self.me, **extra}
        write_json_atomic(os.path.join(self.dir, "status.json"), data)
        if phase == "running":  # the only phase change the server acts on before the exit
            self.notify(phase)

    def on_child(self, _signum: int, _frame: object) -> None:
        try:
            os.write(self.wake_w, b"c")
        except OSError:
            pass

    def on_signal(self, signum: int, _frame: object) -> None:
        self.cancelled = True
        self.stage_stop.set()
        self.cancel_reason = self.cancel_reason or f"signal {signal.Signals(signum).name}"
        try:
            os.write(self.wake_w, b"x")
        except OSError:
            pass

    # -- process tree ---------------------------------------------------------------------------------

    def tree(self) -> list[int]:
        """Every process of this job: our session, plus anything re-parented to us (we are a subreaper)."""
        table = proc_table()
        members = {p for p, (ppid, sid) in table.items() if (sid == self.sid or ppid == self.me)}
        members.discard(self.me)
        grew = True
        while grew:
            extra = {p for p, (ppid, _) in table.items() if ppid in members and p not in members}
            members |= extra
            grew = bool(extra)
        return sorted(members)

    def signal_tree(self, sig: int) -> None:
        for child in self.children:
            try:
                os.killpg(child.pid, sig)
            except OSError:
                pass
        for pid in self.tree():
            try:
                os.kill(pid, sig)
            except OSError:
                pass

    def kill_tree(self, grace: float) -> None:
        """SIGTERM everything, wait up to ``grace`` seconds, then SIGKILL what is left."""
        self.signal_tree(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            self.reap()
            if not self.tree():
                return
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
            self.drain()  # what the processes print while they shut down still reaches the log
        self.signal_tree(signal.SIGKILL)
        for _ in range(40):
            self.reap()
            if not self.tree():
                return
            time.sleep(0.05)
            self.drain()

    def reap(self) -> None:
        """Collect every exited child: the tracked one (its status goes to its Popen) and adopted orphans."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            index = self.child_index.get(pid)
            if index is not None:
                self.children[index].returncode = os.waitstatus_to_exitcode(status)
                self.exit_order.append(index)

    def running(self) -> bool:
        return any(child.returncode is None for child in self.children)

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

    # -- steps ----------------------------------------------------------------------------------------

    def run_step(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        deadline: float | None,
        procs: list[dict] | None = None,
    ) -> tuple[int, str]:
        """Run one step, streaming its output into the log. Returns (exit code, reason or "").

        ``procs`` (two or more env overrides): run the step once per entry, concurrently.
        """
        self.children, self.child_index, self.exit_order = [], {}, []
        if procs:
            envs = [dict(env, **{str(k): str(v) for k, v in extra.items()}) for extra in procs]
            prefixes = [f"[{extra.get('RANK', i)}] ".encode() for i, extra in enumerate(procs)]
        else:
            envs, prefixes = [env], [b""]
        try:
            for proc_env in envs:
                child = subprocess.Popen(
                    argv,
                    cwd=self.cfg["work_dir"],
                    env=proc_env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    process_group=0,
                    close_fds=True,
                )
                self.child_index[child.pid] = len(self.children)
                self.children.append(child)
        except OSError as exc:
            if self.children:  # a later process failed to start: stop the ones that did
                self.kill_tree(0.0)
                self.children, self.child_index = [], {}
            if isinstance(exc, FileNotFoundError):
                self.say(f"{name}: command not found: {argv[0]}")
                return 127, "CommandNotFound"
            if isinstance(exc, PermissionError):
                self.say(f"{name}: permission denied: {argv[0]}")
                return 126, "CommandNotFound"
            self.say(f"{name}: cannot start {argv[0]}: {exc.strerror}")
            return 126, "Error"
        first = self.children[0]
        if name == "command":
            extra = {"child_pids": [c.pid for c in self.children]} if procs else {}
            self.status("running", child_pid=first.pid, pgid=first.pid, running_at=time.time(), **extra)
            try:  # off the start-up path, but before the job can fill the disk
                reserve_exit_record(os.path.join(self.dir, "exit.json"))
            except OSError:
                pass
        reason = self.pump(deadline, prefixes)
        if procs:
            for child in self.children:
                child.wait()
            order = self.exit_order + [i for i in range(len(self.children)) if i not in self.exit_order]
            codes = [self.children[i].returncode for i in order]
            code = next((c for c in codes if c), 0)
        else:
            code = first.wait()
        if code < 0:
            code = 128 - code
        self.children, self.child_index = [], {}
        if reason:
            return code, reason
        if code == 127 and name != "finish":
            return code, "CommandNotFound"
        return code, ""

    def read_pipe(self, fd: int) -> bool:
        """Read what one of the step's pipes holds into the log; False when it had nothing (or closed)."""
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return False
        entry = self.pipes[fd]
        stream, prefix, partial = entry
        if not data:
            if partial:
                self.log(stream, prefix + partial if prefix else partial)
            if self.sel is not None:
                self.sel.unregister(fd)
            del self.pipes[fd]
            return False
        lines = (partial + data).split(b"\n")
        entry[2] = lines.pop()
        if lines:
            self.log_lines(stream, [prefix + line for line in lines] if prefix else lines)
        if len(entry[2]) > 65536:
            self.log(stream, prefix + entry[2] if prefix else entry[2])
            entry[2] = b""
        return True

    def drain(self) -> None:
        """Copy what the step's pipes hold now into the log, without waiting (bounded per call)."""
        for fd in list(self.pipes):
            for _ in range(16):
                if fd not in self.pipes or not self.read_pipe(fd):
                    break

    def pump(self, deadline: float | None, prefixes: list[bytes]) -> str:
        """Copy the children's output into the log until they exit; enforce timeout, memory limit and cancel.

        Sleeps in select() until output, a signal (SIGCHLD, SIGTERM) or a deadline: an idle job costs nothing.
        With several children the first to fail stops the others.
        """
        sel = self.sel = selectors.DefaultSelector()
        for child, prefix in zip(self.children, prefixes, strict=True):
            assert child.stdout and child.stderr
            for pipe, stream in ((child.stdout, "O"), (child.stderr, "E")):
                fd = pipe.fileno()
                os.set_blocking(fd, False)
                sel.register(fd, selectors.EVENT_READ)
                self.pipes[fd] = [stream, prefix, b""]
        sel.register(self.wake_r, selectors.EVENT_READ)
        limit = self.cfg.get("memory_limit")
        grace = float(self.cfg.get("grace", 10))
        several = len(self.children) > 1
        failed_fast = False
        reason = ""
        next_check = time.monotonic() + POLL_SECONDS if limit else None
        exited_at: float | None = None
        pipes = self.pipes
        try:
            while pipes or self.running():
                now = time.monotonic()
                timers = [t for t in (next_check, deadline, exited_at and exited_at + 0.5) if t]
                if not pipes:
                    timers.append(now + 0.05)
                wait = max(0.0, min(timers) - now) if timers else None
                for key, _ in sel.select(wait):
                    fd = int(key.fd)  # type: ignore[call-overload]
                    if fd == self.wake_r:
                        os.read(fd, 64)
                    elif fd in pipes:
                        self.read_pipe(fd)
                self.reap()
                now = time.monotonic()
                if exited_at is None and not self.running():
                    exited_at = now
                if exited_at is not None and pipes and now >= exited_at + 0.5:
                    # The command ended but something it started still holds its output open: the attempt is
                    # over, so stop what is left (as a container runtime does when PID 1 exits).
                    self.say("the command exited; stopping processes it left running")
                    self.kill_tree(min(grace, 2.0))
                    exited_at = float("inf")
                if reason:
                    continue
                if self.cancelled:
                    reason, message, stop_grace = self.stop_request()
                    if reason == "Cancelled" and stop_grace == grace:
                        self.say(f"cancelling ({self.cancel_reason}): stopping the process tree")
                    else:
                        self.say(f"stopping ({reason}: {message}): SIGTERM now, SIGKILL after {stop_grace:g}s")
                    self.stopped_as = reason
                    self.kill_tree(stop_grace)
                    continue
                if deadline is not None and now >= deadline:
                    self.say(f"timeout: the run exceeded {self.cfg['timeout']:g}s; stopping it")
                    reason = "Timeout"
                    self.kill_tree(grace)
                    continue
                if several and not failed_fast and self.exit_order and self.running():
                    failed = [i for i in self.exit_order if self.children[i].returncode]
                    if failed:
                        failed_fast = True
                        code = self.children[failed[0]].returncode or 0
                        self.say(
                            f"process {prefixes[failed[0]].decode().strip()} exited with "
                            f"{128 - code if code < 0 else code}; stopping the other processes"
                        )
                        self.kill_tree(grace)
                        continue
                if next_check is not None and now >= next_check:
                    next_check = now + POLL_SECONDS
                    used = sum(rss_bytes(p) for p in self.tree())
                    if used > limit:
                        self.say(f"memory limit exceeded: {used} bytes in use > limit {limit}; killing")
                        reason = "OOMKilled"
                        self.kill_tree(0.0)
        finally:
            sel.close()
            self.sel = None
            self.pipes = {}
        return reason

    # -- runtime and code -----------------------------------------------------------------------------

    def build_runtime(self, spec: dict) -> None:
        """Build a managed virtualenv once; concurrent jobs wait on a lock and reuse it."""
        import fcntl
        import shutil

        venv = spec["venv"]
        ready = os.path.join(venv, ".kiln-ready")
        if os.path.exists(ready):
            return
        os.makedirs(os.path.dirname(venv), exist_ok=True)
        with open(venv + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if os.path.exists(ready):
                return
            self.say(f"building runtime {spec['name']} (first use): {' '.join(spec['packages']) or 'no packages'}")
            shutil.rmtree(venv, ignore_errors=True)
            env = dict(self.cfg["env"], **spec.get("env", {}))
            env.pop("PIP_TARGET", None)
            env.pop("PYTHONPATH", None)
            steps = [[spec["base_python"], "-m", "venv", venv]]
            if spec["packages"]:
                steps.append(
                    [
                        os.path.join(venv, "bin", "python"),
                        "-m",
                        "pip",
                        "install",
                        "--disable-pip-version-check",
                        "--no-input",
                        "--progress-bar",
                        "off",
                        *spec["packages"],
                    ]
                )
            for argv in steps:
                code, reason = self.run_step("runtime", argv, env, None)
                if code != 0 or reason:
                    shutil.rmtree(venv, ignore_errors=True)
                    raise RuntimeError(f"building runtime {spec['name']} failed: {' '.join(argv[:4])}… exited {code}")
            with open(ready, "w") as fh:
                json.dump({"packages": spec["packages"], "built_at": time.time()}, fh)
            self.say(f"runtime {spec['name']} ready")

    def extract_code(self) -> None:
        archive = self.cfg.get("code_archive")
        work = self.cfg["work_dir"]
        os.makedirs(work, exist_ok=True)
        if not archive:
            return
        import tarfile

        with tarfile.open(archive, "r:*") as tar:
            # The "data" filter refuses absolute paths, "..", links leaving the tree and device files.
            tar.extractall(work, filter="data")

    # -- main -----------------------------------------------------------------------------------------

    def main(self) -> int:
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, self.on_child)
        try:
            import ctypes

            ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        except (OSError, AttributeError):
            pass
        cfg = self.cfg
        outcome: dict = {"exit_code": None, "reason": "", "message": ""}
        exit_path = os.path.join(self.dir, "exit.json")
        try:
            self.log_fd = os.open(cfg["log_path"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            if cfg.get("metrics"):
                self.start_metrics()
            outcome = self.run_attempt()
        except DiskFull as exc:
            self.kill_tree(1.0)
            message = f"disk full: the job's output could not be written to its log ({exc})"
            outcome = {"exit_code": None, "reason": "DiskFull", "message": message}
        except Exception as exc:  # the shim must always leave an exit record
            self.kill_tree(1.0)
            reason = "CodeError" if "tar" in type(exc).__module__ else "Error"
            if isinstance(exc, RuntimeError) and "runtime" in str(exc):
                reason = "RuntimeError"
            outcome = {"exit_code": None, "reason": reason, "message": f"{type(exc).__name__}: {exc}"}
            try:
                self.say(outcome["message"])
            except Exception:
                pass
        outcome["finished_at"] = time.time()
        self.release_inputs()
        marker = self.stop_metrics()
        try:
            write_exit_record(exit_path, outcome)
        except OSError:
            self.notify("exited")
            self.finish_metrics(marker)
            return EXIT_DISK_FULL
        self.notify("exited")
        self.finish_metrics(marker)
        return 0

    def start_metrics(self) -> None:
        """Start the metrics threads (best effort: metrics never fail an attempt)."""
        try:
            extract = load_extract()
            self.metrics = extract.Metrics(self.cfg, self.tree, os.fstat(self.log_fd).st_size)
            # The threads share the interpreter with the loop copying the job's output: hand it back sooner.
            sys.setswitchinterval(0.0005)
            self.metrics.start()
        except Exception as exc:
            self.metrics = None
            self.say(f"metrics collection could not start: {type(exc).__name__}: {exc}")

    def stop_metrics(self) -> str | None:
        """Drain what is left of the log into metrics for a few seconds (the exit record waits that long). When
        the drain needs longer (a job that flooded its log), it goes on after the exit record: returns the marker
        file that says so to the server's ingester (created here, before the exit record). Never raises."""
        if self.metrics is None:
            return None
        try:
            mc = self.cfg["metrics"]
            drain = _seconds(mc.get("drain_seconds"), 5.0, 30.0)
            limit = _seconds(mc.get("drain_limit_seconds"), 600.0, 3600.0)
            if self.metrics.stop(drain, limit):
                return None
            marker = self.metrics.draining_marker()
            with open(marker, "w") as fh:
                fh.write(str(os.getpid()))
            return marker
        except BaseException:
            return None

    def finish_metrics(self, marker: str | None) -> None:
        """After the exit record: the rest of a long drain, then the marker goes. Never raises."""
        if marker is None or self.metrics is None:
            return
        try:
            self.metrics.wait()
        except BaseException:
            pass
        try:
            os.unlink(marker)
        except OSError:
            pass

    def run_attempt(self) -> dict:
        cfg = self.cfg
        env = cfg["env"]
        self.status("preparing")
        self.say(f"attempt {cfg['attempt']} starting")
        os.makedirs(cfg["work_dir"], exist_ok=True)
        if cfg.get("runtime_build"):
            self.build_runtime(cfg["runtime_build"])
        self.extract_code()
        if cfg.get("inputs"):
            failed = self.stage_inputs(env)
            if failed is not None:
                return failed
        deadline = time.monotonic() + cfg["timeout"] if cfg.get("timeout") else None
        code, reason = 0, ""
        if cfg.get("prepare"):
            code, reason = self.run_step("prepare", cfg["prepare"], env, deadline)
            if code != 0 and not reason:
                reason = "PrepareFailed"
            if code != 0 or reason:
                self.status("running", child_pid=None, pgid=None, running_at=time.time())
                if reason and reason == self.stopped_as:
                    return self.finish(code, reason, self.stop_request()[1])
                return self.finish(code, reason, f"prepare_command exited with {code}")
        if self.cancelled:
            self.status("running", child_pid=None, pgid=None, running_at=time.time())
            stop_reason, stop_message, _ = self.stop_request()
            self.stopped_as = stop_reason
            return self.finish(None, stop_reason, stop_message)
        procs = cfg.get("procs") or None
        if procs and len(procs) == 1:
            env, procs = dict(env, **{str(k): str(v) for k, v in procs[0].items()}), None
        code, reason = self.run_step("command", cfg["command"], env, deadline, procs)
        argv = cfg["command"]
        shown = argv[-1] if argv[:2] == ["/bin/sh", "-c"] else argv[0]
        messages = {
            "CommandNotFound": f"command not found: {shown}",
            "Timeout": f"timed out after {cfg.get('timeout')}s",
            "OOMKilled": f"memory limit of {cfg.get('memory_limit')} bytes exceeded",
            "Cancelled": self.cancel_reason,
        }
        if reason and reason == self.stopped_as:
            return self.finish(code, reason, self.stop_request()[1])
        return self.finish(code, reason, messages.get(reason, f"exited with {code}"))

    def stage_inputs(self, env: dict) -> dict | None:
        """Make the job's datasets available (read-only, from the machine's cache) before anything of it runs;
        an outcome when that fails or the attempt is stopped meanwhile, None when the job may go on."""
        cfg = self.cfg
        stage = load_stage()
        self.status("staging")
        holder = f"{cfg['job_id']}-{cfg['attempt']}-{cfg.get('log_tag') or 'worker0'}"
        self.stage_holder = holder
        try:
            added = stage.stage_inputs(
                cfg["inputs"], cfg["data_cache"], cfg["work_dir"], log=self.say, stop=self.stage_stop, holder=holder
            )
        except stage.StageStopped:
            stop_reason, stop_message, _ = self.stop_request()
            self.stopped_as = stop_reason
            return {"exit_code": None, "reason": stop_reason, "message": stop_message}
        except stage.StageError as exc:
            self.say(f"staging inputs failed: {exc}")
            return {"exit_code": None, "reason": "InputError", "message": str(exc)}
        env.update(added)
        return None

    def release_inputs(self) -> None:
        if not self.stage_holder:
            return
        try:
            load_stage().release(self.cfg["data_cache"], self.stage_holder)
        except Exception:
            pass  # a stale in-use record is ignored once this process is gone

    def finish(self, code: int | None, reason: str, message: str) -> dict:
        cfg = self.cfg
        if code is not None and code != 0 and not reason:
            reason = "Error"
        if cfg.get("finish") and reason != "Cancelled" and not (reason and reason == self.stopped_as):
            self.status("finishing")
            env = dict(cfg["env"], KILN_EXIT_CODE=str(code if code is not None else -1))
            fcode, freason = self.run_step("finish", cfg["finish"], env, time.monotonic() + 3600)
            if (fcode != 0 or freason) and not reason:
                reason, message = "FinishFailed", f"finish_command exited with {fcode}"
        self.say(f"attempt {cfg['attempt']} ended: {reason or 'Completed'} (exit code {code})")
        return {"exit_code": code, "reason": reason or "Completed", "message": message if reason else ""}


def spawn_shim(attempt_dir: str) -> int:
    """Fork one shim (from the launcher) into its own session; returns its pid in the parent."""
    pid = os.fork()
    if pid:
        return pid
    code = 70
    try:
        os.setsid()
        out = os.open(os.path.join(attempt_dir, "shim.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.closerange(3, 256)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        code = Shim(attempt_dir).main()
    except BaseException as exc:  # never return into the launcher's loop
        try:
            os.write(2, f"shim failed to start: {type(exc).__name__}: {exc}\n".encode())
        except OSError:
            pass
    finally:
        os._exit(code)


def launcher() -> int:
    """A fork server: the shim's imports are paid once, and each job's shim is a fork of this process.

    Reads one attempt directory per line on stdin and answers with the new shim's pid on stdout. Exits when
    stdin closes (the server went away); the shims it started carry on in their own sessions.
    """
    # What a shim may import later is imported once here, so that every forked shim has it already.
    import ctypes  # noqa: F401
    import fcntl  # noqa: F401
    import select
    import shutil  # noqa: F401
    import tarfile  # noqa: F401

    try:  # the metrics threads' modules (a shim imports them only when its attempt collects metrics)
        import threading  # noqa: F401

        extract = load_extract()
        extract._tbreader()
    except Exception:
        pass

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    buf = b""
    while True:
        ready, _, _ = select.select([0], [], [], 1.0)
        while True:  # reap shims that ended
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        if not ready:
            continue
        data = os.read(0, 65536)
        if not data:
            return 0
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                answer = str(spawn_shim(line.decode()))
            except OSError as exc:
                answer = f"error {exc}"
            os.write(1, (answer + "\n").encode())


if __name__ == "__main__":
    if sys.argv[1] == "--launcher":
        sys.exit(launcher())
    sys.exit(Shim(sys.argv[1]).main())

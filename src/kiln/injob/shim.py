"""The per-job supervisor ("shim") of the local executor.

Started once per attempt, in its own session, as ``python -I -S shim.py ATTEMPT_DIR``: standard library only,
so it starts in milliseconds and stays small. It outlives the server (a restarted server re-attaches by reading
the files below) and is the only parent of the job's processes.

It reads ``ATTEMPT_DIR/shim.json`` (and, on SIGTERM, the optional ``stop.json``) and writes:
- ``shim.pid``     its pid, once it holds the attempt's claim (``claim.py``: the first thing it does; a shim that
                   finds the attempt claimed by another or already ended exits at once, writing nothing);
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

The ``Shim`` class and the script entry point live here; the rest is split by responsibility into modules next to
this one, standard library only as well: ``shimio.py`` (log lines, status and exit records, notifications, stop
requests), ``proctree.py`` (the job's process tree: signalling, killing, reaping, memory), ``shimprep.py``
(runtime, code, input datasets and the metrics glue), ``shimbox.py`` (the job's sandbox and the limits on what it
holds: memory with its /dev/shm and /tmp, disk) and ``shimfork.py`` (the launcher: a fork server whose fork is
each attempt's shim). Like ``extract.py`` they are loaded as
``kiln.injob.<name>`` in the package, or as plain modules from this file's directory when the shim runs as a
script; what other code imports from ``kiln.injob.shim`` is re-exported here.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from typing import Any

if __package__:
    from kiln.injob import claim, netns, proctree, sandbox, shimbox, shimfork, shimio, shimlimits, shimprep
else:  # run as a script with -I: its own directory is not on sys.path
    _here = os.path.dirname(os.path.abspath(__file__))
    if _here not in sys.path:
        sys.path.append(_here)
    import claim  # type: ignore[no-redef]
    import netns  # type: ignore[no-redef]
    import proctree  # type: ignore[no-redef]
    import sandbox  # type: ignore[no-redef]
    import shimbox  # type: ignore[no-redef]
    import shimfork  # type: ignore[no-redef]
    import shimio  # type: ignore[no-redef]
    import shimlimits  # type: ignore[no-redef]
    import shimprep  # type: ignore[no-redef]

# The pieces in the modules next to this one, used here and imported from here by other modules and the tests.
EXIT_DISK_FULL = shimio.EXIT_DISK_FULL
EXIT_RESERVE = shimio.EXIT_RESERVE
DiskFull = shimio.DiskFull
format_line = shimio.format_line
reserve_exit_record = shimio.reserve_exit_record
timestamp = shimio.timestamp
write_exit_record = shimio.write_exit_record
write_json_atomic = shimio.write_json_atomic
PAGE_SIZE = proctree.PAGE_SIZE
PR_SET_CHILD_SUBREAPER = proctree.PR_SET_CHILD_SUBREAPER
proc_table = proctree.proc_table
reaped = proctree.reaped
rss_bytes = proctree.rss_bytes
load_extract = shimprep.load_extract
load_stage = shimprep.load_stage

POLL_SECONDS = 0.25
DISK_POLL_SECONDS = 2.0  # at least; a scan that takes long is spaced out further (see pump)


class Shim(shimprep.Preparation, shimbox.SandboxLimits, shimlimits.JobLimits):
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
        self.metrics_started = False  # they start once its first step runs (off the way to the command's start)
        self.stage_stop = shimio.StopFlag()  # set by a stop request while inputs are being staged
        self.stage_holder = ""  # this attempt's name in the data cache's in-use records, once it staged
        self.helpers: set[int] = set()  # processes serving the job that are not the job's (a FUSE mount's daemon)
        self.box: dict | None = self.cfg.get("sandbox")  # runtime/sandbox.py: the job's steps run in it
        self.sandboxed = False  # while a step runs in the sandbox
        self.scratch_tmpfs = False  # the sandbox's /dev/shm and /tmp are a tmpfs counted as memory
        self.steps = 0
        self.input_paths: tuple[str, ...] = ()  # the staged trees the sandbox shows read-only
        self.kill_note = ""
        self.limit_note = ""  # what the last memory or disk check that failed found

    # -- plumbing -------------------------------------------------------------------------------------
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
        self.sandboxed = bool(self.box) and name != "runtime"  # catalog runtimes are built by the shim itself
        seccomp_fd: int | None = None
        if self.sandboxed:
            assert self.box is not None
            self.steps += 1
            tmp = os.path.join(self.box["scratch"], f"tmp-{self.steps}")
            os.mkdir(tmp)
            os.chmod(tmp, 0o1777)
            deferred = sandbox.deferred_env(envs[0])  # never seen by what runs as root (LD_PRELOAD, ...)
            envs = [{k: v for k, v in e.items() if k not in deferred} for e in envs]
            seccomp_fd = sandbox.open_seccomp(self.box)
            argv = sandbox.wrap(
                self.box,
                argv,
                tmp,
                self.input_paths,
                None if self.job_cgroup() else self.cfg.get("disk_limit"),  # else set while the sandbox waits
                rlimit_nproc=self.nproc_fallback(),
                env_after=deferred,
                seccomp_fd=seccomp_fd,
            )
        # The job's steps start in the attempt's control groups (shimlimits.py); a catalog runtime, built for every
        # organisation, does not.
        argv = self.step_argv(argv, envs[0], grouped=name != "runtime", bwrap=self.sandboxed)
        net = self.job_network() if self.sandboxed else None  # raises NetworkError when it could not be made
        self.kill_note = ""
        try:
            for i, proc_env in enumerate(envs):
                if seccomp_fd is not None and i:  # the previous bubblewrap reads (or read) the last one to its end
                    assert self.box is not None
                    sandbox.open_seccomp(self.box, at=seccomp_fd)
                # The sandbox waits until the shim has put it into the job's groups (and set its file size limit).
                join = self.bwrap_join(self.cfg.get("disk_limit"))
                try:
                    with net.entered() if net is not None else contextlib.nullcontext():
                        child = subprocess.Popen(
                            join.argv(argv) if join else argv,
                            cwd=self.cfg["work_dir"],
                            env=proc_env,
                            stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            process_group=0,
                            close_fds=True,
                            pass_fds=(() if seccomp_fd is None else (seccomp_fd,)) + (join.pass_fds if join else ()),
                        )
                except BaseException:
                    if join is not None:
                        join.abandon()
                    raise
                self.child_index[child.pid] = len(self.children)
                self.children.append(child)
                refused = join.admit(child.pid) if join is not None else ""
                if refused:  # it never runs: killed while it waits
                    self.kill_tree(0.0)
                    self.children, self.child_index = [], {}
                    self.say(f"{name}: {refused}")
                    return 125, "Error"
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
        finally:
            if seccomp_fd is not None:
                os.close(seccomp_fd)
        first = self.children[0]
        if name == "command":
            extra = {"child_pids": [c.pid for c in self.children]} if procs else {}
            self.status("running", child_pid=first.pid, pgid=first.pid, running_at=time.time(), **extra)
            try:  # off the start-up path, but before the job can fill the disk
                reserve_exit_record(os.path.join(self.dir, "exit.json"))
            except OSError:
                pass
        if self.cfg.get("metrics") and not self.metrics_started:  # they read the log from the attempt's start
            self.metrics_started = True
            self.start_metrics()
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
        if not reason:
            reason = self.job_limit_after_step()
        if not reason and code:
            reason = self.limit_after_exit(code)
        elif (
            not reason
            and name != "runtime"
            and self.cfg.get("disk_limit")
            and self.disk_exceeded(self.cfg["disk_limit"])
        ):
            # A step that exited 0 between two disk checks: sparse files reach any size at once (issue 43).
            self.say(f"disk limit exceeded: {self.limit_note}")
            reason = "DiskLimitExceeded"
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
        disk_limit = self.cfg.get("disk_limit")
        grace = float(self.cfg.get("grace", 10))
        several = len(self.children) > 1
        failed_fast = False
        reason = ""
        next_check = time.monotonic() + POLL_SECONDS if limit else None
        next_disk = time.monotonic() + POLL_SECONDS if disk_limit else None
        exited_at: float | None = None
        pipes = self.pipes
        try:
            while pipes or self.running():
                now = time.monotonic()
                due = None if reason else self.limits_due()
                timers = [t for t in (next_check, next_disk, due, deadline, exited_at and exited_at + 0.5) if t]
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
                hit = self.job_limit_reached(now)  # the log limit at once, the process limit every 0.25 s
                if hit:
                    self.say(f"{self.job_limit_message(hit)}; killing")
                    reason = hit
                    self.kill_tree(0.0)
                    continue
                if next_check is not None and now >= next_check:
                    next_check = now + POLL_SECONDS
                    if self.memory_exceeded(limit):
                        self.say(f"memory limit exceeded: {self.limit_note}; killing")
                        reason = "OOMKilled"
                        self.kill_tree(0.0)
                        continue
                if next_disk is not None and now >= next_disk:
                    took = time.monotonic()
                    exceeded = self.disk_exceeded(disk_limit)
                    took = time.monotonic() - took
                    next_disk = time.monotonic() + max(DISK_POLL_SECONDS, 20 * took)
                    if exceeded:
                        self.say(f"disk limit exceeded: {self.limit_note}; killing")
                        reason = "DiskLimitExceeded"
                        self.kill_tree(0.0)
        finally:
            sel.close()
            self.sel = None
            self.pipes = {}
        return reason

    # -- main -----------------------------------------------------------------------------------------

    def main(self) -> int:
        # Before anything else: the attempt is this shim's alone, and not ended (a server that ended it before
        # any shim claimed it left its exit record), or this shim runs nothing.
        self.claim_fd = claim.take(self.dir, self.cfg.get("launch"))
        if self.claim_fd is None:
            print("the attempt is claimed by another shim or has ended: this one runs nothing", file=sys.stderr)
            return claim.EXIT_NOT_CLAIMED
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, self.on_child)
        libc = sandbox._libc()  # loaded by the launcher before it forked this shim
        if libc is not None:
            libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        cfg = self.cfg
        outcome: dict = {"exit_code": None, "reason": "", "message": ""}
        exit_path = os.path.join(self.dir, "exit.json")
        try:
            self.log_fd = os.open(cfg["log_path"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            self.log_start = os.fstat(self.log_fd).st_size  # the attempt's part of the log, read for metrics
            outcome = self.run_attempt()
        except DiskFull as exc:
            self.kill_tree(1.0)
            message = f"disk full: the job's output could not be written to its log ({exc})"
            outcome = {"exit_code": None, "reason": "DiskFull", "message": message}
        except netns.NetworkError as exc:
            self.kill_tree(1.0)
            outcome = {"exit_code": None, "reason": "NetworkError", "message": f"the job's network: {exc}"}
            with contextlib.suppress(Exception):
                self.say(outcome["message"])
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
        outcome["launch"] = cfg.get("launch")
        try:
            self.teardown_sandbox()
        except Exception:
            pass
        try:
            self.teardown_network()
        except Exception:
            pass
        try:
            self.teardown_cgroup()
        except Exception:
            pass
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

    def run_attempt(self) -> dict:
        cfg = self.cfg
        env = cfg["env"]
        self.say(f"attempt {cfg['attempt']} starting")  # status.json waits for the command (or staging)
        os.makedirs(cfg["work_dir"], exist_ok=True)
        self.setup_sandbox()
        self.setup_network()
        if cfg.get("runtime_build"):
            self.build_runtime(cfg["runtime_build"])
        too_big = self.extract_code()
        if too_big:
            return {"exit_code": None, "reason": "DiskLimitExceeded", "message": too_big}
        if cfg.get("inputs"):
            failed = self.stage_inputs(env)
            if failed is not None:
                return failed
            self.input_paths = tuple(v for k, v in env.items() if k.startswith("KILN_INPUT_"))
        self.give_work_dir()
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
        killed = f"; {self.kill_note}" if self.kill_note else ""
        messages = {
            "CommandNotFound": f"command not found: {shown}",
            "Timeout": f"timed out after {cfg.get('timeout')}s{killed}",
            "OOMKilled": self.limit_message("OOMKilled"),
            "DiskLimitExceeded": self.limit_message("DiskLimitExceeded"),
            "PidsLimitExceeded": self.job_limit_message("PidsLimitExceeded"),
            "LogLimitExceeded": self.job_limit_message("LogLimitExceeded"),
            "Cancelled": self.cancel_reason + killed,
        }
        if reason and reason == self.stopped_as:
            return self.finish(code, reason, self.stop_request()[1] + killed)
        return self.finish(code, reason, messages.get(reason, f"exited with {code}"))

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


def run_shim(attempt_dir: str) -> int:
    return Shim(attempt_dir).main()


if __name__ == "__main__":
    if sys.argv[1] == "--launcher":  # the fork server (shimfork.py): each attempt's shim is a fork of it
        sys.exit(shimfork.launcher(run_shim))
    sys.exit(run_shim(sys.argv[1]))

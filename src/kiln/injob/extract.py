"""Metrics from a job without code changes: log extraction, TensorBoard event files and system samples.

Standard library only: the shim imports this (only when its config has ``"metrics"``) and runs it as
``python -I -S``. Everything here ends up as lines in *spool files* in the job's metrics directory, which the
server's ingester reads (complete lines only). One writer per file, named ``<src>-a<attempt>-<member>.jsonl``:

- points: ``{"t": 1764505801.25, "s": 120, "w": "worker0", "m": {"loss": 0.31}, "src": "log"}``
- events: ``{"t": 1764505801.25, "event": "MetricsLagging", "message": "...", "w": "worker0"}``

The pieces are pure and unit-tested on their own, each in its module next to this one (re-exported here):
``recognize`` (built-in recognition of progress lines) and ``Extractor`` (built-in plus custom patterns over a
stream of lines, with carried-over steps and lookahead windows) in ``recognize.py``, ``Spool`` (batched appends)
in ``spool.py``, ``SystemSampler`` in ``sysmetrics.py``; TensorBoard event files are read by ``tbreader.py``.
Like this module, they are loaded as ``kiln.injob.<name>`` in the package or as plain modules from this
file's directory when the shim runs as a script. ``Metrics`` runs them as daemon threads next to the shim's main
loop: a log tail (reading the job's log file at its own pace, so a flood only makes extraction lag), a
TensorBoard poller and a system sampler (started by the log tail when its first sample is due, where there is one:
a job shorter than the interval makes no sample, and pays no thread for it).
"""

from __future__ import annotations

import calendar
import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

if __package__:
    from kiln.injob import recognize as _recognize
    from kiln.injob import spool as _spool
    from kiln.injob import sysmetrics as _sysmetrics
else:  # run by the shim as a script: its directory is on sys.path
    import recognize as _recognize  # type: ignore[no-redef]
    import spool as _spool  # type: ignore[no-redef]
    import sysmetrics as _sysmetrics  # type: ignore[no-redef]

# The pieces next to this module, used here and imported from here by other modules and the tests.
MAX_LINE = _recognize.MAX_LINE
_HINT_BYTES = _recognize._HINT_BYTES
_PLAIN_LINE = _recognize._PLAIN_LINE
Extractor = _recognize.Extractor
recognize = _recognize.recognize
_recognize_plain = _recognize._recognize_plain
_recognize_scan = _recognize._recognize_scan
clean_text = _recognize.clean_text
Spool = _spool.Spool
Watch = _spool.Watch
encode_point = _spool.encode_point
safe_member = _spool.safe_member
spool_path = _spool.spool_path
Nvml = _sysmetrics.Nvml
SystemSampler = _sysmetrics.SystemSampler
visible_gpus = _sysmetrics.visible_gpus

IDLE_SECONDS = 0.2  # the log thread's look at a quiet log when nothing woke it (a line written wakes it at once)
SDK_LOOK_SECONDS = 0.02  # ... with watched metrics: how often kiln.log's spool files are looked at for growth
MAX_SDK_FILES = 1000  # entries of the metrics directory looked at for them
LAG_BYTES = 8 * 1024 * 1024  # backlog of unread log that makes extraction "lagging"
CAUGHT_UP_BYTES = 1024 * 1024  # ... and below which it has caught up again
DRAIN_SECONDS = 5.0  # how long the exit record waits for the drain of what is left of the log
DRAIN_LIMIT_SECONDS = 600.0  # how long the drain goes on after it (marked by a draining-* file); then it gives up
DRAINING_PREFIX = "draining-"  # the marker file: "draining-a<attempt>-<member>" in the metrics directory
READ_CHUNK = 128 * 1024
BUSY_BYTES = 1024 * 1024  # a backlog this big means the job is printing fast: extraction backs off more


# -- the job's log ------------------------------------------------------------------------------------------

_time_cache: dict[str, float] = {}


def log_time(stamp: str) -> float | None:
    """``2026-11-30T12:30:01.123456Z`` → epoch seconds (the shim's log timestamp)."""
    base = stamp[:19]
    seconds = _time_cache.get(base)
    if seconds is None:
        try:
            seconds = float(calendar.timegm(time.strptime(base, "%Y-%m-%dT%H:%M:%S")))
        except ValueError:
            return None
        if len(_time_cache) > 4:
            _time_cache.clear()
        _time_cache[base] = seconds
    frac = stamp[20:26]
    return seconds + int(frac) / 1e6 if frac.isdigit() else seconds


class SdkFiles:
    """The sizes of the spool files ``kiln.log`` writes in the job (``sdk-*.jsonl`` in the metrics directory):
    a job whose watched metrics come from ``kiln.log`` rather than its log wakes the server when they grow."""

    def __init__(self, directory: str) -> None:
        self.dir = directory
        self.sizes: dict[str, int] = {}

    def grew(self) -> bool:
        grown = False
        try:
            # At most the first MAX_SDK_FILES entries: the job writes this directory and could fill it.
            with os.scandir(self.dir) as found:
                entries = list(itertools.islice(found, MAX_SDK_FILES))
        except OSError:
            return False
        for entry in entries:
            if not entry.name.startswith("sdk-"):
                continue
            try:
                size = entry.stat(follow_symlinks=False).st_size
            except OSError:
                continue
            if self.sizes.get(entry.name, 0) < size:
                grown = True
            self.sizes[entry.name] = size
        return grown


class LogTail:
    """Reads the job's log file from an offset, picks this member's O/E lines and feeds the extractor."""

    def __init__(self, path: str, offset: int, member_tag: str, extractor: Extractor, spool: Spool) -> None:
        self.path = path
        self.pos = offset
        self.tag = member_tag.encode()
        self.extractor = extractor
        self.spool = spool
        self.fd = -1
        self.partial = b""
        self.skipping = False  # inside a line longer than MAX_LINE: the rest of it is dropped
        self.lagging = False
        self.lag_bytes = LAG_BYTES

    def size(self) -> int:
        try:
            return os.stat(self.path).st_size
        except OSError:
            return self.pos

    def read_chunk(self, limit: int = READ_CHUNK) -> int:
        """Process up to ``limit`` bytes of new log; returns how many were read (0: nothing new)."""
        if self.fd < 0:
            try:
                self.fd = os.open(self.path, os.O_RDONLY)
            except OSError:
                return 0
        try:
            data = os.pread(self.fd, limit, self.pos)
        except OSError:
            return 0
        if not data:
            return 0
        self.pos += len(data)
        lines = data.split(b"\n")
        tail = lines.pop()
        if lines:
            first = lines[0]
            if self.skipping:
                lines[0] = b""
                self.skipping = False
            else:
                lines[0] = self.partial + first
            self.partial = b""
            for line in lines:
                if line:
                    self.line(line)
        if self.skipping:
            return len(data)
        self.partial += tail
        if len(self.partial) > MAX_LINE + 100:
            self.line(self.partial[: MAX_LINE + 100])
            self.partial = b""
            self.skipping = True
        return len(data)

    def line(self, raw: bytes) -> None:
        parts = raw.split(b" ", 2)
        if len(parts) < 3:
            return
        stream, _, member = parts[1].partition(b"@")
        if member != self.tag or stream not in (b"O", b"E"):
            return
        if not self.extractor.patterns and not _HINT_BYTES.search(parts[2]):
            return  # nothing built-in recognition could take (most lines of a flood)
        t = log_time(parts[0].decode("ascii", "replace")) or time.time()
        text = parts[2][: MAX_LINE + 100].decode("utf-8", "replace")
        for pt, step, metrics in self.extractor.feed(t, text):
            self.spool.add(pt, step, metrics)

    def check_lag(self) -> int:
        """Write MetricsLagging / MetricsCaughtUp as the backlog crosses the thresholds; returns the backlog."""
        backlog = self.size() - self.pos
        if not self.lagging and backlog > self.lag_bytes:
            self.lagging = True
            self.spool.event(
                "MetricsLagging",
                f"metrics extraction is {backlog / 1048576:.1f} MiB behind the log; it catches up at its own pace",
            )
        elif self.lagging and backlog < min(CAUGHT_UP_BYTES, self.lag_bytes // 2):
            self.lagging = False
            self.spool.event("MetricsCaughtUp", "metrics extraction caught up with the log")
        return backlog

    def finish(self) -> None:
        if self.partial and not self.skipping:
            self.line(self.partial)
        self.partial = b""
        for t, step, metrics in self.extractor.flush():
            self.spool.add(t, step, metrics)
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


# -- running it next to the shim ----------------------------------------------------------------------------


def _tbreader() -> Any:
    if __package__:
        from kiln.injob import tbreader
    else:
        import tbreader  # type: ignore[no-redef]  # run by the shim as a script: its directory is on sys.path
    return tbreader


class Metrics:
    """The shim's metrics threads for one attempt, from ``cfg["metrics"]``:
    ``{"dir", "builtin", "patterns", "include", "exclude", "tensorboard_dir", "system", "system_interval"}``."""

    def __init__(self, cfg: dict, tree: Callable[[], list[int]], log_offset: int) -> None:
        mc = cfg["metrics"]
        self.dir = str(mc["dir"])
        self.attempt = cfg.get("attempt", 1)
        self.member = cfg.get("log_tag") or "worker0"
        self.cfg = cfg
        self.mc = mc
        self.tree = tree
        self.log_offset = log_offset
        self.stop_event = threading.Event()
        self.deadline = float("inf")  # when stopping: the drain ends here (monotonic)
        self.threads: list[threading.Thread] = []
        self.tail: LogTail | None = None
        self.say: Callable[[str], None] | None = None  # a line in the job's log (the shim's), for what it must know
        # metrics.watch: those metrics' points are written at once and the server is woken (``on_watched``).
        self.watch = Watch(mc.get("watch"))
        self.on_watched: Callable[[], None] | None = None
        # Set by the shim whenever it appends to the log (and by stop): the log thread reads at once rather than
        # at its next look. Without it an idle job's new line waited up to IDLE_SECONDS to be read.
        self.log_written = threading.Event()
        self.started_at = time.monotonic()
        self.sys_due: float | None = None  # when the log thread starts the system sampler (None: not its to start)

    def spool(self, src: str) -> Spool:
        path = spool_path(self.dir, src, self.attempt, self.member)
        return Spool(path, self.member, src, watch=self.watch, on_watched=self._watched)

    def _watched(self) -> None:
        if self.on_watched is not None:
            self.on_watched()

    def start(self) -> None:
        try:
            os.makedirs(self.dir, exist_ok=True)
        except OSError:
            pass
        mc = self.mc
        self.started_at = time.monotonic()
        logs = bool(mc.get("builtin", True) or mc.get("patterns"))
        if logs:
            self._thread("kiln-metrics-log", self._run_log)
        if mc.get("tensorboard_dir"):
            self._thread("kiln-metrics-tb", self._run_tb)
        if mc.get("system"):
            if logs:  # the log thread starts it when its first sample is due: a shorter job pays no thread for it
                self.sys_due = self.started_at + self._sys_interval()
            else:
                self._thread("kiln-metrics-sys", self._run_sys)

    def _thread(self, name: str, target: Callable[[], None]) -> None:
        def run() -> None:
            try:
                target()
            except BaseException:
                pass  # metrics never take the shim down

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

    def stop(self, timeout: float = DRAIN_SECONDS, limit: float = DRAIN_LIMIT_SECONDS) -> bool:
        """Ask the threads to drain what is left and stop; they give up ``limit`` seconds from now (what is still
        unread then is reported lost). Waits at most ``timeout`` seconds; True when they are done by then (else
        ``wait`` waits for the rest)."""
        start = time.monotonic()
        self.deadline = start + max(timeout, limit)
        self.stop_event.set()
        self.log_written.set()
        for thread in self.threads:
            thread.join(max(0.0, start + timeout - time.monotonic()))
        return not any(thread.is_alive() for thread in self.threads)

    def wait(self) -> None:
        """After ``stop``: until the drain ends (by its deadline, whatever happens)."""
        for thread in self.threads:
            thread.join(max(0.0, self.deadline + 0.5 - time.monotonic()))

    def draining_marker(self) -> str:
        """The file that tells the server's ingester this attempt's spool files are still growing after its
        exit record (the drain goes on); removed when the drain ends."""
        return os.path.join(self.dir, f"{DRAINING_PREFIX}a{self.attempt}-{safe_member(self.member)}")

    # -- the threads --

    def _run_log(self) -> None:
        mc = self.mc
        spool = self.spool("log")
        extractor = Extractor(
            bool(mc.get("builtin", True)),
            mc.get("patterns") or (),
            on_event=spool.event,
            include=mc.get("include") or (),
            exclude=mc.get("exclude") or (),
        )
        tail = self.tail = LogTail(
            self.cfg["log_path"], self.log_offset, self.cfg.get("log_tag") or "", extractor, spool
        )
        if isinstance(mc.get("lag_bytes"), int):
            tail.lag_bytes = mc["lag_bytes"]
        stopping_at: int | None = None  # the log's size when the stop came: the drain reads up to there
        last_size = tail.size()
        sdk_files = SdkFiles(self.dir) if self.watch else None
        try:
            while True:
                if self.sys_due is not None and time.monotonic() >= self.sys_due and not self.stop_event.is_set():
                    self.sys_due = None
                    self._thread("kiln-metrics-sys", self._run_sys)
                self.log_written.clear()  # before reading: a line written from here on sets it again
                if stopping_at is None and self.stop_event.is_set():
                    stopping_at = tail.size()
                if stopping_at is not None:
                    if tail.pos >= stopping_at:
                        break
                    if time.monotonic() >= self.deadline:
                        left = stopping_at - tail.pos
                        spool.event(
                            "MetricsIncomplete",
                            f"the attempt ended with {left} bytes of its log not yet read for metrics; "
                            "their metrics are lost",
                        )
                        break
                began = time.monotonic()
                got = tail.read_chunk()
                backlog = tail.check_lag()
                printing = tail.pos + backlog > last_size  # the job's output is still coming in
                last_size = tail.pos + backlog
                if spool.due():
                    spool.flush()
                if got:
                    if stopping_at is None and printing:
                        # Leave the interpreter to the shim's main loop, which copies the job's output: more so
                        # while the job floods the log (extraction cannot keep up then anyway). Not when the job
                        # has gone quiet (nothing to copy) nor when draining.
                        share = 2.0 if backlog > BUSY_BYTES else 0.25
                        time.sleep(min(0.05, (time.monotonic() - began) * share))
                    continue
                for t, step, metrics in extractor.flush(idle_only=True):
                    spool.add(t, step, metrics)
                if spool.due():
                    spool.flush()
                if sdk_files is not None and sdk_files.grew():
                    self._watched()  # kiln.log wrote a batch (it writes a watched metric's point at once)
                if stopping_at is None:
                    self.log_written.wait(SDK_LOOK_SECONDS if sdk_files is not None else IDLE_SECONDS)
        finally:
            tail.finish()
            if tail.lagging and tail.pos >= tail.size():
                spool.event("MetricsCaughtUp", "metrics extraction caught up with the log")
            spool.close()

    def _run_tb(self) -> None:
        # The shim decodes as root outside the job's CPU quota: at the lowest priority Linux has (SCHED_IDLE, this
        # thread alone), so that its budget is spent on CPU nobody else wants, never taken from the server or the
        # database (a crafted event file doubled another organisation's request latency on PostgreSQL).
        with contextlib.suppress(AttributeError, OSError):
            os.sched_setscheduler(threading.get_native_id(), os.SCHED_IDLE, os.sched_param(0))
        tbreader = _tbreader()
        root = str(self.mc["tensorboard_dir"])
        if not os.path.isabs(root):
            root = os.path.join(self.cfg.get("work_dir") or ".", root)
        spool = self.spool("tb")
        budget = self.mc.get("tensorboard_bytes")  # what the shim (root, outside the job's limits) decodes at most
        cpu = self.mc.get("tensorboard_cpu_seconds")
        # Spent per job, not per attempt: kept in the job's directory (root's alone, beside its metrics dir, which
        # the job writes), one file per member of a gang, read back by the next attempt's shim.
        state = self.mc.get("tensorboard_state") or os.path.join(
            os.path.dirname(os.path.abspath(self.dir)), f"tensorboard-spent-{safe_member(self.member)}.json"
        )
        follower = tbreader.DirectoryFollower(
            root,
            budget if isinstance(budget, int) else None,
            float(cpu) if isinstance(cpu, int | float) else tbreader.DEFAULT_CPU_SECONDS,
            str(state),
        )
        reported: set[str] = set()
        try:
            while True:
                final = self.stop_event.is_set()
                for wall_time, step, name, value in follower.poll(rescan=True, deadline=self.deadline):
                    spool.add(wall_time, step, {name: value})
                for path, problem in [*follower.problems(), ("", follower.limit_note)]:
                    if problem and path not in reported:
                        reported.add(path)
                        message = f"TensorBoard file {path}: {problem}" if path else problem
                        spool.event("MetricsExtractionError", message)
                        if self.say is not None and (not path or problem.startswith("stopped")):
                            said = "its CPU budget" if "of CPU" in message else "KILN_JOB_TENSORBOARD_BYTES"
                            self.say(f"metrics: {message} ({said})")
                spool.flush()
                if final:
                    break
                self.stop_event.wait(1.0)
        finally:
            spool.close()

    def _sys_interval(self) -> float:
        try:
            return max(0.1, float(self.mc.get("system_interval") or 5.0))
        except (TypeError, ValueError):
            return 5.0

    def _run_sys(self) -> None:
        interval = self._sys_interval()
        gpus = visible_gpus(self.cfg.get("env") or {})
        sampler = SystemSampler(self.tree, gpus, Nvml.load() if gpus else None)
        spool = self.spool("sys")
        try:
            # The baseline for the CPU figure is the metrics' start, not a walk of /proc: each process the first
            # sample finds counts from its own start (the shim starts the metrics once the first step runs).
            sampler.prev_time = self.started_at
            wait = max(0.0, self.started_at + interval - time.monotonic())
            while not self.stop_event.wait(wait):
                values = sampler.sample()
                spool.add(time.time(), None, dict(values))
                spool.flush()
                wait = interval
        finally:
            spool.close()

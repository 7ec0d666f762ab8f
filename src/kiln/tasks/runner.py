"""Background work as small tasks of one shape, and the one runner that starts, stops and reports them.

A ``Task`` is a name, an interval, a wake-up (an Event anyone may set to run it now), a lease scope and one
``run_once(ctx)``. With a scope, one server at a time runs it: the runner takes the scope's lease
(kiln.tasks.leases) before each run and hands the fencing token to the run (``ctx.token``). Such a task
writes only through ``ctx.transaction()``, which checks the token inside the transaction of the write, and calls
``ctx.fence()`` right before anything it does outside the database (a backend call, a write to another store):
a holder that stalled past its lease (a paused process, a slow disk) and resumed after another server took the
lease gets ``LeaseLost`` there, writes nothing and calls nothing, and the runner ends its run quietly.
Without a scope every server runs it (work on this machine's files, this process's memory, or rows leased one by
one like the reconciler's jobs).

A task with ``keys`` is one kind of work with a piece per key that is live now (a Kubernetes pod whose log is
followed): the runner reads ``keys()`` every interval (at once when the task is woken) and gives each new key a
thread of its own, which runs ``run_once`` with ``ctx.key`` naming the key as a task's thread runs it, until the key
is gone from ``keys()`` (the work says it is done by taking its key out). Its keys are reported together, as one
task: /readyz and /metrics stay one line per kind of work, however many pods run.

The runner gives each task a daemon thread (and each key of a task with keys one more): no other part of the server
starts a thread for background work. It keeps what each run did (``TaskStatus``: runs, errors, last start and
end, duration, last error, next run, the lease), which ``/readyz`` and ``/metrics`` report. A run that raises (or a
lease that cannot be taken: the database is down) is recorded, logged once per distinct error, and tried again after
a back-off that doubles with each failure in a row up to ``BACKOFF_MAX_SECONDS``; the first run that succeeds ends it.
A new kind of background work is one new task.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from kiln.tasks.db_errors import database_busy, database_outage
from kiln.tasks.leases import Held, TaskLeases

log = logging.getLogger(__name__)

# After a run that raised, a pause before wake-ups count again (then the interval, as after any run): this long (or
# the interval, if shorter) after the first failure, twice as long after each next one in a row, at most
# BACKOFF_MAX_SECONDS: a task whose database (or store, or backend) is gone tries again less and less often, and
# runs again within seconds once it is back.
ERROR_PAUSE = 1.0
BACKOFF_MAX_SECONDS = 5.0


def error_pause(interval: float, failures: int) -> float:
    """The pause after the ``failures``-th failed run in a row (1: the first)."""
    first = min(ERROR_PAUSE, interval)
    return min(BACKOFF_MAX_SECONDS, first * 2 ** min(max(failures - 1, 0), 30))


class LeaseLost(Exception):
    """Another server holds the task's lease now (this run's holder stalled past it): the run stops here, having
    written nothing more (the transaction that found it is rolled back) and called no backend since."""

    def __init__(self, task: str, scope: str, token: int) -> None:
        super().__init__(f"task {task}: another server holds the lease of {scope!r} now (this run's token {token})")


@dataclass
class TaskContext:
    """What one run of a task gets: the fencing token of its lease (None without a scope), whether a wake-up
    (rather than the interval) started it, and the runner's stop event (a long run checks it between items)."""

    name: str
    token: int | None
    woken: bool
    stopping: threading.Event
    _leases: TaskLeases | None = None
    _scope: str | None = None
    key: str = ""  # a task with keys: the key this run is for

    def holds(self) -> bool:
        """Does this server still hold the task's lease with this run's token? Always True without a scope."""
        if self._scope is None or self._leases is None or self.token is None:
            return True
        return self._leases.holds(self._scope, self.token)

    def check(self, s: Session) -> bool:
        """``holds`` inside the writer's own transaction ``s`` (the lease row locked on PostgreSQL until it
        commits): a write after a False here would be a stale holder's."""
        if self._scope is None or self._leases is None or self.token is None:
            return True
        return self._leases.check(s, self._scope, self.token)

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """The one way a task writes: a transaction of the runner's database that first checks the run's fencing
        token (the lease row locked on PostgreSQL until the write commits; SQLite's write lock held already).
        ``LeaseLost``, rolled back, where another server holds the lease now. Without a scope, a plain one."""
        if self._leases is None:
            raise RuntimeError(f"task {self.name}: its runner has no database to write to")
        with self._leases.db.transaction() as s:
            if not self.check(s):
                raise self._lost()
            yield s

    def fence(self) -> None:
        """Call right before an action outside the database (a backend call, a write to another store):
        ``LeaseLost`` where another server holds the lease now, so that a stale holder acts no more."""
        if not self.holds():
            raise self._lost()

    def _lost(self) -> LeaseLost:
        return LeaseLost(self.name, self._scope or "", self.token or 0)


@dataclass
class Task:
    """One kind of background work. ``run_once`` returns None to wait ``interval`` for the next run, or the
    seconds to wait instead (0: a backlog is left, go again at once). ``wake`` runs it before its interval is up
    (set it from anywhere). ``lease_scope``: None, every server runs it; a name, one server at a time.
    ``keys``: a piece of the work per key that ``keys()`` returns now, each run on a thread of its own (see the
    module's docstring); ``wake`` then makes the runner look for new keys at once. Never with a lease scope."""

    name: str
    run_once: Callable[[TaskContext], float | None]
    interval: float
    lease_scope: str | None = None
    wake: threading.Event = field(default_factory=threading.Event)
    first_delay: float = 0.0  # before the first run (0: at once)
    stop: Callable[[], None] | None = None  # called once the thread ended (a last flush)
    interrupt: Callable[[], None] | None = None  # called as the runner stops, to cut a run blocked in I/O short
    join_timeout: float = 10.0
    keys: Callable[[], Collection[str]] | None = None  # a task with keys: the keys live now (quick: no I/O)

    @classmethod
    def of(cls, name: str, work: Callable[[], object], interval: float, **options: Any) -> Task:
        """A task whose run is a plain call (what it returns is not used): housekeeping."""

        def run_once(ctx: TaskContext) -> None:
            work()

        return cls(name, run_once, interval, **options)

    @classmethod
    def writing(cls, name: str, write: Callable[[Session], object], interval: float, lease_scope: str) -> Task:
        """A leased task whose run is one write (a purge of old rows), in the run's fenced transaction."""

        def run_once(ctx: TaskContext) -> None:
            with ctx.transaction() as s:
                write(s)

        return cls(name, run_once, interval, lease_scope=lease_scope)


@dataclass
class TaskStatus:
    """What the runner knows of one task (times are Unix seconds)."""

    name: str
    interval: float
    lease_scope: str | None
    running: bool = False
    runs: int = 0
    errors: int = 0
    last_started: float | None = None
    last_finished: float | None = None
    last_duration: float | None = None
    last_ok: bool | None = None  # did the latest run succeed (None: no run yet)
    last_error: str | None = None  # "Type: message" of the latest run that raised (kept after one succeeds)
    last_error_at: float | None = None
    next_due: float | None = None
    holds_lease: bool | None = None  # None: the task has no scope
    token: int | None = None
    active: int | None = None  # a task with keys: how many of its keys run now (None: a task without keys)
    busy: int = 0  # runs that found the database busy and were tried again (not errors)

    def as_dict(self) -> dict[str, object]:
        def when(t: float | None) -> str | None:
            return None if t is None else datetime.fromtimestamp(t, UTC).isoformat()

        return {
            "name": self.name,
            "running": self.running,
            "interval_seconds": self.interval,
            "lease_scope": self.lease_scope,
            "holds_lease": self.holds_lease,
            "runs": self.runs,
            "errors": self.errors,
            "busy": self.busy,
            "last_run": when(self.last_finished),
            "last_duration_seconds": self.last_duration,
            "last_run_ok": self.last_ok,
            "last_error": self.last_error,
            "last_error_at": when(self.last_error_at),
            "next_run": when(self.next_due),
        }


class TaskRunner:
    """Runs tasks on daemon threads of their own. ``owner`` is this server in the leases (its instance id);
    ``lease_seconds`` how long a scoped task's lease lasts unrenewed (at least twice its interval)."""

    def __init__(self, leases: TaskLeases | None = None, lease_seconds: float = 15.0) -> None:
        self.leases = leases
        self.lease_seconds = lease_seconds
        self._tasks: dict[str, Task] = {}
        self._status: dict[str, TaskStatus] = {}
        self._threads: dict[str, threading.Thread] = {}
        # A task with keys: key → the copy of the task its thread runs (with a wake-up of its own) and that thread.
        # Only the task's own thread changes its entry (under ``_lock``), until ``stop`` has joined that thread.
        self._keyed: dict[str, dict[str, tuple[Task, threading.Thread]]] = {}
        self._held: dict[str, Held] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def add(self, task: Task) -> Task:
        """Register ``task`` (started with the others, or at once when the runner runs already)."""
        if task.name in self._tasks:
            raise ValueError(f"a task named {task.name!r} is registered already")
        if task.lease_scope is not None and task.keys is not None:
            raise ValueError(f"task {task.name!r} has keys: each is this server's, and it can have no lease scope")
        if task.lease_scope is not None and self.leases is None:
            raise ValueError(f"task {task.name!r} has a lease scope, and this runner has no leases")
        self._tasks[task.name] = task
        self._status[task.name] = TaskStatus(
            task.name, task.interval, task.lease_scope, active=None if task.keys is None else 0
        )
        if task.keys is not None:
            self._keyed[task.name] = {}
        if self._threads:
            self._start(task)
        return task

    def start(self) -> None:
        self._stopping.clear()
        for task in self._tasks.values():
            self._start(task)

    def _start(self, task: Task) -> None:
        loop = self._loop if task.keys is None else self._supervise
        thread = threading.Thread(target=loop, args=(task,), name=f"kiln-task-{task.name}", daemon=True)
        self._threads[task.name] = thread
        with self._lock:
            self._status[task.name].running = True
        thread.start()

    def wake(self, name: str) -> None:
        self._tasks[name].wake.set()

    def tasks(self) -> list[Task]:
        """Every registered task, in the order they were added."""
        return list(self._tasks.values())

    def stop(self) -> None:
        """Stop every task: wake each (and ``interrupt`` it, if it says how), wait for its run to end (its
        ``join_timeout``; a task with keys: each key's), give back the leases, then call each task's ``stop``."""
        self._stopping.set()
        with self._lock:
            keys = [copy for keyed in self._keyed.values() for copy, _ in keyed.values()]
        for copy in keys:
            copy.wake.set()
        for task in self._tasks.values():
            task.wake.set()
            if task.interrupt is not None:
                try:
                    task.interrupt()
                except Exception:
                    log.exception("interrupting task %s failed", task.name)
        for name, thread in list(self._threads.items()):
            self._join(name, thread, self._tasks[name].join_timeout)
        # After the tasks' own threads: a task with keys starts no thread for a key once its own has ended.
        for name, keyed in self._keyed.items():
            for key, (copy, thread) in list(keyed.items()):
                copy.wake.set()
                self._join(f"{name}[{key}]", thread, copy.join_timeout)
            keyed.clear()
        self._threads.clear()
        for name, held in list(self._held.items()):
            try:
                if self.leases is not None:
                    self.leases.release(held.scope, held.token)
            except Exception:
                log.exception("giving back the lease of task %s failed", name)
        self._held.clear()
        for task in self._tasks.values():
            with self._lock:
                self._status[task.name].running = False
                if task.keys is not None:
                    self._status[task.name].active = 0
            if task.stop is not None:
                try:
                    task.stop()
                except Exception:
                    log.exception("stopping task %s failed", task.name)

    @staticmethod
    def _join(name: str, thread: threading.Thread, timeout: float) -> None:
        thread.join(timeout=timeout)
        if thread.is_alive():
            log.warning("background task %s did not stop within %.0f s", name, timeout)

    def status(self) -> list[TaskStatus]:
        """A copy of every task's status, in the order they were added."""
        with self._lock:
            return [replace(x) for x in self._status.values()]

    # -- a task with keys: its thread ------------------------------------------------------------------

    def _supervise(self, task: Task) -> None:
        """Look at the task's keys every interval (at once when woken): start a thread for each new one, forget
        those whose thread has ended (its key gone)."""
        keys = task.keys
        if keys is None:  # started only for a task with keys
            return
        keyed = self._keyed[task.name]
        logged: str | None = None
        while not self._stopping.is_set():
            task.wake.clear()  # before reading the keys: a key added after this wakes the wait below
            try:
                live = list(keys())
            except Exception as exc:
                text = f"{type(exc).__name__}: {exc}"
                if text != logged:
                    log.exception("background task %s could not read its keys: %s", task.name, text)
                logged = text
                self._note(task, last_error=text, last_error_at=time.time())
                live = []
            else:
                logged = None
            with self._lock:  # ``stop`` wakes the keys' threads from another thread
                for key, (_, thread) in list(keyed.items()):
                    if not thread.is_alive():
                        del keyed[key]
                for key in live:
                    if key not in keyed and not self._stopping.is_set():
                        keyed[key] = self._start_key(task, key)
                status = self._status[task.name]
                status.active, status.next_due = len(keyed), time.time() + task.interval
            task.wake.wait(task.interval)

    def _start_key(self, task: Task, key: str) -> tuple[Task, threading.Thread]:
        copy = replace(task, wake=threading.Event())  # a wake-up of its own: the task's says "look at the keys"
        thread = threading.Thread(
            target=self._run_key, args=(task, copy, key), name=f"kiln-task-{task.name}[{key}]", daemon=True
        )
        thread.start()
        return copy, thread

    def _run_key(self, task: Task, copy: Task, key: str) -> None:
        try:
            self._loop(copy, key)
        finally:
            task.wake.set()  # the task's thread forgets this key's at once, and counts the rest

    # -- one task's thread (or one key's) ---------------------------------------------------------------

    def _live(self, task: Task, key: str | None) -> bool:
        if self._stopping.is_set():
            return False
        keys = task.keys
        if key is None or keys is None:
            return True
        try:
            return key in keys()
        except Exception:
            return True  # the task's thread logs why the keys cannot be read; this key's work goes on meanwhile

    def _loop(self, task: Task, key: str | None = None) -> None:
        """Run ``task`` until the runner stops (``key``: for that key of a task with keys, until the key is gone).
        A key's runs are recorded in its task's status (runs, errors, last run), not its next run: the task's
        next look at its keys is."""
        label = task.name if key is None else f"{task.name}[{key}]"
        delay = task.first_delay
        logged: str | None = None  # the error last logged: a task failing the same way again logs nothing
        failures = 0  # failed runs in a row: the back-off
        busy = 0  # runs in a row that found the database busy (SQLite's write lock): their back-off
        while self._live(task, key):
            if key is None:
                self._note(task, next_due=time.time() + delay)
            woken = task.wake.wait(delay) if delay > 0 else task.wake.is_set()
            if self._stopping.is_set():
                break
            task.wake.clear()
            clock = time.monotonic()
            try:
                token = self._lease(task)
            except Exception as exc:
                if database_busy(exc):
                    busy += 1
                    self._busy(task, label, exc, busy)
                    delay = task.interval
                    continue
                # The database is down (or failing): nobody can be sure to hold the lease, and the run would fail the
                # same way. A failed run of its own: recorded, logged once, and tried again after the back-off.
                failures += 1
                logged = self._failed(task, label, clock, exc, logged, failures)
                delay = task.interval
                continue
            if task.lease_scope is not None and token is None:
                delay = task.interval  # another server holds it: look again after an interval
                continue
            ctx = TaskContext(task.name, token, woken, self._stopping, self.leases, task.lease_scope, key or "")
            self._note(task, last_started=time.time())
            try:
                after = task.run_once(ctx)
            except LeaseLost as exc:
                # Not an error of this server: it stalled past its lease and another took over. Its next try
                # finds the lease taken (or takes it anew, with a new token, once it is free).
                log.warning("background task %s stopped its run: %s", task.name, exc)
                self._held.pop(task.name, None)
                self._note(task, holds_lease=False, token=None)
                self._finished(task, clock, None)
                failures = 0
                delay = task.interval
                continue
            except Exception as exc:
                if database_busy(exc):
                    # SQLite's write lock was held past the writer's busy timeout: not a failure of the task,
                    # whose transaction was rolled back whole (it resumes from what it committed). It yields the
                    # lock to the others and tries again after the back-off.
                    busy += 1
                    self._busy(task, label, exc, busy)
                    delay = task.interval
                    continue
                failures += 1
                logged = self._failed(task, label, clock, exc, logged, failures)
                delay = task.interval
                continue
            busy = 0
            if logged is not None:
                if logged.startswith("outage: "):  # one line for the outage's end, as for its start
                    log.info("background task %s recovered (%s no more): it runs again", label, logged[8:])
                else:
                    log.info("background task %s runs again", label)
                logged = None
            failures = 0
            self._finished(task, clock, None)
            delay = task.interval if after is None else max(0.0, after)

    def _failed(self, task: Task, label: str, clock: float, exc: Exception, logged: str | None, failures: int) -> str:
        """Record a failed run (or a lease that could not be taken), log it unless it is the error ``logged`` last,
        and pause for the back-off. Returns the error now logged last.

        An error of the database itself (``database_outage``: unreachable, or a lock held past the statement's
        patience) is logged as one line without its traceback, once for as long as the task fails for that reason
        whatever each failure's message (a lost connection, then refused ones): an outage of a minute logged a
        traceback of ~50 lines per task and message. The run that succeeds after it says so (``_loop``)."""
        text = f"{type(exc).__name__}: {exc}"
        pause = error_pause(task.interval, failures)
        outage = database_outage(exc)
        key = f"outage: {outage}" if outage is not None else text
        if key != logged and outage is not None:
            log.warning(
                "background task %s fails: %s (logged once until it recovers; tried again after %.1f s, twice as "
                "long after each next failure, at most %.0f s): %s",
                label,
                outage,
                pause,
                BACKOFF_MAX_SECONDS,
                text,
            )
        elif key != logged:
            log.exception(
                "background task %s failed (logged once until it changes; tried again after %.1f s, twice as long "
                "after each next failure, at most %.0f s): %s",
                label,
                pause,
                BACKOFF_MAX_SECONDS,
                text,
            )
        self._finished(task, clock, text)
        # A pause even when woken: a task failing at once must not spin on its wake-ups.
        if task.keys is None:
            self._note(task, next_due=time.time() + pause + task.interval)
        self._stopping.wait(pause)
        return key

    def _busy(self, task: Task, label: str, exc: Exception, busy: int) -> None:
        """A run that met a busy database: counted (``busy``), one log line (no traceback) at the first of a
        streak, and the back-off's pause."""
        pause = error_pause(task.interval, busy)
        if busy == 1:
            log.warning("background task %s found the database busy; trying again in %.1f s: %s", label, pause, exc)
        with self._lock:
            self._status[task.name].busy += 1
        if task.keys is None:
            self._note(task, next_due=time.time() + pause + task.interval)
        self._stopping.wait(pause)

    def _lease(self, task: Task) -> int | None:
        """Take or renew the task's lease; its token, or None (no scope, or another server holds it). Raises what
        taking it raised (the database unavailable): then this server does not hold it either."""
        if task.lease_scope is None or self.leases is None:
            return None
        seconds = max(self.lease_seconds, 2 * task.interval)
        held = self._held.get(task.name)
        if held is not None and (held.expires_at - datetime.now(UTC)).total_seconds() > seconds / 2:
            # Renewed when half of it is left, not at every run (the studies task runs 4 times a second): the
            # token stands until the lease runs out, and every write checks it in its own transaction anyway.
            return held.token
        try:
            held = self.leases.acquire(task.lease_scope, seconds)
        except Exception:
            self._held.pop(task.name, None)
            self._note(task, holds_lease=False, token=None)
            raise
        if held is None:
            self._held.pop(task.name, None)
            self._note(task, holds_lease=False, token=None)
            return None
        self._held[task.name] = held
        self._note(task, holds_lease=True, token=held.token)
        return held.token

    def _finished(self, task: Task, clock: float, error: str | None) -> None:
        with self._lock:
            status = self._status[task.name]
            status.runs += 1
            status.last_finished = time.time()
            status.last_duration = time.monotonic() - clock
            status.last_ok = error is None
            if error is not None:
                status.errors += 1
                status.last_error = error
                status.last_error_at = status.last_finished

    def _note(self, task: Task, **values: object) -> None:
        with self._lock:
            status = self._status[task.name]
            for key, value in values.items():
                setattr(status, key, value)

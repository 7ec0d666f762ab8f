"""Which shim runs an attempt: the one holding its claim. Standard library only (the shim loads it).

An attempt's directory is run by at most one shim, however many times it was launched (a server that died
between recording a start and making it, a launch request still in a dead server's pipe, the restarted server's
own launch of the same attempt). The claim is ``shim.lock``, taken with ``flock`` and held for the shim's life:

- a shim's first act is :func:`take`: with the lock held it checks that the attempt has no exit record (an
  attempt ends once: the shim's own record, or the server's :func:`void`), then writes ``shim.pid``; a shim that
  cannot take the claim exits at once, having written nothing;
- the server asks :func:`held` to tell an attempt whose shim is starting from one nobody launched;
- the server ends an attempt no shim claimed with :func:`void` (a cancel before the start), under the same lock,
  so a shim that comes later finds the record and runs nothing.

The lock is released by the kernel when the shim dies, however it dies: a claim never outlives its shim.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time

LOCK = "shim.lock"
PID = "shim.pid"
EXIT = "exit.json"
EXIT_NOT_CLAIMED = 76  # (not the disk-full exit, 75) a shim that found its attempt claimed or ended: it ran nothing

# A probe (``held``) holds the lock for microseconds; a shim starting in that instant tries again rather than
# take it for another shim's. A real holder holds it for the attempt's life, so a shim gives up after this.
TAKE_TRIES = 50
TAKE_PAUSE = 0.01


def _open(attempt_dir: str, create: bool) -> int:
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_CREAT if create else 0)
    return os.open(os.path.join(attempt_dir, LOCK), flags, 0o600)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def start_time(pid: int) -> float:
    """When process ``pid`` started, in seconds since the epoch, as psutil's ``create_time`` computes it (the
    boot time plus the start in clock ticks), so a reused pid is told apart."""
    return process_state(pid)[0]


def process_state(pid: int) -> tuple[float, str]:
    """(:func:`start_time`, state letter: ``Z`` for a zombie) of process ``pid``, from one read of its stat file;
    OSError when there is no such process."""
    with open(f"/proc/{pid}/stat") as fh:
        stat = fh.read()
    fields = stat[stat.rindex(")") + 2 :].split()  # from field 3, the state; the name may hold spaces
    # The boot time is read each time, as psutil does: it moves with the wall clock (a step of NTP).
    with open("/proc/stat") as fh:
        boot = next(int(line.split()[1]) for line in fh if line.startswith("btime "))
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK"), fields[0]  # field 22, starttime


def take(attempt_dir: str, launch: str | None = None) -> int | None:
    """Claim the attempt for this process: the lock's descriptor (keep it open while the attempt runs), with
    ``shim.pid`` written; None when another shim holds it or the attempt already has its exit record."""
    fd = _open(attempt_dir, create=True)
    for tries in range(TAKE_TRIES):
        if _try_lock(fd):
            break
        if tries + 1 < TAKE_TRIES:
            time.sleep(TAKE_PAUSE)
    else:
        os.close(fd)
        return None
    if os.path.exists(os.path.join(attempt_dir, EXIT)):
        os.close(fd)
        return None
    pid = os.getpid()
    record = {"pid": pid, "create_time": start_time(pid), "launch": launch}
    tmp = os.path.join(attempt_dir, f"{PID}.{pid}.tmp")
    with open(tmp, "w") as fh:
        json.dump(record, fh)
    os.replace(tmp, os.path.join(attempt_dir, PID))
    return fd


def held(attempt_dir: str) -> bool:
    """Whether a shim holds the attempt's claim now."""
    try:
        fd = _open(attempt_dir, create=False)
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        return not _try_lock(fd)  # a lock taken here is let go when the descriptor closes, at once
    finally:
        os.close(fd)


def void(attempt_dir: str, record: dict) -> bool:
    """End an attempt no shim has claimed, with ``record`` as its exit record: True when it is ended (now, or
    before), False when a shim holds it (stop that shim instead). The directory of an attempt never launched
    is made (the server's, 0700) to hold the record."""
    os.makedirs(attempt_dir, mode=0o700, exist_ok=True)
    fd = _open(attempt_dir, create=True)
    try:
        if not _try_lock(fd):
            return False
        path = os.path.join(attempt_dir, EXIT)
        if os.path.exists(path):
            return True
        tmp = path + ".void.tmp"
        with open(tmp, "w") as fh:
            json.dump(record, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        with contextlib.suppress(OSError):
            dfd = os.open(attempt_dir, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return True
    finally:
        os.close(fd)

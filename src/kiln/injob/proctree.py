"""The job's process tree: finding it, signalling and killing it, reaping its processes, measuring its memory.

Standard library only, like the shim that loads it (as ``kiln.injob.proctree`` in the package, or as a plain
module from this file's directory when the shim runs as a script). ``ProcessTree`` holds the shim's methods for
the tree of the step it runs; the module's names are re-exported by ``shim.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
PR_SET_CHILD_SUBREAPER = 36


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


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return 0


def unshared_rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` less its shared-memory pages (RssShmem): those are in a tmpfs, counted once
    where they are held rather than in every process that maps them. Falls back to the whole RSS."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            fields = dict(line.split(b":", 1) for line in fh.read().splitlines() if b":" in line)
        return (int(fields[b"RssAnon"].split()[0]) + int(fields[b"RssFile"].split()[0])) * 1024
    except (OSError, KeyError, IndexError, ValueError):
        return rss_bytes(pid)


def comm(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/comm", "rb") as fh:
            return fh.read().strip()
    except OSError:
        return b""


def reaped() -> Iterator[tuple[int, int]]:
    """(pid, wait status) of every child that has exited, collected without waiting."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status


class ProcessTree:
    """The processes of the running step and all they started (a mixin of ``Shim``, which is their subreaper)."""

    me: int
    sid: int
    helpers: set[int]  # the shim's own helpers (a FUSE mount's daemon): never part of the job's tree
    children: list[subprocess.Popen]
    child_index: dict[int, int]
    exit_order: list[int]
    drain: Callable[[], None]
    say: Callable[[str], None]
    sandboxed: bool  # the step's processes run under bubblewrap
    kill_note: str  # how the last kill ended: "" or "SIGKILL after 10 s grace"

    def tree(self) -> list[int]:
        """Every process of this job: our session, plus anything re-parented to us (we are a subreaper)."""
        table = proc_table()
        outside = {self.me} | self.helpers  # the shim itself, and what serves the job without being it
        members = {p for p, (ppid, sid) in table.items() if (sid == self.sid or ppid == self.me)} - outside
        grew = True
        while grew:
            extra = {p for p, (ppid, _) in table.items() if ppid in members and p not in members} - outside
            members |= extra
            grew = bool(extra)
        return sorted(members)

    def signal_tree(self, sig: int) -> None:
        """``sig`` to every process of the tree. In a sandbox, a SIGTERM spares bubblewrap's own processes (the
        job's would die with them at once, with no grace): they end when the job's command does."""
        spare = self.sandboxed and sig != signal.SIGKILL
        if not spare:
            for child in self.children:
                try:
                    os.killpg(child.pid, sig)
                except OSError:
                    pass
        for pid in self.tree():
            if spare and comm(pid) == b"bwrap":
                continue
            try:
                os.kill(pid, sig)
            except OSError:
                pass

    def kill_tree(self, grace: float) -> None:
        """SIGTERM everything, wait up to ``grace`` seconds, then SIGKILL what is left (``kill_note`` says so)."""
        self.signal_tree(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            self.reap()
            if not self.tree():
                return
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
            self.drain()  # what the processes print while they shut down still reaches the log
        if grace > 0 and self.tree():
            self.kill_note = f"SIGKILL after {grace:g} s grace"
            self.say(f"{self.kill_note}: the job's processes did not exit on SIGTERM")
        self.signal_tree(signal.SIGKILL)
        for _ in range(40):
            self.reap()
            if not self.tree():
                return
            time.sleep(0.05)
            self.drain()

    def reap(self) -> None:
        """Collect every exited child: the tracked one (its status goes to its Popen) and adopted orphans."""
        for pid, status in reaped():
            index = self.child_index.get(pid)
            if index is not None:
                self.children[index].returncode = os.waitstatus_to_exitcode(status)
                self.exit_order.append(index)

    def running(self) -> bool:
        return any(child.returncode is None for child in self.children)

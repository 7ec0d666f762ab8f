"""CPU a Kiln server spends on the jobs it starts, for the burst and latency benchmarks (issue 45).

Two figures, both deltas over a measured window, divided by the jobs started in it:

- ``platform``: the CPU time of a control group the benchmark makes for the server's process tree (cgroup v1
  ``cpuacct.usage``, else v2 ``cpu.stat`` ``usage_usec``). The server and what it already runs (the shim
  launcher, spare networks' ``pasta``) are moved in after its start; what they fork later is born there: shims,
  ``pasta``, ``nft``, bubblewrap until its move into the job's own groups. It counts even processes that were
  orphaned (a shim's ``pasta`` outliving the shim), but not what runs in a job's own CPU group (bubblewrap after
  its move, ``setpriv``, the job's command).
- ``tree``: ``psutil`` CPU times of the server and the launcher, each with its reaped children's: everything a
  shim waited for (bubblewrap, and the job inside it) is included; an orphan reaped outside the tree (init took
  it) is not.
- ``server``: the server process alone (all its threads: requests, the reconciler, the background tasks), none of
  its children: what Kiln's own Python costs per job.

Root is needed for the control group; without it ``platform`` is None and only ``tree`` is printed.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

import psutil

V1_CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def _v2_root() -> Path | None:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[:1] == ["cgroup2"]:
            return Path(left.split()[4])
    return None


class ServerCpu:
    """The CPU of one server's process tree (see the module's doc)."""

    def __init__(self, pid: int) -> None:
        self.server = psutil.Process(pid)
        self.group: Path | None = None
        self.v2 = False
        for base, v2 in ((V1_CPUACCT, False), (_v2_root(), True)):
            if base is None or not (base / ("cpu.stat" if v2 else "cpuacct.usage")).exists():
                continue
            group = base / f"kiln-bench-{os.getpid()}-{pid}"
            try:
                group.mkdir(exist_ok=True)
                for proc in [self.server, *self.server.children(recursive=True)]:
                    (group / "cgroup.procs").write_text(str(proc.pid))
            except OSError:
                continue
            self.group, self.v2 = group, v2
            break

    def platform_s(self) -> float | None:
        if self.group is None:
            return None
        if self.v2:
            for line in (self.group / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
            return None
        return int((self.group / "cpuacct.usage").read_text()) / 1e9

    def tree_s(self) -> float:
        total = 0.0
        for proc in [self.server, *self.server.children()]:  # the server and the launcher (its direct child)
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
        return total

    def server_s(self) -> float | None:
        try:
            t = self.server.cpu_times()
        except psutil.Error:
            return None
        return t.user + t.system

    def snapshot(self) -> dict[str, float | None]:
        return {"platform": self.platform_s(), "tree": self.tree_s(), "server": self.server_s()}

    @staticmethod
    def per_job(before: dict[str, float | None], after: dict[str, float | None], jobs: int) -> dict[str, Any]:
        """Seconds of CPU per job between two snapshots."""
        out: dict[str, Any] = {}
        for key in ("platform", "tree", "server"):
            a, b = before.get(key), after.get(key)
            out[key] = None if a is None or b is None or jobs <= 0 else (b - a) / jobs
        return out

    def close(self, timeout: float = 10.0) -> None:
        """Remove the group (what is still in it is moved back to the hierarchy's root first). A process that
        has exited but is not reaped yet (an orphaned pasta, a shim just ending) still holds it: retried."""
        if self.group is None:
            return
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError):
                for pid in (self.group / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        (self.group.parent / "cgroup.procs").write_text(pid)
            try:
                self.group.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    print(f"cpu_use: could not remove {self.group}", file=sys.stderr)
                    break
                time.sleep(0.1)
        self.group = None


def describe(per_job: dict[str, Any]) -> str:
    parts = []
    if per_job.get("platform") is not None:
        parts.append(f"platform {per_job['platform'] * 1000:.1f} ms")
    if per_job.get("tree") is not None:
        parts.append(f"server+launcher tree {per_job['tree'] * 1000:.1f} ms")
    if per_job.get("server") is not None:
        parts.append(f"server process {per_job['server'] * 1000:.1f} ms")
    return "CPU per job: " + ", ".join(parts) if parts else "CPU per job: unknown"

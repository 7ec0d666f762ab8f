"""Control groups of the local executor: each attempt member's CPU share (``resources.cpus``) and process count
(``resources.pids``) enforced by the kernel, and its CPU time measured.

Standard library only, like the shim that loads it (as ``kiln.injob.cgroups`` in the package, or as a plain
module from this file's directory when the shim runs as a script). A sandboxed step (bubblewrap) is put into the
groups by the shim while bubblewrap waits, before anything of the job runs (:class:`BwrapJoin`: no process of
ours in between). A step without the sandbox (``KILN_SANDBOX=none``) goes through a tiny wrapper beside this file
(:meth:`JobCgroup.join_argv`)::

    python -I -S cgjoin.py LC_CTYPE[=VALUE] PROCS_FILE... -- ARGV...

The wrapper writes its own pid into each ``cgroup.procs``, then execs ``ARGV`` (bubblewrap, normally): the same
process, now in the groups, and everything it forks after is born there. Nothing can escape in between (the shim
cannot write the child's pid after ``Popen`` instead: bubblewrap may have forked by then, and its children would
stay outside), and the shim, which runs threads, needs no ``preexec_fn``. The wrapper runs as the shim's user
(root) with the job's environment, as bubblewrap does right after it; Python's own start-up changes are undone
before the exec (the ignored SIGPIPE and SIGXFSZ; the C locale coerced to ``LC_CTYPE=C.UTF-8``).

Where the groups are: for each controller, ``kiln/<name>`` at the top of the hierarchy that holds it, found in
``/proc/self/mountinfo``:

- cgroup v1 (a hierarchy per controller, e.g. ``/sys/fs/cgroup/pids``): ``pids/kiln/<name>/pids.max``,
  ``cpu/kiln/<name>/cpu.cfs_quota_us`` over ``cpu.cfs_period_us`` (100 ms), ``cpuacct/kiln/<name>/cpuacct.usage``.
- cgroup v2 (one unified hierarchy): ``kiln/<name>`` with ``pids.max``, ``cpu.max`` and ``cpu.stat``; ``+pids``
  and ``+cpu`` are enabled in the root's and ``kiln/``'s ``cgroup.subtree_control``.

Where both hold a controller (a hybrid layout) v1 is used. A controller found nowhere, or whose group cannot be
made or limited (not root, a read-only ``/sys/fs/cgroup``, a v2 root that holds processes), is left out and the
caller falls back (the shim: ``RLIMIT_NPROC`` for the process count; nothing for CPU). ``kiln/`` itself gets a
``pids.max`` below the machine's ``pid_max`` (when it has none), so that all jobs together cannot exhaust it.

Each attempt member's shim makes its groups before its first step and removes them when it ends; the executor
removes what a dead shim left (:func:`remove`).
"""

from __future__ import annotations

import os
import sys
import time

ROOT_NAME = "kiln"
CPU_PERIOD_US = 100_000  # 100 ms
MIN_QUOTA_US = 1_000  # the kernel's smallest quota
CONTROLLERS = ("pids", "cpu", "cpuacct")
# ``re`` and ``signal`` are imported where they are used (importing re took a third of the shim's start-up in a
# fresh interpreter, where the launcher cannot pay it)


def group_name(*parts: object) -> str:
    """A name for one attempt member's groups, e.g. ``j123-1`` or ``j123-2-worker-1``: only letters, digits,
    ``_.-``."""
    import re

    name = re.sub(r"[^A-Za-z0-9_.-]", "_", "-".join(str(p) for p in parts if p not in (None, "")))[:200]
    return "_" + name if name in ("", ".", "..") else name


def _unescape(path: str) -> str:
    import re

    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def hierarchies(mountinfo: str = "/proc/self/mountinfo") -> dict[str, tuple[str, int]]:
    """controller → (mount point, cgroup version) of the hierarchy that holds it here; v1 first."""
    v1: dict[str, tuple[str, int]] = {}
    v2: dict[str, tuple[str, int]] = {}
    try:
        with open(mountinfo) as fh:
            text = fh.read()
    except OSError:
        return {}
    for line in text.splitlines():
        if " - cgroup" not in line:  # every other mount (a busy machine has one per job's scratch and namespace)
            continue
        left, sep, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if not sep or len(fields) < 5 or len(rest) < 3:
            continue
        point = _unescape(fields[4]) if "\\" in fields[4] else fields[4]
        if rest[0] == "cgroup":
            for option in rest[2].split(","):
                if option in CONTROLLERS:
                    v1.setdefault(option, (point, 1))
        elif rest[0] == "cgroup2":
            try:
                with open(os.path.join(point, "cgroup.controllers")) as fh:
                    names = fh.read().split()
            except OSError:
                continue
            for name in names:
                if name in ("pids", "cpu"):
                    v2.setdefault(name, (point, 2))
    return {**v2, **v1}


_KNOWN: list[dict[str, tuple[str, int]]] = []


def known_hierarchies(fresh: bool = False) -> dict[str, tuple[str, int]]:
    """:func:`hierarchies`, read once per process (the shim launcher reads it before it forks, so no shim reads
    the machine's mount table again) or again when ``fresh``."""
    if fresh or not _KNOWN:
        _KNOWN[:] = [hierarchies()]
    return _KNOWN[0]


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def _write(path: str, value: str) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return False
    try:
        os.write(fd, value.encode())
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _enable(directory: str, controller: str) -> bool:
    """``controller`` enabled for the children of the v2 group ``directory``."""
    try:
        if controller in _read(os.path.join(directory, "cgroup.subtree_control")).split():
            return True
    except OSError:
        return False
    return _write(os.path.join(directory, "cgroup.subtree_control"), "+" + controller)


def machine_pids_cap() -> int | None:
    """The most processes all jobs together may have: the machine's ``pid_max`` less a reserve for everything
    else (an eighth, at least 1024)."""
    try:
        pid_max = int(_read("/proc/sys/kernel/pid_max"))
    except (OSError, ValueError):
        return None
    return max(64, pid_max - max(1024, pid_max // 8))


def _base(point: str, version: int, controller: str) -> str | None:
    """``kiln/`` in the hierarchy at ``point``, made (and, in v2, given ``controller``) if need be."""
    base = os.path.join(point, ROOT_NAME)
    try:
        os.mkdir(base, 0o755)
    except FileExistsError:
        pass
    except OSError:
        return None
    if version == 2 and not (_enable(point, controller) and _enable(base, controller)):
        return None
    if controller == "pids":
        cap = machine_pids_cap()
        try:
            if cap is not None and _read(os.path.join(base, "pids.max")).strip() == "max":
                _write(os.path.join(base, "pids.max"), str(cap))
        except OSError:
            pass
    return base


class JobCgroup:
    """One attempt member's groups: ``dirs`` maps each controller it has to its group's directory (in v2 one
    directory for all of them)."""

    def __init__(self, name: str, dirs: dict[str, str] | None = None, v2: bool = False) -> None:
        self.name = name
        self.dirs: dict[str, str] = dict(dirs or {})
        self.v2 = v2
        self.pids_limit: int | None = None
        self.cpus: float | None = None

    @classmethod
    def create(
        cls, name: str, cpus: float | None, pids: int | None, found: dict[str, tuple[str, int]] | None = None
    ) -> JobCgroup:
        """The groups of ``name`` with a CPU quota of ``cpus`` and a ``pids`` limit, as far as this machine
        allows (``dirs`` holds what could be made; empty: none). Never raises."""
        if found is None:  # the hierarchies known to this process; read again when they fell short
            group = cls.create(name, cpus, pids, known_hierarchies())
            short = (pids is not None and "pids" not in group.dirs) or (cpus is not None and "cpu" not in group.dirs)
            if not short or known_hierarchies() == known_hierarchies(fresh=True):
                return group
            group.remove()
            found = known_hierarchies()
        group = cls(group_name(name))
        wanted = {"pids": pids is not None, "cpu": cpus is not None, "cpuacct": cpus is not None}
        for controller in CONTROLLERS:
            if not wanted[controller] or controller not in found:
                continue
            point, version = found[controller]
            if version == 2 and controller == "cpuacct":
                continue
            base = _base(point, version, controller)
            if base is None:
                continue
            path = os.path.join(base, group.name)
            if path not in group.dirs.values():
                try:
                    os.mkdir(path, 0o755)
                except FileExistsError:
                    pass
                except OSError:
                    continue
            if group._limit(controller, path, version, cpus, pids):
                group.dirs[controller] = path
                group.v2 = group.v2 or version == 2
            elif path not in group.dirs.values():
                _rmdir(path)
        if "pids" in group.dirs:
            group.pids_limit = pids
        if "cpu" in group.dirs:
            group.cpus = cpus
        return group

    @staticmethod
    def _limit(controller: str, path: str, version: int, cpus: float | None, pids: int | None) -> bool:
        if controller == "pids" and pids is not None:
            return _write(os.path.join(path, "pids.max"), str(int(pids)))
        if controller == "cpu" and cpus is not None:
            quota = max(MIN_QUOTA_US, int(cpus * CPU_PERIOD_US))
            if version == 2:
                return _write(os.path.join(path, "cpu.max"), f"{quota} {CPU_PERIOD_US}")
            return _write(os.path.join(path, "cpu.cfs_period_us"), str(CPU_PERIOD_US)) and _write(
                os.path.join(path, "cpu.cfs_quota_us"), str(quota)
            )
        return controller == "cpuacct"

    def paths(self) -> list[str]:
        return sorted(set(self.dirs.values()))

    def join_argv(self, argv: list[str], env: dict[str, str]) -> list[str]:
        """``argv`` started through the wrapper that joins these groups first (``env``: the environment it is
        started with, whose ``LC_CTYPE`` the wrapper restores). ``argv`` itself when there are none."""
        if not self.dirs or not sys.executable:
            return argv
        ctype = "LC_CTYPE=" + env["LC_CTYPE"] if "LC_CTYPE" in env else "LC_CTYPE"
        procs = [os.path.join(p, "cgroup.procs") for p in self.paths()]
        wrapper = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cgjoin.py")
        return [sys.executable, "-I", "-S", wrapper, ctype, *procs, "--", *argv]

    def bwrap_join(self) -> BwrapJoin | None:
        """A one-use join of these groups for a bubblewrap step (None when there are none)."""
        return BwrapJoin(self.paths()) if self.dirs else None

    # -- what the groups measure --

    def _value(self, controller: str, filename: str, key: str | None = None) -> int | None:
        path = self.dirs.get(controller)
        if path is None:
            return None
        try:
            text = _read(os.path.join(path, filename))
        except OSError:
            return None
        if key is None:
            value = text.strip()
            return None if not value.isdigit() else int(value)
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
                return int(parts[1])
        return None

    def pids_refused(self) -> int:
        """How many forks the process limit refused so far (``pids.events``: ``max N``)."""
        return self._value("pids", "pids.events", "max") or 0

    def pids_current(self) -> int | None:
        return self._value("pids", "pids.current")

    def pids_peak(self) -> int | None:
        return self._value("pids", "pids.peak")

    def cpu_seconds(self) -> float | None:
        """CPU time the group's processes used (``cpuacct.usage``, or v2's ``cpu.stat``); None if unknown."""
        if "cpuacct" in self.dirs:
            used = self._value("cpuacct", "cpuacct.usage")
            return None if used is None else used / 1e9
        for controller in ("cpu", "pids"):
            if controller in self.dirs and self.v2:
                used = self._value(controller, "cpu.stat", "usage_usec")
                return None if used is None else used / 1e6
        return None

    # -- the end --

    def members(self, controller: str = "pids") -> set[int] | None:
        """The processes in this member's group of ``controller`` (one read of its ``cgroup.procs``); None when it
        has no such group or it cannot be read."""
        path = self.dirs.get(controller)
        if path is None:
            return None
        try:
            return {int(p) for p in _read(os.path.join(path, "cgroup.procs")).split()}
        except (OSError, ValueError):
            return None

    def pids(self) -> set[int]:
        found: set[int] = set()
        for path in self.paths():
            try:
                found.update(int(p) for p in _read(os.path.join(path, "cgroup.procs")).split())
            except (OSError, ValueError):
                continue
        return found

    def kill(self) -> None:
        """SIGKILL every process in the groups."""
        import signal

        for path in self.paths():
            if self.v2 and os.path.exists(os.path.join(path, "cgroup.kill")):
                _write(os.path.join(path, "cgroup.kill"), "1")
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def remove(self, timeout: float = 3.0) -> list[str]:
        """Kill what is left in the groups and remove them; returns those that could not be removed."""
        deadline = time.monotonic() + timeout
        left = self.paths()
        while left:
            left = [p for p in left if not _rmdir(p)]
            if not left or time.monotonic() > deadline:
                break
            self.kill()
            time.sleep(0.02)
        self.dirs = {c: p for c, p in self.dirs.items() if p in left}
        return left


class BwrapJoin:
    """A bubblewrap step put into the groups before anything of the job runs, with no process of ours between:
    bubblewrap is started with ``--info-fd`` (its monitor writes the sandbox's pid there right after the clone)
    and ``--block-fd`` (the sandbox waits for a byte there before it loads the seccomp filter and execs the
    command, after its own set-up). The shim reads both pids, writes them into each ``cgroup.procs``, sets the
    sandbox's ``rlimits`` (``prlimit(2)``: no ``prlimit`` process in the sandbox), then writes the byte: the
    command, and all it forks, start in the groups and under the limits (the sandbox's later fork for its pid 1
    too).

    The sandbox's block fd is the block pipe opened again read and write (a pipe's ``/proc/self/fd`` link opens
    the pipe itself): a writer as well as the reader, it never reads end-of-file, so when the shim dies before the
    byte (SIGKILL) the sandbox does not go on outside the groups; it stays blocked until ``--die-with-parent``
    kills it. bubblewrap closes its block fd once it has read the byte, and its info fd in the sandbox, so the
    command inherits neither (nor any end of these pipes). Where the pipe cannot be opened so (no /proc), the
    write end is passed as well, and the command inherits it."""

    def __init__(self, paths: list[str]) -> None:
        self.procs = [os.path.join(p, "cgroup.procs") for p in paths]
        self.info_r, self.info_w = os.pipe()
        self.block_r, self.block_w = os.pipe()
        self.extra: tuple[int, ...] = ()  # passed to bubblewrap besides its two fds
        self.rlimits: list[tuple[int, int]] = []  # (resource, limit) set on the sandbox while it waits
        try:
            both = os.open(f"/proc/self/fd/{self.block_r}", os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            self.extra = (self.block_w,)
        else:
            os.close(self.block_r)
            self.block_r = both

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return (self.info_w, self.block_r, *self.extra)

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` (bubblewrap's command line) with the two options."""
        return [argv[0], "--info-fd", str(self.info_w), "--block-fd", str(self.block_r), *argv[1:]]

    def admit(self, pid: int) -> str:
        """Move bubblewrap (``pid``) and its sandbox into the groups and let the sandbox go on; "" when done (or
        when bubblewrap failed before making a sandbox: its exit says why), else why the groups refused."""
        for fd in (self.info_w, self.block_r):
            os.close(fd)
        info = b""
        try:
            while not info.rstrip().endswith(b"}"):  # bubblewrap writes one JSON object, then closes its end
                data = os.read(self.info_r, 4096)
                if not data:
                    break
                info += data
        finally:
            os.close(self.info_r)
        try:
            child = _child_pid(info)
            if child is None:
                return ""  # no sandbox was made: bubblewrap exits with its own error
            for path in self.procs:
                for member in (pid, child):
                    try:
                        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
                        try:
                            os.write(fd, str(member).encode())
                        finally:
                            os.close(fd)
                    except OSError as exc:
                        return f"cannot join the job's control group {path}: {exc.strerror}"
            if self.rlimits:
                import resource

                for which, limit in self.rlimits:  # inherited by the sandbox's pid 1 and the command it forks
                    try:
                        resource.prlimit(child, which, (limit, limit))
                    except OSError as exc:
                        return f"cannot set the job's resource limit {which}: {exc.strerror}"
            os.write(self.block_w, b"1")
            return ""
        finally:
            os.close(self.block_w)

    def abandon(self) -> None:
        """The step did not start: let go of the pipes."""
        for fd in (self.info_r, self.info_w, self.block_r, self.block_w):
            try:
                os.close(fd)
            except OSError:
                pass


def _child_pid(info: bytes) -> int | None:
    import json

    try:
        value = json.loads(info.decode()).get("child-pid")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and value > 0 else None


def _rmdir(path: str) -> bool:
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def existing(name: str, found: dict[str, tuple[str, int]] | None = None) -> JobCgroup:
    """The groups of ``name`` that exist now (nothing is made)."""
    found = hierarchies() if found is None else found
    group = JobCgroup(group_name(name))
    for controller, (point, version) in found.items():
        path = os.path.join(point, ROOT_NAME, group.name)
        if os.path.isdir(path):
            group.dirs[controller] = path
            group.v2 = group.v2 or version == 2
    return group


def remove(name: str) -> list[str]:
    """Kill whatever is left in the groups of ``name`` and remove them (a dead shim's leftovers)."""
    return existing(name).remove()

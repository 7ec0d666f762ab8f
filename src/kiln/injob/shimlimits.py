"""The shim's side of the job's CPU, process and log limits (memory and disk are in ``shimbox.py``).

Standard library only, like the shim that loads it (as ``kiln.injob.shimlimits`` in the package, or as a plain
module from this file's directory when the shim runs as a script). ``JobLimits`` is a mixin of ``Shim``; the
groups themselves are ``cgroups.py``'s, the log's limit is applied where lines are written (``shimio.py``).

``shim.json`` carries ``"cgroup": {"name", "cpus", "pids"}`` and ``"log_limit"`` (bytes):

- the attempt member's control groups are made before its first step and every step of the job starts in them
  (a sandboxed step: moved in by the shim while bubblewrap waits, which also sets its file size limit then;
  without the sandbox: through ``cgroups.py``'s wrapper; a catalog runtime the shim builds for every
  organisation does not): a CPU
  quota of ``cpus`` and at most ``pids`` processes and threads. Where no pids
  group can be made the sandbox sets ``RLIMIT_NPROC`` instead (it counts every process of the job's uid, so
  of all the organisation's jobs on the machine); where no cpu group can be made ``cpus`` is not enforced, and the
  log says so once.
- a refused fork ends the job ``PidsLimitExceeded``; output beyond the log limit is dropped, the log gets a last
  line saying so and the job ends ``LogLimitExceeded``. Both are checked while the step runs and once more when
  it has ended (a limit hit just before the exit still counts).
- the groups are removed, with whatever is left in them, when the attempt ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable

if __package__:
    from kiln.injob import cgroups
    from kiln.injob.units import human
else:  # loaded by the shim run as a script: its directory is on sys.path
    import cgroups  # type: ignore[no-redef]
    from units import human  # type: ignore[no-redef]

POLL_SECONDS = 0.25


class JobLimits:
    """The shim's methods for the CPU, process and log limits (a mixin of ``Shim``)."""

    cfg: dict
    me: int
    helpers: set[int]
    tree: Callable[[], list[int]]
    say: Callable[[str], None]
    log_over: bool  # shimio.AttemptFiles: output was dropped at the log limit
    log_reached: int  # shimio.AttemptFiles: the log's size when it was
    cgroup: cgroups.JobCgroup | None = None
    _cgroup_made = False
    _bwrap_group: cgroups.JobCgroup | None = None
    _step_group: cgroups.JobCgroup | None = None  # the running step's groups, with a pids group: what it holds
    _pids_refused = 0
    _pids_next = 0.0
    _pids_note = ""

    def job_cgroup(self) -> cgroups.JobCgroup | None:
        """The attempt member's groups, made on first use (None when it has none)."""
        if not self._cgroup_made:
            self._cgroup_made = True
            spec = self.cfg.get("cgroup")
            if isinstance(spec, dict) and spec.get("name"):
                group = cgroups.JobCgroup.create(str(spec["name"]), spec.get("cpus"), spec.get("pids"))
                self.cgroup = group if group.dirs else None
                if spec.get("cpus") is not None and "cpu" not in group.dirs:
                    self.say(f"cpus {spec['cpus']:g} is not enforced here (no writable cpu control group)")
        return self.cgroup

    def step_argv(self, argv: list[str], env: dict[str, str], grouped: bool = True, bwrap: bool = False) -> list[str]:
        """``argv`` started in the groups (unless not ``grouped``); a new step: the log limit's verdict starts
        afresh. ``bwrap``: ``argv`` is bubblewrap's, which the shim puts into the groups itself while it waits
        (:meth:`bwrap_join`), with no wrapper process; otherwise the wrapper ``cgjoin.py`` joins them."""
        self.log_over = False
        group = self.job_cgroup() if grouped else None
        self._bwrap_group = group if bwrap else None
        self._step_group = group if group is not None and "pids" in group.dirs else None
        if group is None or bwrap:
            return argv
        return group.join_argv(argv, env)

    def bwrap_join(self, fsize: int | None = None) -> cgroups.BwrapJoin | None:
        """A join of the groups for one bubblewrap process of the step (None: the step has no groups to join),
        which also sets the sandbox's RLIMIT_FSIZE to ``fsize`` while it waits (no ``prlimit`` process in the
        sandbox: the command line has none where the step joins groups)."""
        group = self._bwrap_group
        join = group.bwrap_join() if group is not None else None
        if join is not None and fsize:
            import resource  # the launcher imported it for every shim

            join.rlimits.append((resource.RLIMIT_FSIZE, int(fsize)))
        return join

    def job_processes(self) -> list[int]:
        """The job's processes, to measure them (memory, system metrics): the members of the step's pids group (one
        read of its ``cgroup.procs``: the job's processes cannot leave it, and bubblewrap's are moved in before the
        job runs), else the step's process tree (a walk of every process on the machine: four times a second, with
        a memory limit, it cost each idle job 1.6 ms a walk here, more the more jobs run)."""
        group = self._step_group
        found = group.members() if group is not None else None
        if found is None:
            return self.tree()
        return sorted(found - {self.me} - self.helpers)

    def nproc_fallback(self) -> int | None:
        """The RLIMIT_NPROC the sandbox sets when no pids group holds the job (None: the group does)."""
        group = self.job_cgroup()
        if group is not None and "pids" in group.dirs:
            return None
        pids = (self.cfg.get("cgroup") or {}).get("pids")
        return int(pids) if isinstance(pids, int) else None

    def limits_due(self) -> float | None:
        """When the process limit is next read (None: there is none to read)."""
        group = self.cgroup
        return self._pids_next if group is not None and "pids" in group.dirs else None

    def job_limit_reached(self, now: float | None = None) -> str:
        """``LogLimitExceeded`` when output was dropped at the log limit, ``PidsLimitExceeded`` when a fork was
        refused (read every POLL_SECONDS, or now when ``now`` is None), else ""."""
        if self.log_over:
            return "LogLimitExceeded"
        group = self.cgroup
        if group is None or "pids" not in group.dirs:
            return ""
        if now is not None and now < self._pids_next:
            return ""
        self._pids_next = (now or time.monotonic()) + POLL_SECONDS
        refused = group.pids_refused()
        if refused <= self._pids_refused:
            return ""
        peak = group.pids_peak() or group.pids_current()
        self._pids_note = f"{refused - self._pids_refused} fork(s) refused" + (
            f", {peak} processes and threads at most" if peak else ""
        )
        self._pids_refused = refused
        return "PidsLimitExceeded"

    def job_limit_message(self, reason: str) -> str:
        """The message of an attempt that ended at one of these limits; "" for any other reason."""
        if reason == "PidsLimitExceeded":
            limit = (self.cfg.get("cgroup") or {}).get("pids")
            note = f" ({self._pids_note})" if self._pids_note else ""
            return f"process limit exceeded: the job reached its limit of {limit} processes and threads{note}"
        if reason == "LogLimitExceeded":
            limit = int(self.cfg.get("log_limit") or 0)
            size = self.log_reached
            return (
                f"log limit exceeded: the job's log reached {human(size)} ({size} bytes), its limit of "
                f"{human(limit)} ({limit} bytes); the rest of its output was dropped"
            )
        return ""

    def job_limit_after_step(self) -> str:
        """The reason of a step that hit one of these limits between the last check and its end ("" if none)."""
        reason = self.job_limit_reached()
        if reason:
            self.say(self.job_limit_message(reason))
        return reason

    def teardown_cgroup(self) -> None:
        group, self.cgroup = self.cgroup, None
        if group is not None:
            left = group.remove()
            if left:
                self.say(f"could not remove the job's control groups {', '.join(left)}")

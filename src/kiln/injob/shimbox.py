"""The shim's side of the job's sandbox: setting up and removing the member's scratch (its /dev/shm and /tmp),
giving the job's uid its work dir, and the limits on what the job holds (memory, with what it keeps in tmpfs; disk).

Standard library only, like the shim that loads it (as ``kiln.injob.shimbox`` in the package, or as a plain
module from this file's directory when the shim runs as a script). ``SandboxLimits`` is a mixin of ``Shim``; the
command line and the measuring are in ``sandbox.py``.
"""

from __future__ import annotations

import _thread
import os
from collections.abc import Callable

if __package__:
    from kiln.injob import netns, proctree, sandbox
else:  # loaded by the shim run as a script: its directory is on sys.path
    import netns  # type: ignore[no-redef]
    import proctree  # type: ignore[no-redef]
    import sandbox  # type: ignore[no-redef]

NetworkError = netns.NetworkError


class SandboxLimits:
    """The shim's methods for the sandbox and the limits (a mixin of ``Shim``)."""

    cfg: dict
    box: dict | None
    scratch_tmpfs: bool
    limit_note: str
    job_processes: Callable[[], list[int]]
    say: Callable[[str], None]
    dir: str
    net: netns.JobNetwork | None = None
    _net_joining: _thread.LockType | None = None  # held while a thread joins (or makes) the namespace
    _net_error: BaseException | None = None

    # -- the job's network (netns.py) -------------------------------------------------------------------------

    def setup_network(self) -> None:
        """Join (or make) the attempt's network namespace, in the background while the attempt prepares."""
        cfg = self.cfg.get("network")
        if not cfg or not self.box:
            return
        self.net = netns.JobNetwork(cfg)
        # A bare thread: threading's would wait until it runs (a wait for the scheduler, on a loaded machine,
        # in the way of the job's start); its lock is released when the namespace is joined.
        joining = _thread.allocate_lock()
        joining.acquire()
        _thread.start_new_thread(self._join_network, (joining,))
        self._net_joining = joining

    def _join_network(self, joining: _thread.LockType) -> None:
        assert self.net is not None
        try:
            self.net.acquire(self.net_holder)
        except BaseException as exc:
            self._net_error = exc
        finally:
            joining.release()

    def _network_joined(self) -> None:
        """Wait until the thread joining the namespace is done."""
        joining, self._net_joining = self._net_joining, None
        if joining is not None:
            joining.acquire()

    @property
    def net_holder(self) -> str:
        return os.path.basename(os.path.normpath(self.dir))

    def job_network(self) -> netns.JobNetwork | None:
        """The namespace the job's steps start in, once made (raises NetworkError when it could not be)."""
        self._network_joined()
        if self._net_error is not None:
            raise NetworkError(str(self._net_error))
        return self.net

    def teardown_network(self) -> None:
        if self.net is None:
            return
        self._network_joined()
        self.net.release(self.net_holder)
        self.net = None

    def memory_exceeded(self, limit: int) -> bool:
        """The job's processes' memory plus what it keeps in its /dev/shm and /tmp (a tmpfs) and in the SysV
        shared memory of its own IPC namespace, above ``limit``."""
        pids = self.job_processes()
        rss = sum(proctree.unshared_rss_bytes(p) for p in pids)
        held = sandbox.tmpfs_used(self.box["scratch"]) if self.scratch_tmpfs and self.box else 0
        sysv = sandbox.sysv_shm_bytes(pids) if self.box else 0
        if rss + held + sysv <= limit:
            return False
        self.limit_note = f"{sandbox.human(rss + held + sysv)} in use > limit {sandbox.human(limit)}"
        if held:
            self.limit_note += f" ({sandbox.human(held)} of it in /dev/shm and /tmp)"
        if sysv:
            self.limit_note += f" ({sandbox.human(sysv)} of it in SysV shared memory)"
        return True

    def disk_exceeded(self, limit: int, reached: bool = False) -> bool:
        """The job's files above ``limit`` (``reached``: at it, as after a write refused with EFBIG)."""
        paths = list(self.cfg.get("disk_paths") or [self.cfg["work_dir"]])
        if self.box and not self.scratch_tmpfs:
            paths.append(self.box["scratch"])
        used = sandbox.disk_used(paths)
        if used < limit or (used == limit and not reached):
            return False
        self.limit_note = (
            f"{sandbox.human(used)} in the job's work dir, outputs, checkpoints and home > limit {sandbox.human(limit)}"
        )
        return True

    def limit_message(self, reason: str) -> str:
        """The message of an attempt that ended at a limit (``OOMKilled``, ``DiskLimitExceeded``), sizes in human
        units: ``memory limit exceeded: 239.5 MiB in use > limit 200 MiB``. "" for any other reason."""
        if reason == "OOMKilled":
            limit = self.cfg.get("memory_limit")
            return f"memory limit exceeded: {self.limit_note or f'limit {sandbox.human(limit or 0)}'}"
        if reason == "DiskLimitExceeded":
            limit = self.cfg.get("disk_limit")
            return f"disk limit exceeded: {self.limit_note or f'limit {sandbox.human(limit or 0)}'}"
        return ""

    def limit_after_exit(self, code: int) -> str:
        """The reason of a step that failed at a limit it hit between two checks: a full /dev/shm (a tmpfs of
        the memory limit's size) or a file beyond the disk limit (SIGXFSZ)."""
        limit = self.cfg.get("memory_limit")
        if limit and self.scratch_tmpfs and self.box:
            held = sandbox.tmpfs_used(self.box["scratch"])
            if held >= limit * 0.95:
                self.limit_note = f"/dev/shm and /tmp hold {sandbox.human(held)}, the memory limit"
                self.say(f"memory limit exceeded: {self.limit_note}")
                return "OOMKilled"
        disk_limit = self.cfg.get("disk_limit")
        if disk_limit and (code == sandbox.SIGXFSZ_EXIT or self.disk_exceeded(disk_limit, reached=True)):
            if code == sandbox.SIGXFSZ_EXIT:
                self.limit_note = f"a file grew beyond the disk limit of {sandbox.human(disk_limit)}"
            self.say(f"disk limit exceeded: {self.limit_note}")
            return "DiskLimitExceeded"
        return ""

    def setup_sandbox(self) -> None:
        """The member's scratch (its /dev/shm and /tmp): a tmpfs of the memory limit's size where it can be."""
        if not self.box:
            return
        scratch = self.box["scratch"]
        self.scratch_tmpfs = sandbox.mount_scratch(scratch, self.box.get("scratch_bytes") or None)
        shm = os.path.join(scratch, "shm")
        os.makedirs(shm, exist_ok=True)
        os.chmod(shm, 0o1777)

    def give_work_dir(self) -> None:
        """The code extracted (and inputs placed) by the shim belong to the job's uid: it may change them."""
        if self.box and self.box.get("uid") is not None:
            sandbox.chown_tree(self.cfg["work_dir"], self.box["uid"], self.box["gid"])

    def teardown_sandbox(self) -> None:
        if not self.box:
            return
        import shutil

        scratch = self.box["scratch"]
        sandbox.unmount_scratch(scratch)
        shutil.rmtree(scratch, ignore_errors=True)

"""The attempt's control groups (injob/cgroups.py): where the hierarchies are, the wrapper that puts a step's first
process into them before it execs, the RLIMIT_NPROC fallback, and (where this machine lets root make them) a real
group holding a fork storm at its limit."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from kiln.injob import cgroups, sandbox, shimlimits


def test_hierarchies_prefer_v1_and_read_v2_controllers(tmp_path: Path) -> None:
    unified = tmp_path / "unified"
    unified.mkdir()
    (unified / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "30 25 0:26 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids\n"
        "31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n"
        f"32 25 0:28 / {unified} rw,nosuid - cgroup2 cgroup2 rw\n"
        "33 25 0:29 / /proc rw - proc proc rw\n"
    )
    assert cgroups.hierarchies(str(mountinfo)) == {
        "pids": ("/sys/fs/cgroup/pids", 1),
        "cpu": ("/sys/fs/cgroup/cpu,cpuacct", 1),
        "cpuacct": ("/sys/fs/cgroup/cpu,cpuacct", 1),
    }
    mountinfo.write_text(f"32 25 0:28 / {unified} rw,nosuid - cgroup2 cgroup2 rw\n")
    assert cgroups.hierarchies(str(mountinfo)) == {"pids": (str(unified), 2), "cpu": (str(unified), 2)}
    assert cgroups.group_name("job-1", 2, "worker/0 x") == "job-1-2-worker_0_x"


def test_the_wrapper_joins_first_then_becomes_the_command_as_started(tmp_path: Path) -> None:
    """It writes its own pid into each group and execs the command (the same process): SIGPIPE and SIGXFSZ are not
    left ignored, and the C locale the interpreter coerced is not passed on."""
    for name in ("a", "b"):  # each group's cgroup.procs: plain files here
        (tmp_path / name).mkdir()
        (tmp_path / name / "cgroup.procs").write_text("")
    group = cgroups.JobCgroup("g", {"pids": str(tmp_path / "a"), "cpu": str(tmp_path / "b")})
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}  # no locale at all: the interpreter coerces C
    script = "echo pid=$$; env; grep SigIgn /proc/self/status"
    out = subprocess.run(group.join_argv(["/bin/sh", "-c", script], env), env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    pid = lines[0].removeprefix("pid=")
    assert [(tmp_path / n / "cgroup.procs").read_text() for n in ("a", "b")] == [pid, pid]
    assert not any(line.startswith("LC_CTYPE=") for line in lines)
    ignored = int(next(line for line in lines if line.startswith("SigIgn:")).split()[1], 16)
    assert ignored & (1 << 12 | 1 << 24) == 0  # SIGPIPE (13), SIGXFSZ (25)
    kept = subprocess.run(
        group.join_argv(["env"], {**env, "LC_CTYPE": "C"}), env={**env, "LC_CTYPE": "C"}, capture_output=True, text=True
    )
    assert "LC_CTYPE=C" in kept.stdout.splitlines()
    missing = subprocess.run(group.join_argv(["no-such-command-x"], env), env=env, capture_output=True, text=True)
    assert (missing.returncode, missing.stderr) == (127, "kiln: command not found: no-such-command-x\n")
    (tmp_path / "a" / "cgroup.procs").unlink()
    refused = subprocess.run(group.join_argv(["true"], env), env=env, capture_output=True, text=True)
    assert refused.returncode == 125 and "cannot join the job's control group" in refused.stderr
    assert cgroups.JobCgroup("none").join_argv(["true"], env) == ["true"]  # no groups: the command as it is


def test_without_a_pids_group_the_sandbox_sets_rlimit_nproc() -> None:
    box = {"bwrap": "/usr/bin/bwrap", "prlimit": "/usr/bin/prlimit", "scratch": "/s", "chdir": "/w"}
    argv = sandbox.wrap(box, ["train"], "/t", (), 1000, rlimit_nproc=64)
    assert argv[-5:] == ["/usr/bin/prlimit", "--fsize=1000", "--nproc=64", "--", "train"]
    assert "--nproc=64" not in sandbox.wrap(box, ["train"], "/t", (), 1000)


def _real_group(pids: int, cpus: float | None) -> cgroups.JobCgroup:
    group = cgroups.JobCgroup.create(f"unit-{uuid.uuid4().hex[:12]}", cpus, pids)
    if "pids" not in group.dirs:
        group.remove()
        pytest.skip("no writable pids control group here (not root, or /sys/fs/cgroup read-only)")
    return group


def test_a_real_group_holds_a_fork_storm_at_its_limit_and_is_removed_with_it() -> None:
    group = _real_group(24, None)
    storm = (
        "import os, time\nborn = 0\ntry:\n    for _ in range(200):\n        if os.fork() == 0:\n"
        "            time.sleep(30)\n            os._exit(0)\n        born += 1\nexcept OSError:\n    pass\n"
        "print(born, flush=True)\ntime.sleep(30)\n"
    )
    proc = subprocess.Popen(
        group.join_argv([sys.executable, "-c", storm], dict(os.environ)), stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        born = int(proc.stdout.readline())
        assert born < 24  # the wrapper (now the storm) is one of the 24
        assert group.pids_refused() >= 1 and (group.pids_peak() or group.pids_current() or 0) <= 24
        assert proc.pid in group.pids()
    finally:
        assert group.remove() == []  # kills what is in it, then removes it
        proc.wait(10)
    assert not any(os.path.exists(p) for p in (*group.paths(), *cgroups.existing(group.name).paths()))


# Prints the command's open descriptors with what each is (the listing's own is closed by the time it is read).
FDS = (
    "import os\nfds = {}\nfor name in os.listdir('/proc/self/fd'):\n    try:\n"
    "        fds[int(name)] = os.readlink('/proc/self/fd/' + name)\n    except OSError:\n        pass\n"
    "print(sorted(fds), flush=True)\n"
)


def _bwrap(command: list[str], die_with_parent: bool = True) -> list[str]:
    bwrap = "/usr/bin/bwrap"
    if not os.access(bwrap, os.X_OK):
        pytest.skip("no bubblewrap here")
    user = [] if os.geteuid() == 0 else ["--unshare-user"]
    dies = ["--die-with-parent"] if die_with_parent else []
    argv = [bwrap, *user, "--dev-bind", "/", "/", "--unshare-pid", *dies, "--", *command]
    if subprocess.run([*argv[: argv.index("--")], "--", "true"], capture_output=True).returncode != 0:
        pytest.skip("bubblewrap cannot run here")
    return argv


def test_a_joined_sandbox_runs_in_the_groups_and_its_command_holds_no_pipe_of_the_join(tmp_path: Path) -> None:
    """The command inherits no descriptor of the join: bubblewrap closes the block fd once it has read the byte,
    and the info fd in the sandbox (the block pipe's write end stays the shim's)."""
    (tmp_path / "cgroup.procs").write_text("")
    join = cgroups.BwrapJoin([str(tmp_path)])
    proc = subprocess.Popen(
        join.argv(_bwrap([sys.executable, "-c", FDS])),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        close_fds=True,
        pass_fds=join.pass_fds,
        text=True,
    )
    assert join.admit(proc.pid) == ""
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out.strip() == "[0, 1, 2]", out
    assert (tmp_path / "cgroup.procs").read_text().strip()  # bubblewrap's and its sandbox's pids were written


SHIM_DIES = """
import json, os, subprocess, sys, time
from kiln.injob import cgroups
join = cgroups.BwrapJoin([sys.argv[1]])
proc = subprocess.Popen(join.argv(sys.argv[2:]), close_fds=True, pass_fds=join.pass_fds)
for fd in (join.info_w, join.block_r):  # what admit closes first; then this "shim" dies before the byte
    os.close(fd)
info = b""
while not info.rstrip().endswith(b"}"):
    info += os.read(join.info_r, 4096)
print(proc.pid, json.loads(info)["child-pid"], flush=True)
time.sleep(60)
"""


def test_a_sandbox_whose_shim_dies_before_the_go_ahead_never_runs_its_command(tmp_path: Path) -> None:
    """Killed between bubblewrap's set-up and the byte that lets it go on, the shim leaves a sandbox that never
    reads end-of-file (it holds the block pipe as a writer too), so its command never starts outside the job's
    groups (the shim's ``--die-with-parent`` then kills it; left out here, so that only the pipe holds it)."""
    marker = tmp_path / "ran"
    (tmp_path / "cgroup.procs").write_text("")
    argv = _bwrap(["/bin/sh", "-c", f"touch {marker}"], die_with_parent=False)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    shim = subprocess.Popen(
        [sys.executable, "-c", SHIM_DIES, str(tmp_path), *argv], stdout=subprocess.PIPE, text=True, env=env
    )
    sandbox_pids: list[int] = []
    try:
        assert shim.stdout is not None
        sandbox_pids = [int(v) for v in shim.stdout.readline().split()]
        assert len(sandbox_pids) == 2  # bubblewrap, and its sandbox, made and waiting for the byte
    finally:
        shim.kill()
        shim.wait(10)
    try:
        time.sleep(0.5)
        assert not marker.exists()
        assert os.path.exists(f"/proc/{sandbox_pids[1]}")  # still blocked
    finally:
        for pid in reversed(sandbox_pids):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_a_steps_processes_are_measured_from_its_pids_group(tmp_path: Path) -> None:
    """The memory check and the system metrics read the step's pids group (one file), not every process on the
    machine; the shim itself and its helpers are never the job's. A step outside the groups walks the tree."""
    (tmp_path / "cgroup.procs").write_text("10\n11\n12\n13\n")

    class Limits(shimlimits.JobLimits):
        me = 11
        helpers = {12}

        def tree(self) -> list[int]:
            return [99]

    limits = Limits()
    limits._step_group = cgroups.JobCgroup("g", {"pids": str(tmp_path)})
    assert limits.job_processes() == [10, 13]
    (tmp_path / "cgroup.procs").unlink()  # gone (removed with the attempt): the tree
    assert limits.job_processes() == [99]
    limits._step_group = None
    assert limits.job_processes() == [99]

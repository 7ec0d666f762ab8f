"""What the local executor's job sandbox holds, and whether this machine can build one.

The shim wraps each of the job's steps in bubblewrap (``injob/sandbox.py``); this module decides, for one
attempt, what the sandbox shows (the system's ``/usr`` and ``/etc``, the runtime's interpreter, the job's own
directories) and as whom the job runs, and finds out once, when the server starts, which isolation the machine
allows (:class:`SandboxPolicy`):

- ``root``: the server runs as root and bubblewrap works. Each organisation's jobs run as their own uid
  (``KILN_SANDBOX_UID_BASE`` + a number derived from the organisation), without capabilities, and cannot read
  what the server's files hold even where a path leaked.
- ``userns``: the server is not root; bubblewrap makes a user namespace, and the job keeps the server's uid
  outside it. It still sees none of the server's files (nothing is mounted in but its own).
- ``none``: ``KILN_SANDBOX=none``, the operator's explicit choice: jobs run as the server's user and see the
  machine's whole filesystem.

With ``KILN_SANDBOX=bwrap`` (the default) on a machine where bubblewrap is missing or cannot run, jobs are refused
at submit with the reason and how to fix it; nothing runs unsandboxed by accident.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import logging
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kiln as kiln_package
from kiln.backends.local.seccomp import SeccompUnavailable, filter_file
from kiln.injob import sandbox as runtime_sandbox
from kiln.settings import Settings

log = logging.getLogger(__name__)

UID_SPAN = 1 << 24
SYSTEM_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
SYSTEM_DIRS = ("/usr", "/etc", "/opt", "/sys")
JOB_USER = "kiln-job"


def org_uid(base: int, org_id: str) -> int:
    """The uid (and gid) an organisation's jobs run as: stable, derived from its id, within 2^24 of ``base``."""
    digest = hashlib.sha256(org_id.encode()).digest()
    return base + int.from_bytes(digest[:4], "big") % UID_SPAN


def _covered(path: str, tops: tuple[str, ...] | list[str]) -> bool:
    return any(path == top or path.startswith(top.rstrip("/") + "/") for top in tops)


def _outermost(paths: Any) -> list[str]:
    kept: list[str] = []
    for path in sorted(set(paths), key=len):
        if not _covered(path, kept):
            kept.append(path)
    return sorted(kept)


@dataclass(frozen=True)
class SandboxPolicy:
    kind: str  # "root", "userns", "none" or "unavailable"
    detail: str  # what the server logs at start (and, when unavailable, why)
    bwrap: str | None = None
    setpriv: str | None = None
    prlimit: str | None = None
    seccomp: str | None = None  # the compiled seccomp filter every job's command runs under (seccomp.py)

    @property
    def problem(self) -> str | None:
        """Why jobs are refused, or None."""
        if self.kind != "unavailable":
            return None
        return (
            f"this server cannot sandbox jobs ({self.detail}); install bubblewrap (apt-get install bubblewrap), "
            "or an operator may set KILN_SANDBOX=none to run jobs unsandboxed as the server's user"
        )

    @property
    def sandboxed(self) -> bool:
        return self.kind in ("root", "userns")

    def box_for(self, uid: int, scratch: str, chdir: str, ro: list[str], rw: list[str]) -> dict[str, Any]:
        return _policy_box(self, uid, scratch, chdir, ro, rw)


def detect(settings: Settings) -> SandboxPolicy:
    """Which isolation this machine allows, found by running a trivial command in a sandbox once."""
    if settings.sandbox == "none":
        return SandboxPolicy(
            "none", "KILN_SANDBOX=none: jobs run unsandboxed, as the server's user, seeing the whole filesystem"
        )
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return SandboxPolicy("unavailable", "bubblewrap (bwrap) is not installed")
    root = os.geteuid() == 0
    setpriv = shutil.which("setpriv")
    if root and setpriv is None:
        return SandboxPolicy("unavailable", "setpriv (util-linux) is not installed")
    try:  # once per server start: job starts only open the file
        seccomp = filter_file(Path(settings.home) / "sandbox", settings.job_user_namespaces)
    except (SeccompUnavailable, OSError) as exc:
        return SandboxPolicy("unavailable", f"no seccomp filter for jobs: {exc}")
    policy = SandboxPolicy(
        "root" if root else "userns", "", bwrap, setpriv if root else None, shutil.which("prlimit"), seccomp
    )
    with tempfile.TemporaryDirectory(prefix="kiln-sandbox-probe-") as scratch:
        os.mkdir(os.path.join(scratch, "shm"))
        os.chmod(scratch, 0o755)
        box = policy.box_for(settings.sandbox_uid_base + UID_SPAN - 1, scratch, chdir="/", ro=[], rw=[])
        why = runtime_sandbox.probe(box)
    if why:
        return SandboxPolicy("unavailable", f"bubblewrap does not run here: {why}")
    version = _version(bwrap)
    if root:
        detail = (
            f"{version}: jobs run in a sandbox as a per-organisation uid "
            f"({settings.sandbox_uid_base}+), seeing only their own files"
        )
    else:
        detail = (
            f"{version} in a user namespace: jobs see only their own files but keep the server's uid "
            f"({pwd.getpwuid(os.geteuid()).pw_name}) outside the sandbox; run the server as root for "
            "per-organisation uids"
        )
    detail += "; a seccomp filter refuses " + (
        "kernel-level system calls (user namespaces allowed: KILN_JOB_USER_NAMESPACES)"
        if settings.job_user_namespaces
        else "namespaces, mounts and other kernel-level system calls"
    )
    return SandboxPolicy(policy.kind, detail, bwrap, policy.setpriv, policy.prlimit, seccomp)


def _version(bwrap: str) -> str:
    try:
        out = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    return out or "bubblewrap"


def _policy_box(
    policy: SandboxPolicy,
    uid: int,
    scratch: str,
    chdir: str,
    ro: list[str],
    rw: list[str],
    hidden: tuple[str, ...] = (),
) -> dict:
    symlinks: dict[str, str] = {}
    system: list[str] = []
    for top in (*SYSTEM_DIRS, *("/" + name for name in SYSTEM_LINKS)):
        if os.path.islink(top) and top[1:] in SYSTEM_LINKS:
            symlinks[top] = os.readlink(top)
        elif os.path.isdir(top):
            system += _showing_all_but(top, hidden, symlinks)
    return {
        "bwrap": policy.bwrap,
        "setpriv": policy.setpriv,
        "prlimit": policy.prlimit,
        "uid": uid if policy.kind == "root" else None,
        "gid": uid if policy.kind == "root" else None,
        "symlinks": symlinks,
        "ro": system + _outermost(p for p in ro if not _covered(p, system)),
        "rw": sorted(set(rw)),
        "dev": [],
        "scratch": scratch,
        "chdir": chdir,
        "seccomp": policy.seccomp,
    }


def _private_trees(settings: Settings) -> tuple[str, ...]:
    """What no job may see even where it lies in a system directory: $KILN_HOME and a local object store."""
    trees = [settings.home]
    store = settings.resolved_storage_url
    if "://" not in store or store.startswith("file://"):
        trees.append(Path(store.removeprefix("file://")))
    return tuple(os.path.realpath(t) for t in trees)


def _showing_all_but(top: str, hidden: tuple[str, ...], symlinks: dict[str, str]) -> list[str]:
    """``top`` as a list of binds that leaves out ``hidden`` ($KILN_HOME kept in /opt, say): ``top`` itself, or
    its entries but the one on the way to a hidden path, that one split the same way (links among them go into
    ``symlinks``)."""
    inside = [h for h in hidden if h != top and h.startswith(top.rstrip("/") + "/")]
    if any(_covered(top, [h]) for h in hidden):
        return []
    if not inside:
        return [top]
    out: list[str] = []
    try:
        entries = sorted(os.scandir(top), key=lambda e: e.name)
    except OSError:
        return []
    for entry in entries:
        if entry.is_symlink():
            symlinks[entry.path] = os.readlink(entry.path)
        elif entry.is_dir(follow_symlinks=False):
            out += _showing_all_but(entry.path, hidden, symlinks)
        else:
            out.append(entry.path)
    return out


def attempt_box(
    policy: SandboxPolicy,
    settings: Settings,
    org_id: str,
    dirs: dict[str, Path],
    attempt_dir: Path,
    member_dir: Path,
    runtime_roots: tuple[str, ...],
    pylib: Path | None,
    gpus: tuple[int, ...],
    memory: int | None,
) -> dict[str, Any] | None:
    """The ``"sandbox"`` entry of one member's ``shim.json`` (None when jobs run unsandboxed). Of the machine it
    shows the system's directories, the runtime's ``runtime_roots`` (no more than its venv and installations, as
    ``python_policy.py`` allowed them) and Kiln's package; of $KILN_HOME only this job's own directories, its
    attempt's (read-only) and ``pylib``."""
    if not policy.sandboxed:
        return None
    uid = org_uid(settings.sandbox_uid_base, org_id)
    ro = [*runtime_roots, str(attempt_dir)]
    if pylib is not None:
        ro += [str(pylib), str(Path(kiln_package.__file__).resolve().parent)]
    rw = [str(dirs[name]) for name in ("work", "outputs", "checkpoints", "site", "metrics", "tensorboard", "home")]
    hidden = _private_trees(settings)
    box = _policy_box(policy, uid, str(member_dir / "scratch"), str(dirs["work"]), ro, rw, hidden)
    box["scratch_bytes"] = memory
    if gpus:
        box["dev"] = sorted(p for p in glob.glob("/dev/nvidia*") if not os.path.isdir(p))
    passwd = member_dir / "passwd"
    passwd.write_text(_passwd(uid if policy.kind == "root" else os.geteuid(), str(dirs["home"])))
    box["passwd"] = str(passwd)
    return box


def _passwd(uid: int, home: str) -> str:
    """The machine's /etc/passwd with a line for the job's uid (tools that look their user up find one)."""
    text = _machine_passwd()
    if f":x:{uid}:" not in text:
        text = text.rstrip("\n") + f"\n{JOB_USER}:x:{uid}:{uid}:Kiln job:{home}:/bin/sh\n"
    return text


@functools.lru_cache(maxsize=1)
def _machine_passwd() -> str:
    try:
        return Path("/etc/passwd").read_text()
    except OSError:
        return ""


def job_group(policy: SandboxPolicy, org_id: str, settings: Settings) -> int | None:
    """The group of the attempt's directory, through which the job reads its notice and parameters (the rest
    of the job's directory is root's alone): the organisation's gid when jobs run as one, else None (the job
    keeps the server's uid, or runs unsandboxed)."""
    return org_uid(settings.sandbox_uid_base, org_id) if policy.kind == "root" else None


def prepare_dirs(policy: SandboxPolicy, org_id: str, settings: Settings, dirs: dict[str, Path]) -> None:
    """The job's writable directories belong to its uid (the shim gives it the extracted code later)."""
    if policy.kind != "root":
        return
    uid = org_uid(settings.sandbox_uid_base, org_id)
    for name in ("outputs", "checkpoints", "site", "metrics", "tensorboard", "home"):
        runtime_sandbox.chown_tree(str(dirs[name]), uid, uid)

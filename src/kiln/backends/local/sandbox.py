"""What the local executor's job sandbox holds, and whether this machine can build one.

The shim wraps each of the job's steps in bubblewrap (``runtime/sandbox.py``); this module decides, for one
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
from kiln.runtime import sandbox as runtime_sandbox
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


@functools.lru_cache(maxsize=256)
def _cached_roots(bin_dir: str | None, pythons: tuple[str | None, ...]) -> tuple[str, ...]:
    return tuple(python_roots(bin_dir, *pythons))


def python_roots(bin_dir: str | None, *pythons: str | None) -> list[str]:
    """The directories a runtime's interpreter needs: its venv, and the installation the venv was made from
    (``pythons``: the interpreter, and the base a venv still to be built will be made from)."""
    roots: set[str] = set()
    candidates = [p for p in (*pythons, bin_dir and os.path.join(bin_dir, "python")) if p]
    if bin_dir:
        venv = os.path.dirname(os.path.abspath(bin_dir))
        roots.add(venv)
        try:
            for line in Path(venv, "pyvenv.cfg").read_text().splitlines():
                key, _, value = line.partition("=")
                if key.strip() == "home" and value.strip():
                    roots.add(os.path.dirname(os.path.realpath(value.strip())))
        except OSError:
            pass
    for exe in candidates:
        real = os.path.realpath(exe)
        if os.path.exists(real):
            roots.add(os.path.dirname(os.path.dirname(real)))
    return _outermost(p for p in roots if p not in ("/", "") and not _covered(p, SYSTEM_DIRS))


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
    policy = SandboxPolicy("root" if root else "userns", "", bwrap, setpriv if root else None, shutil.which("prlimit"))
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
    return SandboxPolicy(policy.kind, detail, bwrap, policy.setpriv, policy.prlimit)


def _version(bwrap: str) -> str:
    try:
        out = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    return out or "bubblewrap"


def _policy_box(policy: SandboxPolicy, uid: int, scratch: str, chdir: str, ro: list[str], rw: list[str]) -> dict:
    symlinks: dict[str, str] = {}
    system: list[str] = [d for d in SYSTEM_DIRS if os.path.isdir(d)]
    for name in SYSTEM_LINKS:
        path = "/" + name
        if os.path.islink(path):
            symlinks[path] = os.readlink(path)
        elif os.path.isdir(path):
            system.append(path)
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
    }


def attempt_box(
    policy: SandboxPolicy,
    settings: Settings,
    org_id: str,
    dirs: dict[str, Path],
    attempt_dir: Path,
    member_dir: Path,
    runtime_bin: str | None,
    runtime_pythons: tuple[str | None, ...],
    pylib: Path | None,
    gpus: tuple[int, ...],
    memory: int | None,
) -> dict[str, Any] | None:
    """The ``"sandbox"`` entry of one member's ``shim.json`` (None when jobs run unsandboxed)."""
    if not policy.sandboxed:
        return None
    uid = org_uid(settings.sandbox_uid_base, org_id)
    # Cached once the venv exists (a runtime still to be built is looked at again next time).
    roots = (
        _cached_roots(runtime_bin, runtime_pythons)
        if runtime_bin is None or os.path.exists(os.path.join(runtime_bin, "python"))
        else tuple(python_roots(runtime_bin, *runtime_pythons))
    )
    ro = [*roots, str(attempt_dir)]
    if pylib is not None:
        ro += [str(pylib), str(Path(kiln_package.__file__).resolve().parent)]
    rw = [str(dirs[name]) for name in ("work", "outputs", "checkpoints", "site", "metrics", "tensorboard", "home")]
    box = _policy_box(policy, uid, str(member_dir / "scratch"), str(dirs["work"]), ro, rw)
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


def prepare_dirs(policy: SandboxPolicy, org_id: str, settings: Settings, dirs: dict[str, Path]) -> None:
    """The job's writable directories belong to its uid (the shim gives it the extracted code later)."""
    if policy.kind != "root":
        return
    uid = org_uid(settings.sandbox_uid_base, org_id)
    for name in ("outputs", "checkpoints", "site", "metrics", "tensorboard", "home"):
        runtime_sandbox.chown_tree(str(dirs[name]), uid, uid)

"""The job's sandbox, as the shim builds it: a bubblewrap command line around each of the job's steps, the job's
private ``/dev/shm``, and what the job's files weigh on disk.

Standard library only, like the shim that loads it (as ``kiln.injob.sandbox`` in the package, or as a plain
module from this file's directory when the shim runs as a script). The executor decides what the sandbox holds
(``backends/local/sandbox.py``) and passes it in ``shim.json`` as ``"sandbox"``::

    {"bwrap": "/usr/bin/bwrap", "setpriv": "/usr/bin/setpriv" or null,
     "uid": 1500012345, "gid": 1500012345,      # root: drop to these inside; null: keep the server's (userns)
     "ro": [paths bound read-only at the same path], "rw": [paths bound writable at the same path],
     "dev": [device nodes bound, e.g. /dev/nvidia0], "symlinks": {"/bin": "usr/bin", ...},
     "scratch": the member's scratch dir, "scratch_bytes": size of the tmpfs mounted there (its ``shm/`` is the
     job's /dev/shm, a fresh ``tmp-N/`` its /tmp for each step), "prlimit": "/usr/bin/prlimit" or null,
     "passwd": file bound over /etc/passwd, "chdir": the work dir,
     "seccomp": the compiled seccomp filter (BPF) the job's command runs under, or null}

The scratch dir is a tmpfs when the shim can mount one (root): what the job keeps in /dev/shm and /tmp is
memory, counted against its memory limit and gone when the attempt ends. /tmp is a fresh directory for each
step, so nothing the job left there can steer where bubblewrap mounts the next step's paths.

Inside, the job sees the system's read-only ``/usr`` and ``/etc``, its runtime, its own directories at their
usual paths and nothing else of the machine's files; its own pid namespace (it cannot see or signal other
processes, and every process it leaves is killed when its command exits); its own SysV IPC (shared memory,
semaphores, message queues: invisible to other jobs, gone when the step ends); and, when the executor gives it
one, its attempt's own network namespace (``netns.py``: the shim starts each step in it). When the server runs
as root, bubblewrap sets the sandbox up as root and the job runs as the organisation's uid with no capabilities
(``setpriv``); otherwise bubblewrap uses a user namespace and the job keeps the server's uid outside it.
"""

from __future__ import annotations

import os
import stat
import subprocess

# Sizes in the messages of the limits (shimbox.py), re-exported.
if __package__:
    from kiln.injob.units import human as human
else:  # loaded by the shim run as a script: its directory is on sys.path
    from units import human as human  # type: ignore[no-redef]
CGROUP_FS = "/sys/fs/cgroup"
SIGXFSZ_EXIT = 128 + 25  # a process killed for writing a file beyond RLIMIT_FSIZE


def wrap(
    box: dict,
    argv: list[str],
    tmp: str,
    extra_ro: tuple[str, ...] = (),
    rlimit_fsize: int | None = None,
    rlimit_nproc: int | None = None,
    env_after: dict[str, str] | None = None,
    seccomp_fd: int | None = None,
) -> list[str]:
    """``argv`` run inside the sandbox described by ``box``, with ``tmp`` as its /tmp; ``extra_ro`` are more
    paths to show read-only (the trees of the inputs staged for this attempt). ``rlimit_fsize``: the largest
    file the job may write; ``rlimit_nproc``: the most processes its uid may have (RLIMIT_NPROC).
    ``env_after``: the job's variables that must not reach what runs before it drops privileges
    (:func:`deferred_env`), set by ``env`` once it has, right before the command. ``seccomp_fd``: an inherited
    fd reading the box's seccomp filter (:func:`open_seccomp`), loaded by bubblewrap after its own set-up."""
    out = [
        box["bwrap"],
        "--die-with-parent",
        "--unshare-pid",
        "--unshare-ipc",  # SysV shared memory, semaphores and message queues of its own, gone with it
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--bind",
        tmp,
        "/tmp",
    ]
    if box.get("uid") is None:
        out.append("--unshare-user")
    for link, target in sorted((box.get("symlinks") or {}).items()):
        out += ["--symlink", target, link]
    made: set[str] = set()
    for path in box.get("ro", []):
        out += [*_parents(path, made), "--ro-bind", path, path]
    for path in extra_ro:
        if os.path.exists(path):
            out += [*_parents(path, made), "--ro-bind", path, path]
    if any(p == CGROUP_FS or CGROUP_FS.startswith(p.rstrip("/") + "/") for p in box.get("ro", [])):
        # The machine's control groups name every other job (kiln/<job id>-<attempt>), with their processes and
        # usage: an empty, read-only directory in their place.
        out += ["--tmpfs", CGROUP_FS, "--remount-ro", CGROUP_FS]
    writable = sorted(box.get("rw", []))
    for path in writable:
        if any(path.startswith(other.rstrip("/") + "/") for other in writable):
            continue  # inside another writable bind already (the job could swap it for a link meanwhile)
        out += [*_parents(path, made), "--bind", path, path]
    for path in box.get("dev", []):
        out += ["--dev-bind", path, path]
    if box.get("passwd"):
        out += ["--ro-bind", box["passwd"], "/etc/passwd"]
    out += ["--bind", os.path.join(box["scratch"], "shm"), "/dev/shm"]
    out += ["--chdir", box["chdir"]]
    if seccomp_fd is not None:
        out += ["--seccomp", str(seccomp_fd)]
    inner: list[str] = []
    if box.get("uid") is not None:
        out += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        inner = [
            box["setpriv"],
            f"--reuid={box['uid']}",
            f"--regid={box['gid']}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]
    rlimits = [f"--fsize={int(rlimit_fsize)}"] if rlimit_fsize else []
    if rlimit_nproc:  # the process limit where no pids control group holds the job (it counts the whole uid)
        rlimits.append(f"--nproc={int(rlimit_nproc)}")
    if rlimits and box.get("prlimit"):
        inner += [box["prlimit"], *rlimits, "--"]
    if env_after:
        inner += [ENV, "--", *(f"{k}={v}" for k, v in sorted(env_after.items()))]
    return [*out, "--", *inner, *argv]


# What the dynamic loader and the C library read from the environment at every program's start (glibc's list of
# variables it ignores in setuid programs, and its tunables). A job's spec may set them, but the programs that
# build its sandbox run as root (bubblewrap, setpriv; as the server's user without root): there LD_PRELOAD=a .so
# of the job's would run the job's code outside the sandbox. They are held back and set only after the job's
# privileges are dropped.
LOADER_VARIABLES = frozenset(
    {
        "GCONV_PATH",
        "GETCONF_DIR",
        "GLIBC_TUNABLES",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "LOCPATH",
        "MALLOC_TRACE",
        "NIS_PATH",
        "NLSPATH",
        "RESOLV_HOST_CONF",
        "RES_OPTIONS",
        "TMPDIR",
        "TZDIR",
    }
)
ENV = "/usr/bin/env"


def deferred_env(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` that only the job's own processes may see (:data:`LOADER_VARIABLES`, ``LD_*``,
    ``MALLOC_*``)."""
    return {k: v for k, v in env.items() if k in LOADER_VARIABLES or k.startswith(("LD_", "MALLOC_"))}


def _parents(path: str, made: set[str]) -> list[str]:
    """``--dir`` (mode 0755) for each parent of ``path`` not yet made: bubblewrap would copy the host's mode of
    such a parent (``/root`` is 0700), and the job's uid could not walk through it to its own files."""
    out: list[str] = []
    parts = [p for p in path.split("/") if p]
    for i in range(1, len(parts)):
        parent = "/" + "/".join(parts[:i])
        if parent in made or parent in ("/usr", "/etc", "/proc", "/dev"):
            continue
        made.add(parent)
        out += ["--perms", "0755", "--dir", parent]
    return out


def open_seccomp(box: dict, at: int | None = None) -> int | None:
    """A fresh fd reading the box's seccomp filter from its start, or None where it has none. bubblewrap reads
    the fd it is given to its end, so each bubblewrap needs its own open file; ``at``: put it at that fd number
    (the one a command line built earlier names)."""
    path = box.get("seccomp")
    if not path:
        return None
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    if at is None or at == fd:
        return fd
    os.dup2(fd, at, inheritable=False)
    os.close(fd)
    return at


def probe(box: dict) -> str | None:
    """None when a trivial command runs in this sandbox (under its seccomp filter), else why not (bubblewrap's
    own words)."""
    try:
        fd = open_seccomp(box)
        try:
            proc = subprocess.run(
                wrap(box, ["/bin/true"], box["scratch"], seccomp_fd=fd),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=20,
                close_fds=True,
                pass_fds=() if fd is None else (fd,),
            )
        finally:
            if fd is not None:
                os.close(fd)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if proc.returncode != 0:
        return (proc.stderr or proc.stdout).decode(errors="replace").strip() or f"exit code {proc.returncode}"
    return None


# -- the job's /dev/shm and /tmp ---------------------------------------------------------------------------------------


def mount_scratch(path: str, size: int | None) -> bool:
    """A tmpfs of ``size`` bytes at ``path`` (root only), holding the job's /dev/shm and /tmp, so that what
    they hold is measured and dies with the attempt. False when it cannot be mounted: a plain directory then."""
    os.makedirs(path, exist_ok=True)
    if os.path.ismount(path):
        return True
    if os.geteuid() != 0:
        return False
    options = "mode=1777" + (f",size={int(size)}" if size else "")
    libc = _libc()
    if libc is not None:  # mount(2) itself: no mount(8) process to fork on every job's start
        flags = MS_NOSUID | MS_NODEV
        if libc.mount(b"kiln-shm", path.encode(), b"tmpfs", flags, options.encode()) == 0:
            return True
    try:
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options + ",nosuid,nodev", "kiln-shm", path],
            capture_output=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def unmount_scratch(path: str) -> None:
    """Drop the job's /dev/shm and /tmp (lazily: a process still holding them lets go when it exits)."""
    if os.path.ismount(path):
        libc = _libc()
        if libc is not None and libc.umount2(path.encode(), MNT_DETACH) == 0:
            return
        try:
            subprocess.run(["umount", "-l", path], capture_output=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            pass


MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2
_LIBC: list = []


def _libc():  # type: ignore[no-untyped-def]
    """The C library (for mount(2) and umount2(2)), or None where ctypes cannot load it."""
    if not _LIBC:
        try:
            import ctypes

            _LIBC.append(ctypes.CDLL(None, use_errno=True))
        except (OSError, ImportError):
            _LIBC.append(None)
    return _LIBC[0]


def tmpfs_used(path: str) -> int:
    """Bytes held by the tmpfs mounted at ``path`` (0 when it is not one)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return 0
    return (st.f_blocks - st.f_bfree) * st.f_frsize


# -- disk ---------------------------------------------------------------------------------------------------


def disk_used(paths: list[str]) -> int:
    """Bytes under ``paths`` as the job's limit counts them (each inode once; links not followed, mounts not
    crossed): a regular file counts its apparent size or its allocated blocks, whichever is more. The apparent
    size, because that is what the file costs once copied anywhere (into the store as outputs or checkpoints,
    where S3 keeps no holes): a sparse file of 95 MiB holding 4 KiB counted 4 KiB, and twenty of them passed a
    100 MiB limit (issue 43). The blocks, because a file written through preallocation can hold more than it
    shows; a directory counts its blocks."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for top in paths:
        try:
            top_dev = os.lstat(top).st_dev
        except OSError:
            continue
        stack = [top]
        while stack:
            path = stack.pop()
            try:
                entries = list(os.scandir(path))
            except OSError:
                continue
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                key = (st.st_dev, st.st_ino)
                if key in seen:
                    continue
                seen.add(key)
                total += max(st.st_size, st.st_blocks * 512) if stat.S_ISREG(st.st_mode) else st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode) and st.st_dev == top_dev:
                    stack.append(entry.path)
    return total


def chown_tree(top: str, uid: int, gid: int) -> None:
    """Give the job's uid what it may write (links are changed themselves, never followed)."""
    try:
        os.lchown(top, uid, gid)
    except OSError:
        return
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for name in dirnames + filenames:
            try:
                os.lchown(os.path.join(dirpath, name), uid, gid)
            except OSError:
                pass


# -- SysV shared memory -------------------------------------------------------------------------------------

CLONE_NEWIPC = 0x08000000


def sysv_shm_bytes(pids: list[int]) -> int:
    """Bytes resident in the SysV shared memory segments of the IPC namespaces ``pids`` run in (each namespace
    once; the shim's own, the machine's, never). A job's step has an IPC namespace of its own, so what it keeps
    there is its memory: counted against its limit, gone when the step ends. Read by moving the calling thread
    into each namespace for one read of ``/proc/sysvipc/shm``, which lists the reader's namespace."""
    libc = _libc()
    if libc is None or not pids:
        return 0
    try:
        own = os.open("/proc/thread-self/ns/ipc", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0
    total = 0
    try:
        seen = {os.fstat(own).st_ino}
        for pid in pids:
            try:
                fd = os.open(f"/proc/{pid}/ns/ipc", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                ino = os.fstat(fd).st_ino
                if ino in seen or libc.setns(fd, CLONE_NEWIPC) != 0:
                    continue
                seen.add(ino)
                try:
                    with open("/proc/sysvipc/shm") as fh:
                        total += _shm_rss(fh.read())
                finally:
                    libc.setns(own, CLONE_NEWIPC)
            finally:
                os.close(fd)
    finally:
        os.close(own)
    return total


def _shm_rss(table: str) -> int:
    lines = table.splitlines()
    if not lines:
        return 0
    header = lines[0].split()
    column = header.index("rss") if "rss" in header else -1
    if column < 0:
        return 0
    total = 0
    for line in lines[1:]:
        fields = line.split()
        if len(fields) > column and fields[column].isdigit():
            total += int(fields[column])
    return total

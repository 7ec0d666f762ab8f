"""The seccomp filter of every sandboxed job: the system calls a job has no business making, refused with EPERM.

In the shape of Docker's default profile, as a deny list: everything else is allowed. What it refuses is the
kernel surface most container escapes go through (namespaces and mounts, BPF, keyrings, kernel modules, perf,
userfaultfd, io_uring, file handles, attaching ptrace to another process) and what changes the machine
(clock, swap, reboot, accounting, quotas). ``clone3`` answers ENOSYS instead: its flags sit behind a pointer a
filter cannot read, so the C library falls back to ``clone``, whose namespace flags are filtered.

Compiled with libseccomp (through the ``pyseccomp`` ctypes binding) for the machine's native architecture
(x86_64, aarch64), once per server start, into a content-addressed file; the shim hands it to bubblewrap as an
inherited fd (``--seccomp FD``) and bubblewrap loads it right before the job's command, after its own set-up.
``KILN_JOB_USER_NAMESPACES=true`` lets jobs make user namespaces, and inside them mount, setns and pivot_root
(the kernel confines those to namespaces the job owns).
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import tempfile
from pathlib import Path

# Namespace flags of clone(2) and unshare(2) (linux/sched.h).
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWTIME = 0x00000080  # unshare(2) only: in clone(2) these bits are the exit signal
NAMESPACE_FLAGS = (
    CLONE_NEWNS,
    CLONE_NEWCGROUP,
    CLONE_NEWUTS,
    CLONE_NEWIPC,
    CLONE_NEWUSER,
    CLONE_NEWPID,
    CLONE_NEWNET,
)

# Refused outright. A name the native architecture lacks (vm86 on aarch64) costs nothing.
DENIED = (
    "acct",
    "add_key",
    "bpf",
    "clock_adjtime",
    "clock_settime",
    "create_module",
    "delete_module",
    "fanotify_init",
    "finit_module",
    "get_kernel_syms",
    "init_module",
    "io_uring_enter",
    "io_uring_register",
    "io_uring_setup",
    "ioperm",
    "iopl",
    "kcmp",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "name_to_handle_at",
    "nfsservctl",
    "open_by_handle_at",
    "perf_event_open",
    "query_module",
    "quotactl",
    "quotactl_fd",
    "reboot",
    "request_key",
    "settimeofday",
    "stime",
    "swapoff",
    "swapon",
    "_sysctl",
    "sysfs",
    "syslog",
    "uselib",
    "userfaultfd",
    "ustat",
    "vm86",
    "vm86old",
)
# What a user namespace is for: refused unless the operator lets jobs make them.
NAMESPACE_CALLS = (
    "chroot",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "mount",
    "mount_setattr",
    "move_mount",
    "open_tree",
    "pivot_root",
    "setns",
    "umount",
    "umount2",
)
PTRACE_ATTACH, PTRACE_SEIZE = 16, 0x4206  # tracing a process one did not start (PTRACE_TRACEME stays allowed)
# personality(2) flags that weaken the job's own address space (ASLR off, executable data, a mapped page 0).
UNSAFE_PERSONALITY = (0x0040000, 0x0100000, 0x0200000, 0x0400000)
PERSONALITY_QUERY_BIT = 0x80000000  # set only in the query 0xffffffff among meaningful values


class SeccompUnavailable(RuntimeError):
    """libseccomp (or its binding) cannot be loaded or refused the filter."""


def compile_filter(allow_user_namespaces: bool) -> bytes:
    """The filter as a BPF program for bubblewrap's ``--seccomp``."""
    try:
        import pyseccomp as sc  # loads libseccomp.so.2: RuntimeError when the library is missing
    except (ImportError, OSError, RuntimeError) as exc:
        raise SeccompUnavailable(f"libseccomp cannot be loaded ({exc}); apt-get install libseccomp2") from exc
    eperm = sc.ERRNO(errno.EPERM)
    try:
        flt = sc.SyscallFilter(sc.ALLOW)
        for name in DENIED:
            _deny(flt, eperm, name)
        _deny(flt, eperm, "ptrace", sc.Arg(0, sc.EQ, PTRACE_ATTACH))
        _deny(flt, eperm, "ptrace", sc.Arg(0, sc.EQ, PTRACE_SEIZE))
        for bit in UNSAFE_PERSONALITY:  # the flag, in any value but the query
            _deny(flt, eperm, "personality", sc.Arg(0, sc.MASKED_EQ, bit | PERSONALITY_QUERY_BIT, bit))
        for k in range(31):  # bit 31 is meaningless but in the query 0xffffffff: refuse any other value with it
            _deny(
                flt,
                eperm,
                "personality",
                sc.Arg(0, sc.MASKED_EQ, PERSONALITY_QUERY_BIT | 1 << k, PERSONALITY_QUERY_BIT),
            )
        if not allow_user_namespaces:
            for name in NAMESPACE_CALLS:
                _deny(flt, eperm, name)
            for flag in NAMESPACE_FLAGS:  # clone's flags are its first argument on x86_64 and aarch64
                for call in ("clone", "unshare"):
                    _deny(flt, eperm, call, sc.Arg(0, sc.MASKED_EQ, flag, flag))
            _deny(flt, eperm, "unshare", sc.Arg(0, sc.MASKED_EQ, CLONE_NEWTIME, CLONE_NEWTIME))
            _deny(flt, sc.ERRNO(errno.ENOSYS), "clone3")
        with tempfile.TemporaryFile() as fh:
            flt.export_bpf(fh)
            fh.seek(0)
            return fh.read()
    except OSError as exc:
        raise SeccompUnavailable(f"libseccomp refused the job filter: {exc}") from exc


def _deny(flt, action: int, name: str, *args) -> None:  # type: ignore[no-untyped-def]
    import pyseccomp as sc

    try:
        number = sc.resolve_syscall(sc.Arch.NATIVE, name)
    except (OSError, ValueError):
        return  # unknown to this libseccomp: nothing to refuse
    flt.add_rule(action, number, *args)


@functools.lru_cache(maxsize=4)
def filter_file(directory: Path, allow_user_namespaces: bool) -> str:
    """The compiled filter in ``directory``, named by its digest (compiled once per server start; a file that
    holds these bytes already is reused, never rewritten under a running shim)."""
    program = compile_filter(allow_user_namespaces)
    path = directory / f"seccomp-{hashlib.sha256(program).hexdigest()[:16]}.bpf"
    try:
        if path.read_bytes() == program:
            return str(path)
    except OSError:
        pass
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".seccomp-")
    with os.fdopen(fd, "wb") as fh:
        fh.write(program)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return str(path)

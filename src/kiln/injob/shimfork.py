"""The shim launcher: a fork server that pays the shim's imports once, and forks one shim per attempt.

Standard library only, like the shim that loads it (as ``kiln.injob.shimfork`` in the package, or as a plain
module from this file's directory when the shim runs as a script). The executor starts it as ``python -I -S
shim.py --launcher`` (``backends/local/shims.py``) and writes one attempt directory per line to its stdin; it
answers each with the new shim's pid on its stdout. It exits when stdin closes (the server went away); the shims
it started carry on in their own sessions.

What every shim would otherwise pay again is paid here, before the first fork: the modules a shim may import
(and those of the metrics threads), the C library handles and the control-group hierarchies of the machine. The
objects it made are then frozen out of the cyclic garbage collector's reach (``gc.freeze``): a forked shim that
collects never walks them, so it copies fewer of the launcher's pages.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

if __package__:
    from kiln.injob import cgroups, netns, proctree, sandbox, shimprep
else:  # loaded by the shim run as a script: its directory is on sys.path
    import cgroups  # type: ignore[no-redef]
    import netns  # type: ignore[no-redef]
    import proctree  # type: ignore[no-redef]
    import sandbox  # type: ignore[no-redef]
    import shimprep  # type: ignore[no-redef]


def spawn_shim(attempt_dir: str, run: Callable[[str], int]) -> int:
    """Fork one shim (from the launcher) into its own session, running ``run(attempt_dir)``; returns its pid in
    the parent."""
    pid = os.fork()
    if pid:
        return pid
    code = 70
    try:
        os.setsid()
        out = os.open(os.path.join(attempt_dir, "shim.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.closerange(3, 256)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        code = run(attempt_dir)
    except BaseException as exc:  # never return into the launcher's loop
        try:
            os.write(2, f"shim failed to start: {type(exc).__name__}: {exc}\n".encode())
        except OSError:
            pass
    finally:
        os._exit(code)


def warm_up() -> None:
    """What a shim may import or read later, done once here so that every forked shim has it already."""
    import ctypes  # noqa: F401
    import fcntl  # noqa: F401
    import resource  # noqa: F401
    import shutil  # noqa: F401
    import tarfile  # noqa: F401

    sandbox._libc()  # the C library for the scratch tmpfs's mount(2), loaded once for every forked shim
    netns._libc()  # and for the job's network namespace (unshare, setns)
    cgroups.known_hierarchies()  # the machine's control-group mounts (read again where no group can be made)
    cgroups.group_name("launcher")  # its pattern compiled (re's cache)
    try:  # the metrics threads' modules (a shim imports them only when its attempt collects metrics)
        import threading  # noqa: F401

        extract = shimprep.load_extract()
        extract._tbreader()
        extract.log_time("2026-01-01T00:00:00.000000Z")  # time.strptime's locale and patterns, made once here
    except Exception:
        pass


def launcher(run: Callable[[str], int]) -> int:
    """Read one attempt directory per line on stdin and answer with the pid of the shim forked for it, which runs
    ``run(attempt_dir)``. Returns when stdin closes."""
    import gc
    import select

    warm_up()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gc.collect()
    gc.freeze()  # what the launcher holds now is never walked by a shim's collections (nor copied for them)
    buf = b""
    while True:
        ready, _, _ = select.select([0], [], [], 1.0)
        for _ in proctree.reaped():  # reap shims that ended
            pass
        if not ready:
            continue
        data = os.read(0, 65536)
        if not data:
            return 0
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                answer = str(spawn_shim(line.decode(), run))
            except OSError as exc:
                answer = f"error {exc}"
            os.write(1, (answer + "\n").encode())

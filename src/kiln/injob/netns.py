"""A job's own network: a network namespace per attempt, shared by its members, joined by every sandboxed step.

Standard library only, like the shim that loads it (``kiln.injob.netns`` in the package, or a plain module from
this file's directory when the shim runs as a script). The executor decides what the network holds
(``backends/local/network.py``) and passes it in ``shim.json`` as ``"network"``::

    {"mode": "isolated" | "none",
     "dir": "<run dir>/net/<job>-<attempt>",       root only: lock, ns (the namespace, bind-mounted), users/,
                                                  pasta.pid, pasta.log (isolated)
     "pasta": "/usr/bin/pasta" | null,            isolated only
     "forward": [8080, ...],                      isolated: the job's loopback ports pasta forwards to the
                                                  machine's loopback: the Kiln API, and what the operator allows
                                                  (KILN_JOB_EGRESS)
     "nft": "/usr/sbin/nft" | null, "rules": "<an nft script>" | "",
     "api": {"port", "target", "connections"}     none: the Kiln API's port, served by the shim (apiport.py)
     "background": true                           made ahead (netpool.py): pasta and nft start at idle priority,
     "recycle": "<run dir>/net/used-..."         where the last member hands it back to (netpool.py)}

- ``isolated``: the namespace has its loopback and one interface connected to the outside world by ``pasta``
  (passt's user-mode stack: the job's connections leave as the machine's own sockets), with the machine's
  addresses copied in (so they name the job itself, never the machine), the gateway not mapped to the machine's
  loopback, no inbound port, and only ``forward`` of the machine's loopback reachable. The nft script (the
  operator's egress rules, the machine's other addresses and link-local metadata denied) is loaded into the
  namespace's own netfilter, which the job cannot change: it has no capabilities.
- ``none``: loopback only, and no process of its own: each member's shim listens on the job's 127.0.0.1:PORT
  from inside the namespace and forwards what connects there to the Kiln API (``apiport.py``, which says why).

The first member to start creates the namespace (``unshare`` in a thread of its own, bind-mounted on ``ns`` so it
outlives that thread), starts pasta and loads the rules; the others join it (one namespace per gang on one
machine: its workers rendezvous over their loopback); the last to leave removes it, and pasta, watching the file,
exits with it. A shim that died leaves it to the executor's cleanup (:func:`cleanup`). Where the server's pool
asks for it (``"recycle"``: a directory of its own, named for the attempt's organisation), the last to leave hands
the namespace back instead, when it holds no socket but pasta's own (:func:`holds_nothing`): the pool gives it to
the next attempt of that organisation, pasta and rules as they were (``backends/local/netpool.py`` says why).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator

if __package__:
    from kiln.injob import apiport
else:  # loaded by the shim run as a script: its directory is on sys.path
    import apiport  # type: ignore[no-redef]

CLONE_NEWNET = 0x40000000
MS_BIND = 4096
MNT_DETACH = 2
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
READY_SECONDS = 20.0  # the longest pasta may take to connect the namespace (~50 ms idle; seconds on a loaded machine)
CONNECT_TRIES = 2  # a pasta that did not answer is stopped and started once more
SCHED_IDLE = getattr(os, "SCHED_IDLE", 5)
MADE_FOR = "made-for.json"  # in a namespace handed back: what it was made with (made_for)
POOL_FILE = "pool.json"  # in <run dir>/net while a server's pool takes namespaces back: {"pid", "ticks"}

_LIBC: list = []


class NetworkError(Exception):
    """The job's network could not be made (the reason names the step and what the tool said)."""


def _libc():  # type: ignore[no-untyped-def]
    if not _LIBC:
        import ctypes

        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    return _LIBC[0]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        import ctypes

        err = ctypes.get_errno()
        raise NetworkError(f"{what}: {os.strerror(err)}")


def setns(fd: int) -> None:
    """Move the calling thread (only it) into the network namespace ``fd`` refers to."""
    _check(_libc().setns(fd, CLONE_NEWNET), "setns")


def _loopback_up() -> None:
    """Bring ``lo`` up in the calling thread's namespace (an ioctl: no ``ip`` process)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        req = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | IFF_UP))


class JobNetwork:
    """One attempt's network namespace, as one member's shim uses it."""

    def __init__(self, cfg: dict, abort: threading.Event | None = None) -> None:
        """``abort``: set, a namespace being made is given up (NetworkError) rather than waited for."""
        self.cfg = cfg
        self.mode = cfg.get("mode", "isolated")
        self.dir = cfg["dir"]
        self.ns_path = os.path.join(self.dir, "ns")
        self.fd = -1  # the job's namespace, while held
        self.host_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        self._enter_lock = threading.Lock()
        self.pasta: subprocess.Popen | None = None
        self.api: apiport.ApiPort | None = None  # this member's listener on the job's API port (none)
        self.abort = abort

    def close(self) -> None:
        """Let go of the descriptors (the namespace stays: its file and its users decide)."""
        self._stop_api()
        for fd in (self.fd, self.host_fd):
            if fd >= 0:
                os.close(fd)
        self.fd = self.host_fd = -1

    # -- holding it ---------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(self.dir, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def acquire(self, holder: str) -> None:
        """Join the attempt's namespace, making it first if no member has, and serve the Kiln API's port in it
        when the config says so (raises NetworkError)."""
        with self._locked():
            users = os.path.join(self.dir, "users")
            os.makedirs(users, mode=0o700, exist_ok=True)
            if not os.path.ismount(self.ns_path):
                self._create()
            self.fd = os.open(self.ns_path, os.O_RDONLY | os.O_CLOEXEC)
            with open(os.path.join(users, holder), "w"):
                pass
        api = self.cfg.get("api")
        if api:
            self._serve_api(api)

    def _serve_api(self, api: dict) -> None:
        """This member's listener on the job's 127.0.0.1:PORT, made in the namespace, and its forwarder to the
        API (apiport.py): before the member's first step, so the job's first call finds it."""
        port = int(api["port"])
        try:
            with self.entered():  # only the socket is made in there: it stays the namespace's
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                _migrate_queued_connections()  # by each member: a namespace made ahead did not know it would serve
        except OSError as exc:
            raise NetworkError(f"cannot open the Kiln API's port in the job's network: {exc.strerror}") from exc
        try:
            apiport.listen(listener, port)
        except OSError as exc:
            listener.close()
            raise NetworkError(f"cannot listen on the job's 127.0.0.1:{port}: {exc.strerror}") from exc
        host, target_port = api.get("target") or ("127.0.0.1", port)
        self.api = apiport.ApiPort(listener, (host, int(target_port)), int(api.get("connections") or 0) or None)

    def _stop_api(self) -> None:
        api, self.api = self.api, None
        if api is not None:
            api.close()

    def release(self, holder: str) -> None:
        """Leave it; the last member removes it (and pasta exits with it)."""
        self._stop_api()  # first: connections still queued on it go to a member still there (apiport.py)
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        with self._locked():
            users = os.path.join(self.dir, "users")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(users, holder))
            try:
                left = os.listdir(users)
            except FileNotFoundError:
                left = []
            if not left and not self._recycle():
                cleanup(self.dir)

    def _recycle(self) -> bool:
        """The last member left: hand the namespace back for the next attempt of the same organisation
        (``cfg["recycle"]``, a directory of the server's pool) when it is proven empty (:func:`holds_nothing`);
        False: it is removed instead. The job's processes are gone by now (its PID namespace died with its
        sandbox), and so are this member's listener and descriptors."""
        target = self.cfg.get("recycle")
        if not target or not os.path.ismount(self.ns_path) or not pool_running(os.path.dirname(target)):
            return False
        try:
            pasta = _pasta_pid(self.dir) if self.mode == "isolated" else 0
            if self.mode == "isolated" and not pasta:
                return False
            fd = os.open(self.ns_path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                with self._enter_lock:
                    empty = holds_nothing(fd, self.host_fd, pasta)
                if not empty:
                    return False
            finally:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.truncate(os.path.join(self.dir, "pasta.log"), 0)
            with open(os.path.join(self.dir, MADE_FOR), "w") as fh:
                fh.write(json.dumps(made_for(self.cfg), sort_keys=True))
            os.rename(self.dir, target)
        except (OSError, NetworkError, ValueError):
            return False
        return True

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """The calling thread in the job's namespace for the block (a process started there is the job's)."""
        with self._enter_lock:
            setns(self.fd)
            try:
                yield
            finally:
                setns(self.host_fd)

    # -- making it ----------------------------------------------------------------------------------------------

    def _create(self) -> None:
        open(self.ns_path, "w").close()
        made: list = []
        thread = threading.Thread(target=self._unshare, args=(made,), name="kiln-netns", daemon=True)
        thread.start()
        thread.join()
        failed = [m for m in made if isinstance(m, BaseException)]
        if failed:
            remove(self.dir)
            raise NetworkError(f"cannot make the job's network namespace: {failed[0]}")
        try:
            if self.mode == "isolated":
                self._connect_retrying()  # pasta, while nft loads the rules
            for nft in made:
                try:
                    _, err = nft.communicate((self.cfg.get("rules") or "").encode(), timeout=20)
                except subprocess.TimeoutExpired:
                    nft.kill()
                    raise NetworkError("cannot load the egress rules: nft did not finish") from None
                if nft.returncode != 0:
                    raise NetworkError(f"cannot load the egress rules: {err.decode(errors='replace').strip()}")
        except BaseException:
            remove(self.dir)
            raise

    def _unshare(self, made: list) -> None:
        """In a thread of its own (unshare moves only the calling thread): a new namespace, kept by a bind mount;
        the egress rules are loaded by an nft started from here, in it."""
        try:
            _check(_libc().unshare(CLONE_NEWNET), "unshare")
            _loopback_up()
            source = f"/proc/self/task/{threading.get_native_id()}/ns/net".encode()
            _check(_libc().mount(source, self.ns_path.encode(), None, MS_BIND, None), "mount")
            script = self.cfg.get("rules") or ""
            if self.mode == "isolated" and script:
                nft = self.cfg.get("nft")
                if not nft:
                    raise NetworkError("the egress rules need nft (apt-get install nftables)")
                proc = subprocess.Popen(
                    [nft, "-f", "-"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    close_fds=True,
                )
                self._background(proc.pid)
                made.append(proc)  # given the script by _create
        except BaseException as exc:
            made.append(exc)
        finally:
            with contextlib.suppress(Exception):
                setns(self.host_fd)

    def _connect_retrying(self) -> None:
        for tries in range(1, CONNECT_TRIES + 1):
            try:
                self._connect()
                return
            except NetworkError:
                if tries == CONNECT_TRIES:
                    raise
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.dir, "pasta.pid"))

    def _connect(self) -> None:
        """pasta started on the namespace: the job's way out, and the forwarded loopback ports."""
        forward = ",".join(str(int(p)) for p in self.cfg.get("forward") or []) or "none"
        pid_file = os.path.join(self.dir, "pasta.pid")
        argv = [
            self.cfg["pasta"],
            "--foreground",
            "--quiet",
            "--runas",
            "0:0",  # to join a namespace of the machine's user namespace; it drops its capabilities then
            "--tcp-ports",
            "none",
            "--udp-ports",
            "none",
            "--tcp-ns",
            forward,
            "--udp-ns",
            "none",
            "--pid",
            pid_file,
            "--log-file",
            os.path.join(self.dir, "pasta.log"),
            "--netns",
            self.ns_path,
        ]
        if self.mode == "isolated":
            argv[1:1] = ["--config-net", "--no-map-gw"]
        else:  # the interface stays unconfigured: no address, no route, only the forwarded ports
            argv[1:1] = ["--no-udp", "--no-icmp", "--no-dhcp", "--no-ndp", "--no-dhcpv6", "--no-ra"]
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,  # not the job's, not killed with its process group
                close_fds=True,
            )
        except OSError as exc:
            raise NetworkError(f"cannot start pasta ({self.cfg['pasta']}): {exc.strerror}") from exc
        idle = self._background(proc.pid)
        pause = 0.001  # between looks; a spare made ahead backs off to 20 ms (a slow start polled each ms is waste)
        deadline = time.monotonic() + READY_SECONDS
        while True:  # pasta writes its pid once the namespace is connected
            try:
                with open(pid_file) as fh:
                    if fh.read().strip():
                        break
            except FileNotFoundError:
                pass
            if self.abort is not None and self.abort.is_set():
                with contextlib.suppress(OSError):
                    proc.kill()
                with contextlib.suppress(OSError):
                    proc.wait(5)
                raise NetworkError("given up: the server is stopping")
            if idle and time.monotonic() > deadline - READY_SECONDS / 2:
                idle = _foreground(proc.pid)  # slow at idle priority: a busy machine, on with it at the usual one
            if proc.poll() is not None or time.monotonic() > deadline:
                said = proc.stderr.read().decode(errors="replace") if proc.stderr and proc.poll() is not None else ""
                said = " ".join(line for line in said.splitlines() if "syslog" not in line).strip()
                with contextlib.suppress(OSError):
                    proc.kill()
                with contextlib.suppress(OSError):
                    proc.wait(5)
                if not said:
                    said = _tail(os.path.join(self.dir, "pasta.log"))
                    waited = f"no answer in {READY_SECONDS:.0f} s" if proc.returncode == -signal.SIGKILL else ""
                    said = "; ".join(part for part in (waited, said) if part) or f"exited {proc.returncode}"
                raise NetworkError(f"pasta did not connect the job's network: {said}")
            time.sleep(pause)
            if self.cfg.get("background"):
                pause = min(pause * 1.5, 0.02)
        if proc.stderr:
            proc.stderr.close()
        if idle:
            _foreground(proc.pid)  # it serves the job's connections from now on, at the usual priority
        self.pasta = proc  # it is the namespace's now: it exits when the namespace's file is removed

    def _background(self, pid: int) -> bool:
        """A namespace made ahead of need (``"background"``): its pasta's start (15-18 ms of CPU, the kernel
        zeroing its buffers) and nft run at idle priority, so they take only CPU that nothing else wants. Set
        right after the start (a few instructions at the usual priority at most); pasta is put back once it is
        ready. True if set."""
        if not self.cfg.get("background"):
            return False
        try:
            os.sched_setscheduler(pid, SCHED_IDLE, os.sched_param(0))
        except OSError:
            return False
        return True


def _foreground(pid: int) -> bool:
    with contextlib.suppress(OSError):
        os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
    return False


def _migrate_queued_connections() -> None:
    """In the calling thread's namespace: connections queued on a listener that closes go to another listener of
    its SO_REUSEPORT group (a gang member's shim that ends hands the job's pending API connections to the others;
    Linux 5.14 and later, else nothing to do)."""
    with contextlib.suppress(OSError), open("/proc/sys/net/ipv4/tcp_migrate_req", "w") as fh:
        fh.write("1")


def _tail(path: str, size: int = 300) -> str:
    """The last lines of pasta's own log, for an error that says why it failed."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - size))
            return " ".join(fh.read().decode(errors="replace").split())
    except OSError:
        return ""


def remove(top: str) -> None:
    """The namespace's file unmounted and removed (pasta exits when it sees that; it is stopped here as well)."""
    ns_path = os.path.join(top, "ns")
    if os.path.ismount(ns_path):
        _libc().umount2(ns_path.encode(), MNT_DETACH)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(ns_path)
    pid = _pasta_pid(top)
    if pid:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(top, "pasta.pid"))


def process_ticks(pid: int) -> str:
    """When process ``pid`` started, in clock ticks since boot (its stat file's field 22): with the pid, names one
    process whatever pids are reused. OSError when there is no such process."""
    with open(f"/proc/{pid}/stat") as fh:
        stat = fh.read()
    return stat[stat.rindex(")") + 2 :].split()[19]


def pool_running(top: str) -> bool:
    """Whether the server whose pool takes namespaces back in ``top`` still runs (``POOL_FILE``: its pid and start,
    written as its pool starts, removed as it stops). A namespace handed back to a server that stopped, or was
    killed, would wait for a pool that never comes (its pasta running on): it is removed instead."""
    try:
        with open(os.path.join(top, POOL_FILE)) as fh:
            pool = json.load(fh)
        return process_ticks(int(pool["pid"])) == str(pool["ticks"])
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return False


def made_for(cfg: dict) -> dict:
    """What a namespace was made with (and so what it may serve): its mode, tools, forwarded ports and rules."""
    return {k: cfg.get(k) for k in ("mode", "pasta", "nft", "forward", "rules")}


def pasta_running(top: str) -> bool:
    """Whether the pasta of the namespace in ``top`` still runs."""
    return bool(_pasta_pid(top))


def _pasta_pid(top: str) -> int:
    """The namespace's pasta, when it still runs (0: none)."""
    try:
        with open(os.path.join(top, "pasta.pid")) as fh:
            pid = int(fh.read().strip() or 0)
    except (OSError, ValueError):
        return 0
    return pid if pid > 0 and _is_pasta(pid) else 0


def _socket_inodes(pid: int) -> set[str]:
    found = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    found.add(link[8:-1])
    return found


def holds_nothing(ns_fd: int, host_fd: int, pasta: int) -> bool:
    """Whether the namespace ``ns_fd`` holds no socket of any kind but those of its own pasta (``pasta``: its pid;
    0, none): nothing listening, connected, closing or waiting (a TIME_WAIT left by a job's connection counts),
    read from the namespace's own tables (TCP, UDP, raw, Unix, each for both IP versions). Nothing but a socket
    can outlive a job in a namespace: its processes are gone, its files were never there, and its nft rules are
    not its own (it has no capabilities to change them)."""
    ours = _socket_inodes(pasta) if pasta else set()
    tables = {"tcp": 9, "tcp6": 9, "udp": 9, "udp6": 9, "raw": 9, "raw6": 9, "unix": 6}
    rows: list[tuple[str, list[str]]] = []
    setns(ns_fd)
    try:
        for table, _ in tables.items():
            try:
                with open(f"/proc/thread-self/net/{table}") as fh:
                    rows.extend((table, line.split()) for line in fh.read().splitlines()[1:])
            except FileNotFoundError:
                continue
    finally:
        setns(host_fd)
    return all(len(fields) > tables[table] and fields[tables[table]] in ours for table, fields in rows)


def _is_pasta(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip().startswith(("pasta", "passt"))
    except OSError:
        return False


def cleanup(top: str) -> None:
    """What a dead shim left of its attempt's network (the executor's cleanup)."""
    if os.path.isdir(top):
        remove(top)
        import shutil

        shutil.rmtree(top, ignore_errors=True)

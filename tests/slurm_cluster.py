"""A real two-node Slurm cluster on this one machine, for tests and benchmarks (a helper, not a fake: Debian's own
``slurmctld``, ``slurmd`` and client tools, talked to exactly as on a real cluster).

Layout (as root; every name starts with ``kslurm``, which nothing else here uses: Kiln's own job networks are
unnamed namespaces bind-mounted under a run directory, ``kiln.injob.netns``, with no link in the root namespace)::

    root namespace ── bridge kslurm0 10.77.0.1/24  (a Kiln server for the cluster listens here)
      ├─ veth kslurmv0 ── netns kslurm-ctld   eth0 10.77.0.2   munged, slurmctld (the machine's hostname)
      ├─ veth kslurmv1 ── netns kslurm-node1  eth0 10.77.0.11  slurmd -N node1 (UTS hostname node1)
      └─ veth kslurmv2 ── netns kslurm-node2  eth0 10.77.0.12  slurmd -N node2 (UTS hostname node2)

Why each piece:

- **Isolation.** slurmctld and slurmd listen on every address of their namespace whatever slurm.conf says, so each
  runs in a namespace whose only interfaces are its loopback and its end of the bridge. Nothing of Slurm listens in
  the root namespace; the bridge is reachable only from this machine (no route to it elsewhere, IP forwarding is off
  here, and the namespaces have no default route, so jobs reach only the bridge's subnet). The clients (sbatch,
  srun, ...) run in the root namespace, as Kiln's backend runs them, and reach the controller over the bridge.
- **Own MUNGE.** munged runs with its own key (in the cluster's directory) and socket (``AuthInfo=socket=``, under
  /run: munged wants its socket's every parent directory searchable by all), so the cluster needs neither the
  machine's munge key nor a munged started by anyone else.
- **Two nodes.** Each slurmd has a network and a UTS namespace of its own (``nsenter --net`` + ``unshare --uts``;
  not ``ip netns exec``, which remounts /sys and breaks slurmd), so a job spanning two nodes sees two hostnames
  and two addresses. The filesystem is shared: a job's output lands where the test reads it.
- **Names.** Each slurmd also has a mount namespace of its own (``unshare --mount --propagation slave``: every
  mount of the machine still reaches it) in which a hosts file of the cluster's is bind-mounted on /etc/hosts, so
  the nodes resolve each other's names (node1, node2) and the controller's, as a cluster's DNS makes them: a gang's
  members find each other by name (PyTorch's gloo binds to the address its hostname resolves to). The machine's
  own /etc/hosts is left alone.
- **Resources.** Each node has ``CPUs=2`` (what this 2-CPU machine has, so each slurmd's own view matches; two nodes
  together oversubscribe it twice, which is harmless for tests' tiny jobs), ``RealMemory`` 4000 MB with
  ``DefMemPerCPU`` = half of it (a job without ``--mem`` would otherwise be given the whole node's memory, and jobs
  would queue on memory instead of on what they ask for), and ``Gres=gpu:2``: fake GPUs, character devices made
  with mknod like /dev/null (1, 3), one set per node, ``AutoDetect=off``. Slurm then hands a job's GPUs out
  exclusively and sets ``CUDA_VISIBLE_DEVICES``. ``SlurmdParameters=config_overrides`` makes the configured
  values what each slurmd reports, on any machine.
- **Fast.** ``batch_sched_delay=0,sched_min_interval=0`` (a job starts within about a second of ``sbatch``),
  ``KillWait=2`` (scancel's SIGTERM → SIGKILL; the default is 30 s), ``SlurmdTimeout=15`` (a node that stops
  answering is down within about that; shorter would let a busy 2-CPU machine's slow ping kill a node's jobs), and
  ``MessageTimeout`` at its default 10 s for the same reason.
- **One per machine.** The names, the subnet and Slurm's ports are fixed, so a cluster holds a machine-wide lock
  (``/run/kiln-test-slurm.lock``) from ``start()`` to ``stop()``; another process waits for it. Holding the lock
  proves that no live cluster owns the names, so ``start()`` first removes what a crashed run left behind.
- **Nothing left behind.** The daemons are this process's children (``nsenter`` and ``unshare`` exec them, so
  each child *is* the daemon) and are stopped through their handles; then everything still inside the namespaces
  (job steps, or a crashed run's daemons) is killed by namespace membership, which is exact where pid files of an
  earlier run could name reused pids; then the namespaces, veths and bridge go. A failed ``start()`` does the same.

``python -m tests.slurm_cluster up [DIR]`` runs one in the foreground for a developer (``make slurm-up``);
``python -m tests.slurm_cluster down`` removes what one left behind (``make slurm-down``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

T = TypeVar("T")

PREFIX = "kslurm"
BRIDGE = "kslurm0"
BRIDGE_ADDRESS = "10.77.0.1"
SUBNET_BITS = 24
PARTITION = "main"
LOCK_PATH = Path("/run/kiln-test-slurm.lock")
# munged wants every directory above its socket searchable by all, which a test's temporary directory is not; the
# machine-wide lock makes one fixed place safe.
MUNGE_SOCKET_DIR = Path("/run/kiln-test-slurm-munge")
TOOLS = ("slurmctld", "slurmd", "munged", "sbatch", "srun", "sinfo", "squeue", "scontrol", "scancel")
SYSTEM_TOOLS = ("ip", "nsenter", "unshare")


@dataclass(frozen=True)
class SlurmHost:
    """One namespace on the bridge: the controller's or a node's."""

    name: str  # a node's NodeName and hostname; "ctld" for the controller
    address: str
    netns: str
    veth: str  # the end on the bridge, in the root namespace
    peer: str  # the other end, moved into the namespace and renamed eth0 there

    @property
    def netns_path(self) -> str:
        return f"/run/netns/{self.netns}"


def _host(name: str, index: int, address: str) -> SlurmHost:
    return SlurmHost(name, address, f"{PREFIX}-{name}", f"{PREFIX}v{index}", f"{PREFIX}p{index}")


CONTROLLER = _host("ctld", 0, "10.77.0.2")
NODES = (_host("node1", 1, "10.77.0.11"), _host("node2", 2, "10.77.0.12"))
HOSTS = (CONTROLLER, *NODES)


class SlurmClusterError(RuntimeError):
    """The cluster could not be started or a Slurm command failed (the message carries what the tools said)."""


def slurm_problem() -> str | None:
    """None when a cluster can be started here, else what is missing (for tests/components.py)."""
    if os.geteuid() != 0:
        return "the Slurm test cluster makes network namespaces and a bridge: run the tests as root"
    missing = [tool for tool in (*TOOLS, *SYSTEM_TOOLS) if _which(tool) is None]
    return f"{', '.join(missing)} not found" if missing else None


def _which(tool: str) -> str | None:
    # The daemons live in /usr/sbin, which a non-login PATH may lack.
    return shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin:/usr/bin:/bin")


def _tool(tool: str) -> str:
    path = _which(tool)
    if path is None:
        raise SlurmClusterError(f"{tool} not found (make slurm-tools installs Slurm and MUNGE)")
    return path


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([_tool("ip"), *args], capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise SlurmClusterError(f"ip {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def _wait_for(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 0.1) -> T:
    """``probe()``'s first value that is not None, polled until ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() >= deadline:
            raise SlurmClusterError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def _pids_in(host: SlurmHost) -> list[int]:
    if not Path(host.netns_path).exists():
        return []
    done = _ip("netns", "pids", host.netns, check=False)
    return [int(pid) for pid in done.stdout.split() if pid.isdigit()]


def _kill_all_in(hosts: Iterable[SlurmHost], timeout: float = 10.0) -> None:
    """Every process in the namespaces killed (SIGKILL: what is left here is a leftover) and gone."""
    hosts = list(hosts)
    for host in hosts:
        for pid in _pids_in(host):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    _wait_for(
        "the processes in the cluster's namespaces to exit",
        lambda: True if not any(_pids_in(host) for host in hosts) else None,
        timeout,
    )


def remove_leftovers() -> None:
    """Kill whatever runs in the cluster's namespaces and remove the namespaces, veths and bridge (idempotent).

    Only safe while holding the machine-wide lock, or when no cluster is running: it does not ask whose they are."""
    _kill_all_in(HOSTS)
    for host in HOSTS:
        if Path(host.netns_path).exists():
            _ip("netns", "del", host.netns, check=False)
    links = _ip("-o", "link", "show", check=False).stdout
    for host in HOSTS:
        # Deleting a namespace deletes its veth end and so the pair; this catches a pair that never got there.
        if re.search(rf"^\d+: {host.veth}[@:]", links, re.MULTILINE):
            _ip("link", "del", host.veth, check=False)
    if re.search(rf"^\d+: {BRIDGE}[@:]", links, re.MULTILINE):
        _ip("link", "del", BRIDGE, check=False)
    shutil.rmtree(MUNGE_SOCKET_DIR, ignore_errors=True)


class _MachineLock:
    """The machine-wide lock on the cluster's names (flock: a crashed holder releases it by exiting)."""

    def __init__(self) -> None:
        self._file: IO[str] | None = None

    def acquire(self, timeout: float) -> None:
        file = LOCK_PATH.open("a+")
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    file.seek(0)
                    holder = file.read().strip() or "unknown"
                    file.close()
                    raise SlurmClusterError(
                        f"another Slurm test cluster holds {LOCK_PATH} (pid {holder}) after {timeout:.0f} s"
                    ) from None
                time.sleep(0.2)
        file.seek(0)
        file.truncate()
        file.write(str(os.getpid()))
        file.flush()
        self._file = file

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing releases the flock
            self._file = None


class SlurmCluster:
    """slurmctld and two slurmd in network namespaces on a bridge, with their files under ``root``.

    ``start()`` returns once ``sinfo`` shows every node idle; ``stop()`` leaves nothing running and no namespace or
    link behind (also after a failed start). Clients run with :attr:`env` (``SLURM_CONF``), for example through
    :meth:`run`, :meth:`sbatch` and :meth:`job`."""

    bridge_address = BRIDGE_ADDRESS
    controller = CONTROLLER
    hosts = NODES

    def __init__(
        self,
        root: Path,
        *,
        cpus_per_node: int = 2,
        memory_mb_per_node: int = 4000,
        gpus_per_node: int = 2,
        slurmd_timeout: int = 15,
        lock_timeout: float = 120.0,
        start_timeout: float = 60.0,
    ) -> None:
        self.root = Path(root).resolve()
        self.cpus_per_node = cpus_per_node
        self.memory_mb_per_node = memory_mb_per_node
        self.gpus_per_node = gpus_per_node
        self.slurmd_timeout = slurmd_timeout
        self.lock_timeout = lock_timeout
        self.start_timeout = start_timeout
        self.conf_path = self.root / "etc" / "slurm.conf"
        self.log_dir = self.root / "log"
        self.munge_socket = MUNGE_SOCKET_DIR / "munge.socket"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf_path)}
        self.running = False
        self._lock = _MachineLock()
        self._daemons: list[tuple[str, subprocess.Popen[bytes]]] = []

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes' names (Slurm's NodeName, and each node's hostname)."""
        return tuple(host.name for host in NODES)

    def gpu_devices(self, node: str) -> list[Path]:
        """The fake GPU device files of ``node``, in the order Slurm numbers them."""
        return [self.root / "dev" / node / f"nvidia{i}" for i in range(self.gpus_per_node)]

    # -- start and stop --

    def start(self) -> SlurmCluster:
        """Start munged, slurmctld and the slurmds; return when every node is idle (raises SlurmClusterError)."""
        if self.running:
            return self
        problem = slurm_problem()
        if problem:
            raise SlurmClusterError(problem)
        self._lock.acquire(self.lock_timeout)
        self.running = True
        try:
            remove_leftovers()
            self._write_files()
            self._make_network()
            self._start_daemons()
        except BaseException as exc:
            logs = self.log_tails()
            self.stop()
            if isinstance(exc, Exception):
                raise SlurmClusterError(f"the Slurm test cluster did not start: {exc}\n{logs}") from exc
            raise
        return self

    def stop(self) -> None:
        """Stop every daemon and job and remove the namespaces, veths and bridge (idempotent)."""
        if not self.running:
            return
        try:
            # slurmd first: the controller would otherwise mark them down and log about it meanwhile.
            for _name, proc in reversed(self._daemons):
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait(10)
            self._daemons.clear()
            remove_leftovers()  # job steps (slurmstepd outlives slurmd by design) and anything else in there
        finally:
            self.running = False
            self._lock.release()

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _write_files(self) -> None:
        for sub in ("etc", "state", "run", "log", "munge", "spool"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o700)  # the key's: munged refuses one that others may write to
        MUNGE_SOCKET_DIR.mkdir(mode=0o755, exist_ok=True)
        key = self.root / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        for host in NODES:
            (self.root / "spool" / host.name).mkdir(exist_ok=True)  # SlurmdSpoolDir: slurmd does not make it
            for device in self.gpu_devices(host.name):
                device.parent.mkdir(parents=True, exist_ok=True)
                if not device.exists():
                    os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        self.conf_path.write_text(self._slurm_conf())
        (self.conf_path.parent / "gres.conf").write_text(self._gres_conf())
        (self.root / "etc" / "hosts").write_text(self._hosts())

    def _hosts(self) -> str:
        """The nodes' /etc/hosts: loopback, the machine (the controller's hostname) and every node."""
        controller = socket.gethostname().split(".")[0]
        lines = ["127.0.0.1 localhost", f"{CONTROLLER.address} {controller}"]
        lines += [f"{host.address} {host.name}" for host in NODES]
        return "\n".join(lines) + "\n"

    def _slurm_conf(self) -> str:
        r = self.root
        hostname = socket.gethostname().split(".")[0]  # slurmctld exits silently unless it is its own hostname
        nodes = "\n".join(
            f"NodeName={h.name} NodeAddr={h.address} NodeHostname={h.name} CPUs={self.cpus_per_node} "
            f"RealMemory={self.memory_mb_per_node} Gres=gpu:{self.gpus_per_node} State=UNKNOWN"
            for h in NODES
        )
        return f"""# Written by tests/slurm_cluster.py: a throwaway two-node cluster on one machine.
ClusterName=kilntest
SlurmctldHost={hostname}({CONTROLLER.address})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
MpiDefault=none
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU={self.memory_mb_per_node // self.cpus_per_node}
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
KillWait=2
InactiveLimit=0
MinJobAge=300
SlurmdTimeout={self.slurmd_timeout}
MessageTimeout=10
StateSaveLocation={r}/state
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdSpoolDir={r}/spool/%n
SlurmdPidFile={r}/run/slurmd-%n.pid
SlurmdLogFile={r}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
GresTypes=gpu
{nodes}
PartitionName={PARTITION} Nodes={",".join(self.nodes)} Default=YES MaxTime=INFINITE State=UP
"""

    def _gres_conf(self) -> str:
        lines = ["AutoDetect=off"]
        for host in NODES:
            files = self.root / "dev" / host.name / f"nvidia[0-{self.gpus_per_node - 1}]"
            lines.append(f"NodeName={host.name} Name=gpu File={files}")
        return "\n".join(lines) + "\n"

    def _make_network(self) -> None:
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{BRIDGE_ADDRESS}/{SUBNET_BITS}", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        for host in HOSTS:
            _ip("netns", "add", host.netns)
            # Made in the root namespace, then moved: `peer name eth0 netns …` failed on this kind of machine.
            _ip("link", "add", host.veth, "type", "veth", "peer", "name", host.peer)
            _ip("link", "set", host.peer, "netns", host.netns)
            _ip("link", "set", host.veth, "master", BRIDGE)
            _ip("link", "set", host.veth, "up")
            _ip("-n", host.netns, "link", "set", host.peer, "name", "eth0")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/{SUBNET_BITS}", "dev", "eth0")
            _ip("-n", host.netns, "link", "set", "eth0", "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")

    def _spawn(self, name: str, host: SlurmHost, command: list[str]) -> None:
        log = (self.log_dir / f"{name}.out").open("ab")
        with log:
            proc = subprocess.Popen(
                [_tool("nsenter"), f"--net={host.netns_path}", *command],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a ^C to the tests reaches them through stop(), not all at once
            )
        self._daemons.append((name, proc))

    def _check_alive(self) -> None:
        for name, proc in self._daemons:
            if proc.poll() is not None:
                raise SlurmClusterError(f"{name} exited ({proc.returncode})")

    def _start_daemons(self) -> None:
        m = self.root / "munge"
        self._spawn(
            "munged",
            CONTROLLER,
            [
                _tool("munged"),
                "--foreground",
                f"--socket={self.munge_socket}",
                f"--key-file={m / 'munge.key'}",
                f"--pid-file={m / 'munged.pid'}",
                f"--seed-file={m / 'munged.seed'}",
            ],
        )
        _wait_for("munged's socket", self._munge_ready, 20)
        self._spawn("slurmctld", CONTROLLER, [_tool("slurmctld"), "-D", "-f", str(self.conf_path)])
        hosts = self.root / "etc" / "hosts"
        for host in NODES:
            script = f'hostname {host.name} && mount --bind "$2" /etc/hosts && exec "$0" -D -f "$1" -N {host.name}'
            self._spawn(
                f"slurmd-{host.name}",
                host,
                [
                    _tool("unshare"), "--uts", "--mount", "--propagation", "slave", "--",
                    "sh", "-c", script, _tool("slurmd"), str(self.conf_path), str(hosts),
                ],
            )  # fmt: skip
        _wait_for("every node to be idle in sinfo", self._all_idle, self.start_timeout, interval=0.25)

    def _munge_ready(self) -> bool | None:
        self._check_alive()
        return True if self.munge_socket.exists() else None

    def _all_idle(self) -> bool | None:
        self._check_alive()
        states = self.node_states(check=False)
        return True if states and all(states.get(node) == "idle" for node in self.nodes) else None

    # -- talking to it --

    def run(
        self, *args: str, check: bool = True, timeout: float = 60, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """A Slurm client command (``run("squeue", "-h")``) with the cluster's environment, from the root namespace
        as Kiln's backend runs them. ``check`` raises SlurmClusterError with its output on a non-zero exit."""
        done = subprocess.run(
            [_tool(args[0]), *args[1:]],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            check=False,
        )
        if check and done.returncode != 0:
            raise SlurmClusterError(
                f"{' '.join(args)} failed ({done.returncode}): {done.stdout.strip()} {done.stderr.strip()}"
            )
        return done

    def sbatch(self, script: str, *options: str) -> str:
        """Submit a batch script (its text, ``#!`` line included) with sbatch's ``options``; the job's id."""
        done = self.run("sbatch", "--parsable", *options, input=script)
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, Reason, NodeList, ExitCode, ...); empty once Slurm forgot it."""
        done = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        if done.returncode != 0:
            return {}
        # Values with spaces (Command=, WorkDir=) come out cut at the first space; the fields read here have none.
        return dict(field.split("=", 1) for field in done.stdout.split() if "=" in field)

    def wait_for_job(self, job_id: str, *states: str, timeout: float = 60) -> dict[str, str]:
        """The job's fields once its JobState is one of ``states`` (e.g. "RUNNING", "COMPLETED")."""

        def probe() -> dict[str, str] | None:
            fields = self.job(job_id)
            return fields if fields.get("JobState") in states else None

        try:
            return _wait_for(f"job {job_id} to be {'/'.join(states)}", probe, timeout, interval=0.2)
        except SlurmClusterError as exc:
            raise SlurmClusterError(f"{exc}; it is {self.job(job_id)}") from None

    def node_states(self, check: bool = True) -> dict[str, str]:
        """Each node's state as ``sinfo -N`` prints it ("idle", "mixed", "allocated", "down*", ...)."""
        done = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=check, timeout=15)
        if done.returncode != 0:
            return {}
        return dict(line.split(None, 1) for line in done.stdout.splitlines() if len(line.split()) == 2)

    def log_tails(self, chars: int = 2000) -> str:
        """The end of each daemon's log, for a failure's message."""
        parts = []
        # A daemon's output (*.out) repeats its log file (*.log), where it has one, and has what came before it.
        logs = {path.stem: path for path in self.log_dir.glob("*.out")}
        logs.update({path.stem: path for path in self.log_dir.glob("*.log")})
        for path in sorted(logs.values()):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace")[-chars:].strip()
                if text:
                    parts.append(f"--- {path.name}\n{text}")
        return "\n".join(parts)


@contextlib.contextmanager
def running_cluster(root: Path | None = None, **options: Any) -> Iterator[SlurmCluster]:
    """A started cluster for the block, in ``root`` or a temporary directory (benchmarks, ``make slurm-up``)."""
    with contextlib.ExitStack() as stack:
        if root is None:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kiln-slurm-")))
        cluster = SlurmCluster(root, **options)
        with cluster:
            yield cluster


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    if argv[:1] == ["down"]:
        lock = _MachineLock()
        try:
            lock.acquire(timeout=0)  # a running cluster (tests, or `up`) holds it: its names are not leftovers
        except SlurmClusterError as exc:
            print(f"{exc}: stop that one instead", file=sys.stderr)
            return 1
        try:
            remove_leftovers()
        finally:
            lock.release()
        return 0
    if argv[:1] != ["up"] or len(argv) > 2:
        print("usage: python -m tests.slurm_cluster up [DIR] | down", file=sys.stderr)
        return 2
    started = time.monotonic()
    with running_cluster(Path(argv[1]) if len(argv) > 1 else None) as cluster:
        print(f"Slurm cluster up in {time.monotonic() - started:.1f} s: nodes {', '.join(cluster.nodes)}")
        print(f"  export SLURM_CONF={cluster.conf_path}")
        print(f"  jobs reach this machine at {cluster.bridge_address}; Ctrl-C stops the cluster")
        for signum in (signal.SIGINT, signal.SIGTERM):  # SIGINT too: a shell's background job starts ignoring it
            signal.signal(signum, _interrupt)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

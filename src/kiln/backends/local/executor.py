"""The local executor: one shim process per attempt, supervised through files it leaves behind.

Layout under ``$KILN_HOME/jobs/<job>/``::

    work/          the extracted code; the commands' working directory
    outputs/       $KILN_OUTPUT_DIR, collected into the artifact store when an attempt ends
    checkpoints/   $KILN_CHECKPOINT_DIR, kept across restarts of the job
    site/          where pip installs from prepare_command land (the shared runtime stays clean)
    home/          $HOME of a sandboxed job
    metrics/       $KILN_METRICS_DIR, the metric spool files the server's ingester reads (``metric_spool``)
    attempts/<n>/  shim.json (what to run), launch.json (the launch), shim.lock + shim.pid (the shim holding the
                   attempt's claim: kiln.injob.claim), status.json, exit.json, shim.log
    attempts/<n>/members/<role>-<i>/   the same, per member of a distributed job (gang.json lists them)
    attempts/<n>/notice                $KILN_NOTICE_FILE: written before a preemption's SIGTERM
    attempts/<n>/[members/…/]scratch/  a sandboxed member's /dev/shm and /tmp (a tmpfs while it runs)

Jobs run in a bubblewrap sandbox (``sandbox.py`` decides what it holds; ``KILN_SANDBOX=none`` opts out).

What a shim's config holds besides the commands (environment, inputs) is built in ``shimconfig.py``; the
attempt directory's JSON files and a gang's layout are read and written through ``attemptdir.py``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import psutil

from kiln.backends.base import AttemptStatus, Backend, BackendDeps, Inventory, Launch
from kiln.backends.capabilities import (
    BackgroundWork,
    CheckpointSyncer,
    EventSyncer,
    ExtractsMetrics,
    JobFiles,
    MetricSpools,
    NotebookAddress,
    NotebookHost,
    OutputCollector,
    Preemptible,
    SpecValidator,
    Work,
    WorkDirs,
)
from kiln.backends.local import jobfiles, joblimits, netpool, shimconfig
from kiln.backends.local import network as job_network
from kiln.backends.local.attemptdir import (
    gang_layout,
    member_dirs,
    private_dir,
    read_json,
    write_json_atomic,
    write_private,
)
from kiln.backends.local.gang import MemberStatus, aggregate
from kiln.backends.local.inventory import local_inventory
from kiln.backends.local.python_policy import PythonPolicy
from kiln.backends.local.runtime_builder import SHIM_PATH, LocalRuntimeBuilder
from kiln.backends.local.runtime_builds import RuntimeBuilds
from kiln.backends.local.runtimes import ResolvedRuntime, RuntimeManager
from kiln.backends.local.sandbox import JOB_USER, attempt_box, detect, job_group, prepare_dirs
from kiln.backends.local.shimconfig import MountConfig, input_config, job_env, job_pylib, mount_config, write_secret
from kiln.backends.local.shims import ShimLauncher, still_its_session
from kiln.domain.distributed import Member, gang_members, hostfile_text, member_env
from kiln.domain.spec import JobSpec, command_argv
from kiln.errors import BackendError, InvalidInput, KilnError
from kiln.injob import claim
from kiln.injob import mount as mount_module
from kiln.injob import netns as runtime_netns
from kiln.injob import sandbox as runtime_sandbox
from kiln.settings import Settings
from kiln.storage.logs import LogStore
from kiln.storage.store import ObjectStore

log = logging.getLogger(__name__)

MAX_UNIX_SOCKET_PATH = 100
LISTEN_SECONDS = 0.5  # the longest one step of the shim-notify work waits for a note (the server's stop waits it)


class LocalBackend(
    Backend,
    SpecValidator,
    Preemptible,
    OutputCollector,
    CheckpointSyncer,
    EventSyncer,
    JobFiles,
    ExtractsMetrics,  # each attempt's shim extracts them
    LocalRuntimeBuilder,
    BackgroundWork,  # the shims' notes, spare networks
    WorkDirs,
    MetricSpools,  # each job's metrics/, beside its work dir
    NotebookHost,  # on a Unix socket in the job's work dir
):
    name = "local"

    @classmethod
    def from_settings(cls, deps: BackendDeps) -> Self:
        runtimes = RuntimeManager(deps.catalog, deps.settings.resolved_runtimes_dir)
        return cls(deps.settings, deps.store, deps.logs, runtimes, wake=deps.wake, metrics_ready=deps.metrics_ready)

    def __init__(
        self,
        settings: Settings,
        store: ObjectStore,
        logs: LogStore,
        runtimes: RuntimeManager,
        wake: Callable[[str | None], None] | None = None,
        metrics_ready: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self._metrics_ready = metrics_ready
        self.store = store
        self.logs = logs
        self.runtimes = runtimes
        self.runtime_builds = RuntimeBuilds(runtimes.root, SHIM_PATH)
        self.jobs_dir = settings.jobs_dir
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        private_dir(self.jobs_dir)
        # Which interpreters runtime.python may name, and what of the machine a job's sandbox shows for one.
        self.python_policy = PythonPolicy.from_settings(settings, store.root if store.is_local else None)
        self.pylib = job_pylib(settings.home / "pylib")
        self._inventory = local_inventory(settings)
        self.sandbox = detect(settings)
        if self.sandbox.problem:
            log.error("job sandbox: %s", self.sandbox.problem)
        elif self.sandbox.sandboxed:
            log.info("job sandbox: %s", self.sandbox.detail)
        else:
            log.warning("job sandbox: %s", self.sandbox.detail)
        self.networking = job_network.detect(settings, self.sandbox.sandboxed)
        if self.networking.available or not self.sandbox.sandboxed:
            log.info("job network: %s", self.networking.detail)
        else:
            log.error("job network: %s", self.networking.problem("isolated"))
        self.spare_networks = netpool.SparePool(self.networking, settings)
        self.shims = ShimLauncher(settings.run_dir)
        self._wake = wake
        self._mount_probed = False
        self._sock: socket.socket | None = None
        self.notify_path: str | None = None
        self._open_notify_socket()

    # -- notifications --------------------------------------------------------------------------------

    def _open_notify_socket(self) -> None:
        """Bind the datagram socket the shims send their notes to (read by ``_listen_once``)."""
        self.settings.run_dir.mkdir(parents=True, exist_ok=True)
        path = str(self.settings.run_dir / "notify.sock")
        if len(path) > MAX_UNIX_SOCKET_PATH or self._wake is None:
            log.info("shim notifications off (socket path too long or no waker); polling only")
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        self._sock = sock
        self.notify_path = path

    def background_work(self) -> list[Work]:
        work = []
        if self._sock is not None:  # the shims' notes, as they come (a blocking wait of up to LISTEN_SECONDS)
            work.append(Work("shim-notify", self._listen_once, LISTEN_SECONDS))
        if self.spare_networks.wanted:
            work.append(Work("network-spares", self.spare_networks.fill_once, 1.0, self.spare_networks.wake))
        return work

    def _listen_once(self) -> float | None:
        """Wait up to LISTEN_SECONDS for the shims' notes and hand each on: 0 (listen again at once), or None once
        the socket is closed."""
        sock = self._sock
        if sock is None:
            return None
        try:
            ready, _, _ = select.select([sock], [], [], LISTEN_SECONDS)
        except (OSError, ValueError):  # closed meanwhile
            return None
        while ready:
            try:
                data = sock.recv(4096, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except OSError:
                return None
            self._note(data)
        return 0.0

    def _note(self, data: bytes) -> None:
        try:
            note = json.loads(data)
            job_id, event = note.get("job_id"), note.get("event")
        except (ValueError, AttributeError):
            job_id, event = None, None
        job_id = job_id if isinstance(job_id, str) else None
        if event == "metrics":  # points of a watched metric (metrics.watch) are in the job's spool files
            if job_id is not None and self._metrics_ready is not None:
                self._metrics_ready(job_id)
        elif self._wake:
            self._wake(job_id)

    def close(self) -> None:
        self.spare_networks.close()
        self.shims.close()
        if self._sock is not None:
            sock, self._sock = self._sock, None
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    # -- contract -------------------------------------------------------------------------------------

    def inventory(self) -> Inventory:
        return self._inventory

    def validate(self, spec: JobSpec) -> None:
        if self.sandbox.problem:
            raise InvalidInput(self.sandbox.problem)
        if self.sandbox.sandboxed and (why := self.networking.problem(spec.network)):
            raise InvalidInput(f"network: {spec.network}: {why}", details={"field": "spec.network"})
        try:
            self.runtimes.resolve(spec.runtime, self.python_policy)
        except KilnError as exc:
            raise InvalidInput(exc.message, details=exc.details) from exc
        for index, item in enumerate(spec.inputs):
            if item.mode == "mount":
                why = self._mount_problem()
                if why:
                    raise InvalidInput(
                        f"inputs[{index}].mode: mount is not available on this machine: {why}; use mode: stage",
                        details={"field": f"spec.inputs[{index}].mode"},
                    )

    def _mount_problem(self) -> str | None:
        """Why this machine cannot mount inputs, or None: what is missing, else a test mount (once a server's
        life, when it first succeeds; a failure is looked at again next time, after an install perhaps)."""
        kind = "local" if self.store.is_local else "s3" if self.store.is_s3 else "other"
        if kind == "other":
            return f"mounting needs a local or S3 object store, not {self.store.display}"
        tools = self.settings.mount_tool_list
        why = mount_module.mount_problem(kind, tools)
        if why or self._mount_probed:
            return why
        usable = mount_module.usable_tools(kind, tools)
        probe_dir = self.settings.run_dir / f"mount-probe-{os.getpid()}-{threading.get_ident()}"
        why = mount_module.probe(usable[0], str(probe_dir)) if usable else None
        self._mount_probed = why is None
        return why

    def job_dir(self, job_id: str) -> Path:
        return self.jobs_dir / job_id

    def work_dir(self, job_id: str, handle: dict[str, Any] | None) -> Path:
        return self._launched_job_dir(job_id, handle) / "work"

    def metric_spool(self, job_id: str, handle: dict[str, Any] | None) -> Path:
        return self._launched_job_dir(job_id, handle) / "metrics"

    def notebook_address(self, job_id: str, handle: dict[str, Any] | None) -> NotebookAddress | None:
        return jobfiles.notebook_address(self.work_dir(job_id, handle))

    def remove_metric_spool(self, job_id: str, handle: dict[str, Any] | None) -> None:
        jobfiles.remove_tree(self.metric_spool(job_id, handle))

    def _launched_job_dir(self, job_id: str, handle: dict[str, Any] | None) -> Path:
        """The job's directory in the home of the server that launched the attempt: its handle's directory,
        ``<jobs dir>/<job>/attempts/<n>``, says which (with several servers on one database any of them may have
        placed it); else this one's."""
        recorded = (handle or {}).get("dir")
        if isinstance(recorded, str) and os.path.isabs(recorded):
            return Path(recorded).parent.parent
        return self.job_dir(job_id)

    def handle_for(self, job_id: str, attempt: int) -> dict[str, Any]:
        # "log": the file the attempt writes its log to, for whichever server on this machine ships it.
        return {
            "job_id": job_id,
            "attempt": attempt,
            "dir": str(self.job_dir(job_id) / "attempts" / str(attempt)),
            "log": str(self.logs.path(job_id)),
        }

    def _recorded(self, launch: Launch) -> dict[str, Any]:
        """The attempt's handle as the job's row records it: its directory and log file are those of the server
        that committed STARTING, which may be another server on this machine. Another server that takes the job
        over (that one's lease ran out: it died, or it is slow) and finds the attempt never launched launches it
        there, not in its own home: the attempt's claim is then one lock, so that when the first server's start
        comes after all one of the two runs it, and the next observation of that directory finds it. Launched in
        the second server's own home, the attempt ran twice, or (the first server dead) was never seen from the
        recorded directory, launched again at every pass and failed after five launches."""
        own = self.handle_for(launch.job_id, launch.attempt)
        recorded = launch.handle or {}
        if isinstance(recorded.get("dir"), str) and isinstance(recorded.get("log"), str):
            return {**own, "dir": recorded["dir"], "log": recorded["log"]}
        return own

    def start(self, launch: Launch) -> dict[str, Any]:
        # When the start was asked for, recorded in each member's launch.json: a server paused in the middle of a
        # start (its lease looked at before) finishes that same start after it resumes, and may spawn then.
        asked = time.time()
        handle = self._recorded(launch)
        attempt_dir = Path(handle["dir"])
        if launch.spec.distributed is None and self.shims.launched(attempt_dir):
            return handle  # launched before (a crash, or a start that raised late): adopted, never run twice
        try:
            resolved = self.runtimes.resolve(launch.spec.runtime, self.python_policy)
        except KilnError as exc:
            raise BackendError(exc.message, retryable=False) from exc
        job_dir = attempt_dir.parent.parent  # the recorded home's job directory (jobs/<job>/attempts/<n>)
        names = ("work", "outputs", "checkpoints", "site", "metrics", "tensorboard", "home")
        dirs = {name: job_dir / name for name in names}
        wanted = launch.spec.metrics
        if wanted.tensorboard_dir:
            dirs["tensorboard"] = dirs["work"] / wanted.tensorboard_dir
        # The job's directory is root's alone (the job reaches its own directories through the sandbox's binds);
        # the attempt's is shown to the job read-only, for its notice and parameters: its group's, not the world's.
        for path in (job_dir, attempt_dir.parent):
            private_dir(path)
        private_dir(attempt_dir, job_group(self.sandbox, launch.org_id, self.settings))
        for path in dirs.values():
            path.mkdir(parents=True, exist_ok=True)
        prepare_dirs(self.sandbox, launch.org_id, self.settings, dirs)
        archive = self._code_archive(launch, job_dir)
        base = {
            "job_id": launch.job_id,
            "attempt": launch.attempt,
            "launch": launch.launch_id,
            "work_dir": str(dirs["work"]),
            "code_archive": str(archive) if archive else None,
            "log_path": handle["log"],
            "prepare": command_argv(launch.spec.prepare_command) if launch.spec.prepare_command else None,
            "command": command_argv(launch.spec.command),
            "finish": command_argv(launch.spec.finish_command) if launch.spec.finish_command else None,
            "timeout": launch.spec.timeout,
            "grace": self.settings.kill_grace_seconds,
            "notify_socket": self.notify_path,
            "runtime_build": resolved.build,
            "disk_limit": launch.spec.resources.disk or self.settings.job_disk_default,
            "disk_paths": [str(p) for p in dirs.values()],
            "log_limit": launch.spec.resources.log or self.settings.job_log_default,
            "network": job_network.attempt_network(
                self.networking, self.settings, launch.spec.network, launch.job_id, launch.attempt
            ),
        }
        base["metrics"] = {
            "dir": str(dirs["metrics"]),
            "builtin": wanted.builtin,
            "patterns": [p.model_dump() for p in wanted.patterns],
            "include": wanted.include,
            "exclude": wanted.exclude,
            "tensorboard_dir": str(dirs["tensorboard"]) if wanted.tensorboard else None,
            "system": wanted.system,
            "system_interval": wanted.system_interval,
            "watch": wanted.watch,
            "tensorboard_bytes": self.settings.job_tensorboard_bytes,
            "tensorboard_cpu_seconds": self.settings.job_tensorboard_cpu_seconds,
        }
        mounts: MountConfig | None = None
        if launch.inputs:
            base["inputs"] = [input_config(self.store, i) for i in launch.inputs]
            base["data_cache"] = {
                "dir": str(self.settings.home / "cache" / "data"),
                "max_bytes": self.settings.data_cache_bytes,
            }
            mounts = mount_config(self.store, self.settings, launch.inputs)
            if mounts is not None:  # one mount per attempt, shared by its members
                base["mount"] = {
                    **mounts.config,
                    "dir": str(attempt_dir / "mount"),
                    "secret_file": str(attempt_dir / mount_module.SECRET_FILE),
                }
        network = base["network"]
        if isinstance(network, dict):
            self.spare_networks.take(network, launch.org_id)  # made ahead: its shims find it ready
        notice = attempt_dir / "notice"
        # The job's parameters as one JSON file ($KILN_PARAMS_FILE), beside the notice file the job reads too.
        (attempt_dir / shimconfig.PARAMS_FILE).write_text(json.dumps(launch.spec.params, sort_keys=True))
        if launch.spec.distributed is not None:
            return self._start_gang(launch, handle, base, resolved, dirs, notice, mounts, asked)
        config = {
            **base,
            "env": self._env(launch, resolved, dirs, notice, launch.cpus, launch.gpus),
            "memory_limit": launch.memory,
            "sandbox": self._box(launch, resolved, dirs, attempt_dir, attempt_dir, launch.gpus, launch.memory),
            "cgroup": joblimits.cgroup_config(
                self.settings, launch.spec, launch.job_id, launch.attempt, attempt_dir, attempt_dir, launch.cpus
            ),
        }
        self._launch_member(attempt_dir, config, mounts, asked)
        return handle

    def _start_gang(
        self,
        launch: Launch,
        handle: dict[str, Any],
        base: dict[str, Any],
        resolved: ResolvedRuntime,
        dirs: dict[str, Path],
        notice: Path,
        mounts: MountConfig | None,
        asked: float,
    ) -> dict[str, Any]:
        """One shim per member, all started before this returns (the scheduler placed the whole gang)."""
        spec = launch.spec.distributed
        assert spec is not None
        attempt_dir = Path(handle["dir"])
        roles = gang_members(spec)
        if len(launch.slots) != len(roles):
            raise BackendError(f"a gang of {len(roles)} got {len(launch.slots)} slots", retryable=False)
        layout = gang_layout(attempt_dir, spec, roles)
        members = [Member(m["role"], m["index"], m["host"], m["port"]) for m in layout["members"]]
        hostfile: Path | None = None
        if spec.framework == "mpi":
            hostfile = attempt_dir / "hostfile"
            hostfile.write_text(hostfile_text(spec, members))
        for position, (member, slot) in enumerate(zip(members, launch.slots, strict=True)):
            member_dir = attempt_dir / layout["members"][position]["dir"]
            if self.shims.launched(member_dir):
                continue  # launched before (a crash): adopted
            if not layout["members"][position]["runs"]:
                continue
            procs = member_env(launch.job_id, spec, members, position, hostfile=str(hostfile) if hostfile else None)
            env = self._env(launch, resolved, dirs, notice, slot.cpus / len(procs), slot.gpus)
            config = {
                **base,
                "env": {**env, **procs[0]} if len(procs) == 1 else env,
                "memory_limit": slot.memory,
                "sandbox": self._box(launch, resolved, dirs, attempt_dir, member_dir, slot.gpus, slot.memory),
                "log_tag": f"{member.role}{member.index}",
                "cgroup": joblimits.cgroup_config(
                    self.settings, launch.spec, launch.job_id, launch.attempt, attempt_dir, member_dir, slot.cpus
                ),
            }
            if len(procs) > 1:
                config["procs"] = procs
            self._launch_member(member_dir, config, mounts, asked)
        return handle

    def _env(
        self,
        launch: Launch,
        resolved: ResolvedRuntime,
        dirs: dict[str, Path],
        notice: Path,
        cpus: float,
        gpus: tuple[int, ...],
    ) -> dict[str, str]:
        env = job_env(launch, self.pylib, resolved.bin_dir, dirs, notice, cpus, gpus)
        if self.networking.available and launch.spec.network != "host" and "KILN_ENDPOINT" in env:
            env["KILN_ENDPOINT"] = job_network.job_endpoint(self.settings)  # its forwarded loopback port
        if self.sandbox.sandboxed:  # the server's home and temporary dir are not in the sandbox
            env.pop("TMPDIR", None)
            env["HOME"] = str(dirs["home"])
            env["USER"] = env["LOGNAME"] = JOB_USER
        return env

    def _box(
        self,
        launch: Launch,
        resolved: ResolvedRuntime,
        dirs: dict[str, Path],
        attempt_dir: Path,
        member_dir: Path,
        gpus: tuple[int, ...],
        memory: int | None,
    ) -> dict[str, Any] | None:
        if member_dir != attempt_dir:  # a gang member's: its config and scratch, nothing the job reads by path
            for path in (member_dir.parent, member_dir):
                private_dir(path)
        return attempt_box(
            self.sandbox,
            self.settings,
            launch.org_id,
            dirs,
            attempt_dir,
            member_dir,
            resolved.roots,
            self.pylib,
            gpus,
            memory,
        )

    def _launch_member(
        self, member_dir: Path, config: dict[str, Any], mounts: MountConfig | None, asked: float
    ) -> None:
        member_dir.mkdir(parents=True, exist_ok=True)
        if mounts is not None:  # the member that mounts (or joins the mount) deletes it
            write_secret(Path(config["mount"]["secret_file"]), mounts.secret)
        # The job's token and environment: root's alone (the shim reads it before the job's steps drop to its uid).
        write_private(member_dir / "shim.json", json.dumps(config))
        self.shims.launch(member_dir, config.get("launch"), asked)

    def _code_archive(self, launch: Launch, job_dir: Path) -> Path | None:
        if not launch.code_key:
            return None
        local = self.store.local_path(launch.code_key)
        if local is not None:
            return local
        cached = job_dir / "code.tar.gz"
        if not cached.exists():
            self.store.download(launch.code_key, cached)
        return cached

    def poll(self, handle: dict[str, Any]) -> AttemptStatus:
        members = member_dirs(handle)
        if len(members) == 1 and members[0][2] == Path(handle["dir"]):
            return self.shims.poll(members[0][2])
        view = aggregate([MemberStatus(role, index, self.shims.poll(d)) for role, index, d in members])
        for position in view.stop:
            self.shims.stop(members[position][2], view.stop_reason, view.stop_message, self.settings.kill_grace_seconds)
        return view.status

    def cancel(self, handle: dict[str, Any], grace_seconds: float) -> None:
        for _, _, member_dir in member_dirs(handle):
            self.shims.terminate(member_dir)

    def preempt(self, handle: dict[str, Any], reason: str, grace_seconds: float) -> None:
        """The notice file first (a script polling it checkpoints before the signal), then a stop request that
        tells each shim the grace to give and the reason to record, then SIGTERM."""
        notice = Path(handle["dir"]) / "notice"
        write_json_atomic(notice, {"reason": "Preempted", "message": reason, "grace_seconds": grace_seconds})
        for _, _, member_dir in member_dirs(handle):
            self.shims.stop(member_dir, "Preempted", reason, grace_seconds)

    def sync_checkpoints(
        self, handle: dict[str, Any], dest_prefix: str, admit: Callable[[int], None] | None = None
    ) -> tuple[int, int]:
        return jobfiles.sync_checkpoints(self.store, self._job_dir_of(handle), dest_prefix, admit)

    def sync_events(
        self, handle: dict[str, Any], dest_prefix: str, admit: Callable[[int], None] | None = None
    ) -> tuple[int, int]:
        job_dir = self._job_dir_of(handle)
        rel = jobfiles.events_dir(member_dirs(handle), job_dir)
        keep = self.settings.tensorboard_keep_bytes
        return jobfiles.sync_events(self.store, job_dir, rel, dest_prefix, keep, admit)

    def collect_outputs(
        self, handle: dict[str, Any], dest_prefix: str, admit: Callable[[int], None] | None = None
    ) -> tuple[int, int]:
        # No more than the job's disk limit (as its shim was told): a job that ended past it keeps no outputs.
        shim = next((read_json(d / "shim.json") or {} for _, _, d in member_dirs(handle)), {})
        most = shim.get("disk_limit") if isinstance(shim.get("disk_limit"), int) else None
        return jobfiles.copy_tree(self.store, self._job_dir_of(handle) / "outputs", dest_prefix, admit, most)

    def release(self, handle: dict[str, Any], keep: bool) -> None:
        jobfiles.release(self._job_dir_of(handle), self.settings.work_retention_seconds if keep else 0)

    def _job_dir_of(self, handle: dict[str, Any]) -> Path:
        """The job directory of the attempt a handle names (its dir is <job>/attempts/<n>): another server's on
        this machine, for an attempt this one adopted; this server's where the handle names none."""
        return Path(handle["dir"]).parent.parent if handle.get("dir") else self.job_dir(handle["job_id"])

    def sweep(self) -> None:
        jobfiles.sweep(self.jobs_dir)

    def cleanup(self, handle: dict[str, Any]) -> None:
        """Kill whatever is left of an attempt's sessions (a shim that died leaves its job orphaned), and unmount
        what such a shim left mounted."""
        shims: dict[int, dict[str, Any]] = {}
        for _, _, member_dir in member_dirs(handle):
            info = read_json(member_dir / claim.PID)
            if info and still_its_session(info) and not claim.held(str(member_dir)):
                shims[int(info["pid"])] = info  # each shim is its session's leader
        for proc in psutil.process_iter(["pid"]) if shims else ():
            try:
                sid = os.getsid(proc.pid)
                # Asked again at each kill: the walk takes a while, and the id may be a new session's by now.
                if sid in shims and still_its_session(shims[sid]):
                    proc.kill()
            except (OSError, psutil.Error):
                continue
        attempt_dir = Path(handle["dir"])  # the mount's tool runs in a session of its own
        for _, _, member_dir in member_dirs(handle):  # a sandboxed member's /dev/shm and /tmp
            runtime_sandbox.unmount_scratch(str(member_dir / "scratch"))
        mount_module.cleanup(str(attempt_dir / "mount"), str(attempt_dir / mount_module.SECRET_FILE))
        joblimits.cleanup(handle)  # the members' control groups, with whatever escaped the sessions
        runtime_netns.cleanup(str(job_network.network_dir(self.settings, handle["job_id"], handle["attempt"])))

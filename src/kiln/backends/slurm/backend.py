"""The Slurm backend: the controller that runs Kiln attempts as Slurm batch jobs, through the command-line tools
every site has (``sbatch``, ``squeue``, ``scontrol``, ``scancel``; ``sacct`` where accounting is on). The commands
run with the server's environment, so ``SLURM_CONF`` points them at any cluster.

- ``start`` renders the attempt (:func:`kiln.backends.slurm.render.render`, with the attempt's job token) and
  submits it with ``sbatch --parsable`` (the script on stdin). It is safe to call again: it first looks the attempt
  up by its job name ``kiln-<job id>-a<attempt>`` (unique per attempt: in the queue pass's listing, or with
  ``squeue --name`` where this process ran sbatch for it before, ``_submitted``) and adopts what it finds, and the
  script carries ``--dependency=singleton``, so two submissions of one attempt (two servers racing) never run at
  once; the queue pass cancels every duplicate but the first. A pass's starts run side by side
  (``start_concurrency``): a burst's sbatch calls do not wait on each other.
- Status: ONE ``squeue --states=all`` call per pass lists every Kiln job of the server's user (pending, running, and
  ended ones for Slurm's ``MinJobAge``), into a cache that ``poll`` reads (:mod:`kiln.backends.slurm.queue` maps
  the states). The pass is the backend's ``slurm-queue`` background work, run by the server's task runner every
  ``KILN_SLURM_POLL_SECONDS``, sooner (0.2 s) while an attempt submitted in the last minute has not ended, and at
  once after a submit; a change of an attempt's state wakes the reconciler for its job. A failing ``squeue`` (the
  controller unreachable) is the task's error, which ``/readyz`` shows; jobs then wait.
- ``cancel``: ``scancel`` by name (the whole step tree, SIGTERM then SIGKILL after the cluster's ``KillWait``).
  ``preempt``: ``scancel --signal=URG`` to the batch step (``--full``) and to every other step (each member writes
  the notice file, ``$KILN_NOTICE_FILE``, and passes SIGTERM to the job's processes; SIGURG, whose default action is
  to ignore it, because Slurm signals every process of a step, the job's own included), then, after the grace,
  ``scancel``.
- Logs: each member posts its output to ``POST /api/v1/jobs/{id}/logs`` with the job token (tagged per member for a
  gang), so the server's log-metrics task extracts metrics as for pods; code, inputs, checkpoints and outputs go
  through the store with the job token as on Kubernetes (no shared filesystem is assumed).
- ``validate`` (at submit) renders the spec and asks Slurm whether it could ever run it (``sbatch --test-only``):
  more GPUs than any node, an unknown partition, … are a 422 in Slurm's words. An unreachable Slurm refuses nothing.
- ``nodes``: ``scontrol show node -o`` (CPUs, memory, GPUs from the GRES, features as labels ``FEATURE=true``,
  ``kiln.io/hostname``), refreshed at most every 30 s; drained and down nodes are left out.
"""

from __future__ import annotations

import logging
import os
import pwd
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Self

from kiln.backends.base import AttemptStatus, Backend, BackendDeps, Inventory, Launch, Phase
from kiln.backends.capabilities import BackgroundWork, Preemptible, SpecValidator, Work, WorkSet
from kiln.backends.slurm.queue import SQUEUE_FORMAT, QueueEntry, parse_nodes, parse_squeue, status_of
from kiln.backends.slurm.render import SlurmJob, job_name, render
from kiln.backends.slurm.settings import SlurmCommands, slurm_commands
from kiln.domain.spec import JobSpec
from kiln.errors import BackendError, InvalidInput
from kiln.settings import SlurmSettings

log = logging.getLogger(__name__)

COMMAND_TIMEOUT = 30.0
FAST_POLL = 0.2  # seconds between queue passes while a submission of the last FAST_WINDOW has not ended
FAST_WINDOW = 60.0  # how long after its submission an attempt counts as fresh
START_CONCURRENCY = 8  # sbatch calls a reconcile pass makes side by side (a burst's submissions)
NODE_REFRESH = 30.0
VALIDATED_FOR = 60.0  # seconds a set of directives sbatch --test-only accepted is not asked about again
UNREACHABLE = ("Unable to contact slurm controller", "Socket timed out", "Connection refused", "Zero Bytes were")


@dataclass
class _Attempt:
    job_id: str
    attempt: int
    slurm_id: str | None = None
    submitted_at: float | None = None  # monotonic, when this process submitted or adopted it
    stopping: tuple[str, str] | None = None  # Kiln's own cancel or preemption: (reason, message)
    kill_at: float | None = None  # a preemption's grace ends: scancel then
    final: AttemptStatus | None = None
    last_state: str | None = None
    tried: bool = False  # this process ran sbatch for it (whatever came of it)


class SlurmBackend(Backend, BackgroundWork, SpecValidator, Preemptible):
    """Kiln attempts as Slurm batch jobs (module docstring; docs/slurm.md)."""

    name = "slurm"
    start_concurrency = START_CONCURRENCY

    @classmethod
    def from_settings(cls, deps: BackendDeps) -> Self:
        settings = deps.settings
        backend = cls(
            settings.slurm,
            slurm_commands(settings.slurm),
            endpoint=settings.endpoint,
            checkpoint_sync_seconds=settings.checkpoint_sync_seconds,
            wake=deps.wake,
        )
        problem = backend.reachable()
        if problem:
            log.warning("Slurm is not reachable now (%s): jobs wait until it is; /readyz shows the queue task", problem)
        log.warning(
            "Slurm backend: network: isolated and the local sandbox are not enforced on Slurm nodes (docs/slurm.md)"
        )
        return backend

    def __init__(
        self,
        settings: SlurmSettings,
        commands: SlurmCommands,
        *,
        endpoint: str,
        checkpoint_sync_seconds: float = 300.0,
        wake: Any = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.commands = commands
        self.endpoint = endpoint
        self.checkpoint_sync_seconds = checkpoint_sync_seconds
        self._wake = wake
        self._env = dict(os.environ if env is None else env)
        self._user = pwd.getpwuid(os.getuid()).pw_name
        self._lock = threading.Lock()
        self._attempts: dict[str, _Attempt] = {}  # by job name
        self._queue: dict[str, list[QueueEntry]] = {}  # job name → entries, lowest Slurm id first
        self._queue_at: float | None = None  # monotonic start of the pass that filled the cache
        self._queue_error: str | None = None
        self._nodes: list[Inventory] = []
        self._nodes_at = 0.0
        self._validated: dict[tuple[str, ...], float] = {}
        self._work = Work("slurm-queue", self._pass, interval=settings.poll_seconds)

    # -- running the commands ---------------------------------------------------------------------------------

    def _run(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                list(args),
                env=self._env,
                input=input,
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise BackendError(f"{os.path.basename(args[0])} took over {COMMAND_TIMEOUT:g}s", retryable=True) from exc
        except OSError as exc:
            raise BackendError(f"cannot run {args[0]}: {exc}", retryable=True) from exc

    @staticmethod
    def _said(done: subprocess.CompletedProcess[str]) -> str:
        return " ".join((done.stderr.strip() + " " + done.stdout.strip()).split()) or f"exit code {done.returncode}"

    def _check(self, done: subprocess.CompletedProcess[str], what: str) -> subprocess.CompletedProcess[str]:
        if done.returncode != 0:
            said = self._said(done)
            raise BackendError(f"{what} failed: {said}", retryable=any(s in said for s in UNREACHABLE))
        return done

    def reachable(self) -> str | None:
        """None when the controller answers ``scontrol ping``, else what was said."""
        try:
            done = self._run(self.commands.scontrol, "ping")
        except BackendError as exc:
            return exc.message
        return None if done.returncode == 0 and " is UP" in done.stdout else self._said(done)

    def _squeue(self, *extra: str) -> list[QueueEntry]:
        done = self._run(
            self.commands.squeue, "--noheader", "--states=all", f"--user={self._user}", f"--Format={SQUEUE_FORMAT}",
            *extra,
        )  # fmt: skip
        return parse_squeue(self._check(done, "squeue").stdout)

    # -- the queue pass (background work) ---------------------------------------------------------------------

    def background_work(self) -> Sequence[Work | WorkSet]:
        return [self._work]

    def _pass(self) -> float | None:
        started = time.monotonic()
        try:
            entries = self._squeue()
        except BackendError as exc:
            self._queue_error = exc.message
            raise
        queue: dict[str, list[QueueEntry]] = {}
        for entry in entries:
            if entry.job_attempt is not None:
                queue.setdefault(entry.name, []).append(entry)
        for found in queue.values():
            found.sort(key=lambda e: int(e.slurm_id))
        woken: list[str] = []
        duplicates: list[str] = []
        fast = False
        with self._lock:
            self._queue, self._queue_at, self._queue_error = queue, started, None
            for name, attempt in self._attempts.items():
                listed = queue.get(name, [])
                state = listed[0].state if listed else None
                if state != attempt.last_state:
                    attempt.last_state = state
                    woken.append(attempt.job_id)
                if listed:
                    duplicates += [e.slurm_id for e in listed[1:] if e.state in ("PENDING", "RUNNING")]
                    if attempt.slurm_id is None:
                        attempt.slurm_id = listed[0].slurm_id
                fresh = attempt.submitted_at is not None and started - attempt.submitted_at < FAST_WINDOW
                if fresh and attempt.final is None:  # its start, or a short job's end, is seen within FAST_POLL
                    fast = True
            due = [a for a in self._attempts.values() if a.kill_at is not None and a.kill_at <= started]
            for attempt in due:
                attempt.kill_at = None
        for slurm_id in duplicates:  # a second submission of one attempt (two servers raced): it never runs
            log.warning("cancelling Slurm job %s: a second submission of an attempt", slurm_id)
            self._run(self.commands.scancel, slurm_id)
        for attempt in due:  # a preemption's grace is over
            self._scancel(attempt)
        if self._wake is not None:
            for job_id in woken:
                self._wake(job_id)
        return FAST_POLL if fast else None

    # -- contract ---------------------------------------------------------------------------------------------

    def _track(self, job_id: str, attempt: int) -> _Attempt:
        name = job_name(job_id, attempt)
        with self._lock:
            tracked = self._attempts.get(name)
            if tracked is None:
                tracked = self._attempts[name] = _Attempt(job_id, attempt)
        return tracked

    def handle_for(self, job_id: str, attempt: int) -> dict[str, Any]:
        return {"job_id": job_id, "attempt": attempt, "name": job_name(job_id, attempt)}

    def _script(self, job: SlurmJob) -> str:
        return render(job, self.settings)

    def start(self, launch: Launch) -> dict[str, Any]:
        handle = self.handle_for(launch.job_id, launch.attempt)
        attempt = self._track(launch.job_id, launch.attempt)
        if attempt.stopping is not None or attempt.slurm_id is not None:
            return handle  # cancelled before it was launched, or launched already
        found = self._submitted(handle["name"], attempt)
        if found:  # a submission a crash (or another server) made: adopted, never submitted twice
            attempt.slurm_id, attempt.submitted_at = found[0].slurm_id, time.monotonic()
            return handle
        code_sha = launch.code_key.rsplit("/", 1)[-1].split(".", 1)[0] if launch.code_key else None
        script = self._script(
            SlurmJob(
                job_id=launch.job_id,
                org_id=launch.org_id,
                attempt=launch.attempt,
                spec=launch.spec,
                endpoint=launch.api_endpoint or self.endpoint,
                token=launch.job_token,
                code_sha256=code_sha,
                checkpoint_sync_seconds=self.checkpoint_sync_seconds,
            )
        )
        attempt.tried = True
        done = self._run(self.commands.sbatch, "--parsable", "--dependency=singleton", input=script)
        if done.returncode != 0:
            said = self._said(done)
            if any(s in said for s in UNREACHABLE):
                raise BackendError(f"sbatch could not reach Slurm: {said}", retryable=True)
            raise BackendError(f"Slurm refused the job: {said}", retryable=False)
        slurm_id = done.stdout.strip().split(";")[0]
        with self._lock:
            attempt.slurm_id, attempt.submitted_at = slurm_id, time.monotonic()
        self._work.wake.set()
        log.info("job %s attempt %d: Slurm job %s", launch.job_id, launch.attempt, slurm_id)
        return handle

    def _submitted(self, name: str, attempt: _Attempt) -> list[QueueEntry]:
        """Slurm's jobs named for the attempt: a submission an earlier server process (killed, say) or another
        server made. The last queue pass's listing answers when this process has never run sbatch for the attempt:
        it was taken by this process, so after every submission an earlier process completed, and it lists every
        Kiln job of the user (``--states=all``), as a lookup by name would; a burst then makes no ``squeue`` round
        trip per submission. Otherwise (this process tried before: that sbatch may have gone through) Slurm is
        asked by name. What neither can see, an sbatch still in flight from a killed server, is what
        ``--dependency=singleton`` and the queue pass's cancelling of duplicates are for."""
        with self._lock:
            listed = None if attempt.tried or self._queue_at is None else list(self._queue.get(name, ()))
        return listed if listed is not None else self._squeue(f"--name={name}")

    def poll(self, handle: dict[str, Any]) -> AttemptStatus:
        attempt = self._track(handle["job_id"], int(handle["attempt"]))
        if attempt.final is not None:
            return attempt.final
        name = job_name(attempt.job_id, attempt.attempt)
        if self._queue_at is None:  # nothing listed yet (a server that just started): list now, once
            try:
                self._pass()
            except BackendError:
                pass
        with self._lock:
            queue_at, found = self._queue_at, list(self._queue.get(name, ()))
        if queue_at is None or (attempt.submitted_at is not None and queue_at < attempt.submitted_at):
            self._work.wake.set()
            where = f"Slurm job {attempt.slurm_id}" if attempt.slurm_id else name
            error = f" (squeue: {self._queue_error})" if self._queue_error else ""
            return AttemptStatus(Phase.STARTING, message=f"{where}: waiting for Slurm's queue to list it{error}")
        if found:
            status = status_of(found[0], attempt.stopping)
        elif attempt.stopping is not None:
            reason, message = attempt.stopping
            status = AttemptStatus(Phase.EXITED, None, reason, message, finished_at=datetime.now(UTC))
        elif attempt.slurm_id is None:
            return AttemptStatus(Phase.UNLAUNCHED, None, "NotSubmitted", f"Slurm has no job named {name}")
        else:
            message = (
                f"Slurm no longer lists job {attempt.slurm_id} ({name}): it ended more than MinJobAge ago while "
                "no server watched, or was purged"
            )
            status = AttemptStatus(Phase.LOST, None, "SlurmJobMissing", message, finished_at=datetime.now(UTC))
        if status.phase in (Phase.EXITED, Phase.LOST):
            attempt.final = status
        return status

    def _scancel(self, attempt: _Attempt, *options: str) -> None:
        target = [attempt.slurm_id] if attempt.slurm_id else [f"--name={job_name(attempt.job_id, attempt.attempt)}"]
        done = self._run(self.commands.scancel, f"--user={self._user}", *options, *target)
        said = self._said(done)
        if done.returncode != 0 and "already completing or completed" not in said and "Invalid job id" not in said:
            self._check(done, "scancel")

    def cancel(self, handle: dict[str, Any], grace_seconds: float) -> None:
        """``scancel``: every step, the batch step included, gets SIGTERM, then SIGKILL after the cluster's
        ``KillWait``. Idempotent; an attempt not submitted yet never will be."""
        attempt = self._track(handle["job_id"], int(handle["attempt"]))
        if attempt.stopping is None:
            attempt.stopping = ("Cancelled", "cancelled: its Slurm job was cancelled (scancel)")
        if attempt.final is None:
            self._scancel(attempt)

    def preempt(self, handle: dict[str, Any], reason: str, grace_seconds: float) -> None:
        """Each member writes the notice file and passes SIGTERM on (``scancel --signal=URG``, to the batch step
        and to the others); after ``grace_seconds`` the job is cancelled outright if it has not ended."""
        attempt = self._track(handle["job_id"], int(handle["attempt"]))
        if attempt.stopping is None:
            attempt.stopping = ("Preempted", reason)
        if attempt.final is not None:
            return
        if attempt.slurm_id is None and not self._squeue(f"--name={handle['name']}"):
            return  # never submitted: start() now never will
        self._scancel(attempt, "--full", "--signal=URG")  # the batch step: a job of one member
        self._scancel(attempt, "--signal=URG")  # the other steps: a gang's members under srun
        attempt.kill_at = time.monotonic() + grace_seconds
        self._work.wake.set()

    def cleanup(self, handle: dict[str, Any]) -> None:
        """A lost or ended attempt leaves nothing running in Slurm (the members remove their own files)."""
        attempt = self._track(handle["job_id"], int(handle["attempt"]))
        if attempt.final is None or attempt.final.phase is Phase.LOST:
            self._scancel(attempt)

    # -- submit-time checks -----------------------------------------------------------------------------------

    def validate(self, spec: JobSpec) -> None:
        script = self._script(SlurmJob("validate", "validate", 1, spec, endpoint=self.endpoint))  # InvalidInput
        key = tuple(line for line in script.splitlines() if line.startswith("#SBATCH"))
        now = time.monotonic()
        if now - self._validated.get(key, -VALIDATED_FOR) < VALIDATED_FOR:
            return
        done = self._run(self.commands.sbatch, "--test-only", input=script)
        said = self._said(done)
        if done.returncode != 0:
            if any(s in said for s in UNREACHABLE):
                log.warning("could not check a spec against Slurm (%s): accepted", said)
                return
            raise InvalidInput(f"Slurm can never run this job: {said}", details={"backend": "slurm"})
        self._validated[key] = now

    # -- nodes ------------------------------------------------------------------------------------------------

    def nodes(self) -> list[Inventory]:
        if self._nodes and time.monotonic() - self._nodes_at < NODE_REFRESH:
            return list(self._nodes)
        try:
            done = self._check(self._run(self.commands.scontrol, "show", "node", "-o"), "scontrol show node")
        except BackendError as exc:
            log.warning("listing Slurm's nodes failed: %s", exc.message)
            return list(self._nodes)
        found = []
        partition = self.settings.partition
        for node in parse_nodes(done.stdout):
            if not node.usable or (partition and partition not in node.partitions):
                continue
            labels = {"kiln.io/backend": "slurm", "kiln.io/hostname": node.name}
            labels |= {feature: "true" for feature in node.features}
            found.append(
                Inventory(
                    cpus=float(node.cpus),
                    memory=node.memory_mb * 1024 * 1024,
                    gpus=tuple(range(node.gpus)),
                    gpu_names={i: node.gpu_type for i in range(node.gpus)} if node.gpu_type else {},
                    name=node.name,
                    labels=labels,
                )
            )
        self._nodes, self._nodes_at = found, time.monotonic()
        return list(found)

    def inventory(self) -> Inventory:
        nodes = self.nodes()
        return nodes[0] if nodes else Inventory(cpus=0.0, memory=0, name="slurm")

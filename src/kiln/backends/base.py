"""The backend contract every executor implements.

Contract for all methods: return fast (never wait for a job to finish); ``cancel`` is idempotent; raise
``BackendError(retryable=True)`` for "not yet, try again" and ``BackendError(retryable=False)`` for failures that
no retry fixes. Optional capabilities are mixins checked with ``isinstance``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from kiln.domain.spec import JobSpec


@dataclass(frozen=True)
class Inventory:
    """What one node of a backend can allocate in total (the local executor is one node)."""

    cpus: float
    memory: int
    gpus: tuple[int, ...] = ()
    gpu_names: dict[int, str] = field(default_factory=dict)  # index → model, e.g. "NVIDIA H200"
    name: str = "local"
    labels: dict[str, str] = field(default_factory=dict)  # matched by a job's node_selector


@dataclass(frozen=True)
class Slot:
    """What one member of a gang (a worker or a parameter server) was granted, and where."""

    node: str
    cpus: float
    memory: int | None
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class InputFile:
    path: str  # inside the dataset
    size: int
    sha256: str
    key: str  # object-store key of the blob


@dataclass(frozen=True)
class ResolvedInput:
    """A dataset version a job reads, resolved to its files (the version was pinned at submit)."""

    name: str
    version: int
    path: str  # where the job sees it, as the spec says (e.g. /data/mnist)
    env: str  # KILN_INPUT_<NAME>
    mode: str  # "stage" | "mount"
    files: tuple[InputFile, ...]
    blob_prefix: str = ""  # the object-store prefix of the organisation's blobs, which ``mode: mount`` mounts


@dataclass(frozen=True)
class Launch:
    """Everything a backend needs to start one attempt of a job."""

    job_id: str
    org_id: str
    attempt: int
    spec: JobSpec
    cpus: float
    memory: int | None
    gpus: tuple[int, ...]
    code_key: str | None  # object-store key of the code bundle
    job_token: str | None = None  # bearer token the job may use to call back (its own logs and artifacts)
    api_endpoint: str | None = None
    # One slot per gang member (workers, then parameter servers) of a distributed job; empty for a single one,
    # which runs on ``cpus``, ``memory`` and ``gpus`` above.
    slots: tuple[Slot, ...] = ()
    inputs: tuple[ResolvedInput, ...] = ()  # staged before the command runs


class Phase(StrEnum):
    STARTING = "starting"  # accepted, preparing (code, runtime, prepare_command)
    RUNNING = "running"  # the command runs
    EXITED = "exited"  # the attempt ended and left a record
    LOST = "lost"  # the attempt vanished without a record


@dataclass(frozen=True)
class AttemptStatus:
    phase: Phase
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    running_at: datetime | None = None
    finished_at: datetime | None = None


class Backend(abc.ABC):
    """An executor of job attempts."""

    name: str = "abstract"
    # Whether the backend's attempts extract metrics from their own output (the local executor's shim does). When
    # False, the server extracts them from the job's log in its log store (kiln.services.log_metrics).
    extracts_log_metrics: bool = True

    @abc.abstractmethod
    def inventory(self) -> Inventory:
        """Total allocatable resources (of the first node, for backends with several)."""

    def nodes(self) -> list[Inventory]:
        """Every node the scheduler may place on; one for a single-machine backend."""
        return [self.inventory()]

    @abc.abstractmethod
    def start(self, launch: Launch) -> dict[str, Any]:
        """Start one attempt and return a JSON-able handle. Must be safe to call again for the same
        (job, attempt) after a crash: it starts at most one supervisor per attempt."""

    @abc.abstractmethod
    def handle_for(self, job_id: str, attempt: int) -> dict[str, Any]:
        """The handle of an attempt whose ``start`` may or may not have completed (crash recovery)."""

    @abc.abstractmethod
    def poll(self, handle: dict[str, Any]) -> AttemptStatus:
        """Where the attempt is now."""

    @abc.abstractmethod
    def cancel(self, handle: dict[str, Any], grace_seconds: float) -> None:
        """Ask the attempt to stop (SIGTERM, then SIGKILL after the grace period). Idempotent."""

    def preempt(self, handle: dict[str, Any], reason: str, grace_seconds: float) -> None:
        """Ask the attempt to stop because a higher-priority job needs its resources: warn it (the file named by
        $KILN_NOTICE_FILE, where the backend has one), SIGTERM, SIGKILL after the grace. Idempotent. Backends
        without a notice channel just cancel."""
        self.cancel(handle, grace_seconds)

    def sync_checkpoints(self, job_id: str, dest_prefix: str) -> tuple[int, int]:
        """Copy what changed in the job's $KILN_CHECKPOINT_DIR since the last call into the store under
        ``dest_prefix`` (while it runs, and when an attempt ends), so checkpoints survive the machine. Returns
        (files, bytes) copied. Backends whose jobs write checkpoints to the store themselves copy nothing."""
        return 0, 0

    @abc.abstractmethod
    def collect_outputs(self, handle: dict[str, Any], dest_prefix: str) -> tuple[int, int]:
        """Copy what the attempt wrote to $KILN_OUTPUT_DIR into the artifact store. Idempotent.
        Returns (files, bytes)."""

    @abc.abstractmethod
    def cleanup(self, handle: dict[str, Any]) -> None:
        """Release what the attempt left behind (processes of a lost attempt, scratch files)."""

    def release(self, job_id: str, keep: bool) -> None:  # noqa: B027 - optional hook
        """The job has ended and its outputs and checkpoints are in the store: free its local files, now or
        (``keep``: it failed) once the platform's retention for debugging has passed."""

    def sweep(self) -> None:  # noqa: B027 - optional hook
        """Housekeeping (about once a minute): free what ``release`` kept once its retention has passed."""

    def validate(self, spec: JobSpec) -> None:  # noqa: B027 - optional hook
        """Refuse at submit (InvalidInput) what this backend can never run, e.g. an image on a process executor."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Stop background threads."""

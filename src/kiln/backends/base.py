"""The backend contract every executor implements.

Contract for all methods: return fast (never wait for a job to finish); ``cancel`` is idempotent; raise
``BackendError(retryable=True)`` for "not yet, try again" and ``BackendError(retryable=False)`` for failures that
no retry fixes. Optional capabilities are the mixins of :mod:`kiln.backends.capabilities`, which a backend
declares by inheriting them and callers check with ``isinstance``; backends are found by name in
:mod:`kiln.backends.registry` and built with :meth:`Backend.from_settings`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Self

from kiln.domain.spec import JobSpec

if TYPE_CHECKING:
    from kiln.domain.catalog import Catalog
    from kiln.settings import Settings
    from kiln.storage.logs import LogStore
    from kiln.storage.store import ObjectStore


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
    # The launch the job's row records for this attempt (its handle's "launch"): the backend's supervisor
    # records it as well, so what runs (or ran) is known to be the launch the row expects.
    launch_id: str | None = None
    # The handle the job's row records for this attempt (committed with STARTING): where the attempt runs, for a
    # backend whose handle names a place (the local executor's attempt directory, which may be in another
    # server's home on this machine). A start by any server launches it there, so that two starts of one attempt
    # meet at one place and run it once.
    handle: dict[str, Any] | None = None


class Phase(StrEnum):
    STARTING = "starting"  # accepted, preparing (code, runtime, prepare_command)
    RUNNING = "running"  # the command runs
    EXITED = "exited"  # the attempt ended and left a record
    LOST = "lost"  # the attempt vanished without a record
    # Nothing of the attempt was ever launched (a server stopped between recording the start and making it, or
    # the start raised): the reconciler launches it again, under the same attempt, if the job still wants it.
    UNLAUNCHED = "unlaunched"


@dataclass(frozen=True)
class AttemptStatus:
    phase: Phase
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    running_at: datetime | None = None
    finished_at: datetime | None = None
    # Seconds of its start spent on a shared runtime's build (the platform's cost): its hold is not billed for them.
    unbilled_seconds: float = 0.0


@dataclass(frozen=True)
class BackendDeps:
    """What the server gives a backend it builds from settings (:meth:`Backend.from_settings`)."""

    settings: Settings
    store: ObjectStore
    logs: LogStore
    catalog: Catalog
    wake: Callable[[str | None], None] | None = None  # wake the reconciler for a job (None: every job)
    metrics_ready: Callable[[str], None] | None = None  # a job wrote points of a watched metric: read them now


class Backend(abc.ABC):
    """An executor of job attempts."""

    name: str = "abstract"
    # How many attempts the reconciler may start at once (``scheduler.starter``): more than one where a start is a
    # round trip to a remote scheduler (an ``sbatch``), so a burst's submissions do not wait on each other.
    start_concurrency: int = 1

    @classmethod
    def from_settings(cls, deps: BackendDeps) -> Self:
        """The backend as the server's settings configure it (what the registry calls)."""
        raise NotImplementedError(f"{cls.__name__} cannot be built from settings: it is not a registered backend")

    @abc.abstractmethod
    def inventory(self) -> Inventory:
        """Total allocatable resources (of the first node, for backends with several)."""

    def nodes(self) -> list[Inventory]:
        """Every node the scheduler may place on; one for a single-machine backend."""
        return [self.inventory()]

    @abc.abstractmethod
    def start(self, launch: Launch) -> dict[str, Any]:
        """Start one attempt and return a JSON-able handle. Must be safe to call again for the same
        (job, attempt) after a crash, or while an earlier call's launch is still coming up: across all the calls
        at most one supervisor per attempt ever runs the job's command, and a call that finds the attempt
        launched (or ended) adopts it."""

    @abc.abstractmethod
    def handle_for(self, job_id: str, attempt: int) -> dict[str, Any]:
        """The handle of an attempt whose ``start`` may or may not have completed (crash recovery)."""

    @abc.abstractmethod
    def poll(self, handle: dict[str, Any]) -> AttemptStatus:
        """Where the attempt is now. ``Phase.UNLAUNCHED`` only when nothing of it was launched and nothing can
        still come up by itself (the reconciler then calls ``start`` again); a launch still coming up is
        ``STARTING``."""

    @abc.abstractmethod
    def cancel(self, handle: dict[str, Any], grace_seconds: float) -> None:
        """Ask the attempt to stop (SIGTERM, then SIGKILL after the grace period). Idempotent. An attempt not
        launched yet is ended so that no later launch runs it (its status then reads EXITED, Cancelled)."""

    @abc.abstractmethod
    def cleanup(self, handle: dict[str, Any]) -> None:
        """Release what the attempt left behind (processes of a lost attempt, scratch files)."""

    def close(self) -> None:  # noqa: B027 - a lifecycle hook, not a capability: most backends hold threads
        """Stop background threads (nothing to stop by default)."""

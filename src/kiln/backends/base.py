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
    """What a backend can allocate in total."""

    cpus: float
    memory: int
    gpus: tuple[int, ...] = ()
    gpu_names: dict[int, str] = field(default_factory=dict)


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

    @abc.abstractmethod
    def inventory(self) -> Inventory:
        """Total allocatable resources."""

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

    @abc.abstractmethod
    def collect_outputs(self, handle: dict[str, Any], dest_prefix: str) -> tuple[int, int]:
        """Copy what the attempt wrote to $KILN_OUTPUT_DIR into the artifact store. Idempotent.
        Returns (files, bytes)."""

    @abc.abstractmethod
    def cleanup(self, handle: dict[str, Any]) -> None:
        """Release what the attempt left behind (processes of a lost attempt, scratch files)."""

    def validate(self, spec: JobSpec) -> None:  # noqa: B027 - optional hook
        """Refuse at submit (InvalidInput) what this backend can never run, e.g. an image on a process executor."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Stop background threads."""

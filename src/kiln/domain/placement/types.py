"""The values the placement decision works on and returns (policy.py decides; packing.py and fairshare.py help):
nodes, waiting and running jobs, workers, waits, placements and the decision. Plain frozen dataclasses, shared by
the three modules without importing one another in a circle. Pure, no I/O.

Resources are integers in their smallest unit: CPUs in millicores (``kiln.domain.quantities.millicores``), memory
in bytes. The callers convert at the edge (usecases.scheduler_inputs); messages show CPUs as users write them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

PRIORITY = {"low": 0, "normal": 1, "high": 2}
PRIORITY_NAMES = {value: name for name, value in PRIORITY.items()}


def priority_name(priority: int) -> str:
    return PRIORITY_NAMES.get(priority, str(priority))


@dataclass(frozen=True)
class Node:
    """One machine (the local executor has one; Kubernetes many)."""

    name: str
    millicores: int  # CPUs * 1000
    memory: int  # bytes
    gpus: tuple[int, ...] = ()  # device indices
    gpu_types: Mapping[int, str] = field(default_factory=dict)  # index -> model, e.g. "H200"
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkerAlloc:
    node: str
    millicores: int
    memory: int | None
    gpus: tuple[int, ...]

    @property
    def cpus(self) -> float:
        """The CPUs as the backend's slot and the stored allocation take them (the edge out of the policy)."""
        return self.millicores / 1000


@dataclass(frozen=True)
class Pending:
    """A QUEUED (or restarting) job."""

    job_id: str
    org_id: str
    org_name: str
    category: str  # train|serve|dev (quota category)
    priority: int  # PRIORITY value
    submitted: float  # epoch seconds; FIFO order within (priority, org)
    workers: int = 1  # gang size: all placed at once or none
    millicores: int = 1000  # per worker
    memory: int | None = None  # per worker
    gpus: int = 0  # per worker
    gpu_type: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    timeout: float | None = None  # the job's wall-clock limit (for backfill: it surely ends by then)


@dataclass(frozen=True)
class Running:
    """A STARTING/RUNNING job holding resources."""

    job_id: str
    org_id: str
    category: str
    priority: int
    workers: tuple[WorkerAlloc, ...]
    started: float
    deadline: float | None = None  # when its timeout kills it, if it has one
    preempting: bool = False  # a preemption was already requested; its resources free soon
    # It was started on resources reserved for this waiting job while that job's start was unknown (backfill):
    # that job takes them back, preempting it, once it can start (policy.py).
    backfill_for: str | None = None
    service: str | None = None  # the model service it is a replica of (its name), for the reasons


@dataclass(frozen=True)
class Wait:
    kind: str  # quota | capacity | gang | priority | reservation | preempting (| selector | fairshare: unused)
    message: str  # starts with "<kind>: "
    position: int  # 1-based among the waiting jobs in scheduling order
    ahead: tuple[str, ...] = ()  # up to 5 job ids that hold it back


@dataclass(frozen=True)
class Placement:
    job_id: str
    workers: tuple[WorkerAlloc, ...]
    # Set when it starts on resources reserved for this job, whose start is unknown: recorded with its
    # allocation, it is then Running.backfill_for, and that job may preempt it once it can start.
    backfill_for: str | None = None


@dataclass
class Decision:
    placements: list[Placement] = field(default_factory=list)
    preemptions: dict[str, str] = field(default_factory=dict)  # victim job id -> reason
    waiting: dict[str, Wait] = field(default_factory=dict)
    unschedulable: dict[str, str] = field(default_factory=dict)  # job id -> why it can never run here
    reservation: str | None = None  # the first job (in scheduling order) holding earmarked resources
    reserved: list[str] = field(default_factory=list)  # every job holding earmarked resources, in order

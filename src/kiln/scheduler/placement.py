"""The placement decision: which queued jobs start now, on what. Pure: no database, no processes.

Policy (until priorities and fair share arrive): strict FIFO on capacity. The oldest waiting job that does not
fit the free capacity holds the queue so that a stream of small jobs can never starve a large one; a job that
could never fit on the whole inventory is reported as unschedulable instead of holding the queue. A job held
back by its organisation's quota waits without holding the queue: one team's quota never stalls another team.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from kiln.backends.base import Inventory
from kiln.domain.quantities import format_memory
from kiln.domain.quota import Limits, OrgUsage
from kiln.domain.quota import blocked_by as quota_blocked_by


@dataclass(frozen=True)
class Request:
    job_id: str
    cpus: float
    memory: int | None
    gpus: int
    org_id: str = ""
    org_name: str = ""
    category: str = "train"


@dataclass(frozen=True)
class Held:
    """Resources already allocated to an active job."""

    cpus: float
    memory: int | None
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class Placement:
    job_id: str
    cpus: float
    memory: int | None
    gpus: tuple[int, ...]


@dataclass
class Decision:
    placements: list[Placement] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)  # job id → why it waits
    unschedulable: dict[str, str] = field(default_factory=dict)  # job id → why it can never run


def never_fits(req: Request, inv: Inventory) -> str | None:
    if req.cpus > inv.cpus + 1e-9:
        return f"asks {req.cpus:g} CPUs; this backend has {inv.cpus:g} in all"
    if req.memory is not None and req.memory > inv.memory:
        return f"asks {format_memory(req.memory)} memory; this backend has {format_memory(inv.memory)} in all"
    if req.gpus > len(inv.gpus):
        return f"asks {req.gpus} GPUs; this backend has {len(inv.gpus)} in all"
    return None


def decide(
    queue: list[Request],
    inventory: Inventory,
    held: list[Held],
    limits: dict[str, dict[str, Limits]] | None = None,
    usage: dict[str, OrgUsage] | None = None,
) -> Decision:
    """Place jobs from ``queue`` (oldest first) on what ``held`` leaves free of ``inventory``, within each
    organisation's quota ``limits`` given its current ``usage`` (both keyed by organisation id)."""
    limits = limits or {}
    usage = copy.deepcopy(usage or {})  # placements add to it; the caller's stays as it was
    free_cpus = inventory.cpus - sum(h.cpus for h in held)
    free_mem = inventory.memory - sum(h.memory or 0 for h in held)
    used_gpus = {g for h in held for g in h.gpus}
    free_gpus = sorted(g for g in inventory.gpus if g not in used_gpus)
    decision = Decision()
    blocked_by: str | None = None
    position = 0
    for req in queue:
        impossible = never_fits(req, inventory)
        if impossible:
            decision.unschedulable[req.job_id] = impossible
            continue
        org_limits = limits.get(req.org_id)
        if org_limits:
            org_usage = usage.setdefault(req.org_id, OrgUsage())
            why = quota_blocked_by(
                req.org_name or req.org_id, req.category, org_limits, org_usage, req.gpus, req.cpus, req.memory
            )
            if why:
                decision.waiting[req.job_id] = why
                continue
        position += 1
        if blocked_by is not None:
            decision.waiting[req.job_id] = f"queued: position {position}, behind {blocked_by}"
            continue
        short = []
        if req.cpus > free_cpus + 1e-9:
            short.append(f"CPUs {req.cpus:g} asked, {max(free_cpus, 0):g} free")
        if req.memory is not None and req.memory > free_mem:
            short.append(f"memory {format_memory(req.memory)} asked, {format_memory(max(free_mem, 0))} free")
        if req.gpus > len(free_gpus):
            short.append(f"GPUs {req.gpus} asked, {len(free_gpus)} free")
        if short:
            decision.waiting[req.job_id] = "capacity: " + "; ".join(short)
            blocked_by = req.job_id
            continue
        gpus = tuple(free_gpus[: req.gpus])  # lowest indices first keeps free GPUs together
        free_gpus = free_gpus[req.gpus :]
        free_cpus -= req.cpus
        free_mem -= req.memory or 0
        decision.placements.append(Placement(req.job_id, req.cpus, req.memory, gpus))
        usage.setdefault(req.org_id, OrgUsage()).add(req.category, req.gpus, req.cpus, req.memory)
        position -= 1
    return decision

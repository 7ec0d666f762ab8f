"""Builders shared by the policy tests: short ways to write nodes, waiting and running jobs. They take CPUs as
people write them (``cpus=0.5``) and give the policy millicores, as services.scheduler_inputs does."""

from __future__ import annotations

from typing import Any

from kiln.domain.placement.types import PRIORITY, Decision, Node, Pending, Running, WorkerAlloc
from kiln.domain.quantities import millicores

GI = 1024**3
NOW = 1_000_000.0


def node(name: str = "n1", cpus: float = 64, memory: int = 512 * GI, gpus: int = 0, **kw: Any) -> Node:
    gpu_type = kw.pop("gpu_type", None)
    indices = tuple(range(gpus))
    types = {i: gpu_type for i in indices} if gpu_type else {}
    return Node(name, millicores(cpus), memory, indices, types, kw.pop("labels", {}))


def job(
    job_id: str,
    org: str = "acme",
    priority: str = "normal",
    submitted: float | None = None,
    **kw: Any,
) -> Pending:
    return Pending(
        job_id,
        org_id=org,
        org_name=org,
        category=kw.pop("category", "train"),
        priority=PRIORITY[priority],
        submitted=submitted if submitted is not None else NOW - 1000,
        millicores=millicores(kw.pop("cpus", 1)),
        **kw,
    )


def running(
    job_id: str,
    *workers: tuple[str, float, tuple[int, ...]],
    org: str = "other",
    priority: str = "low",
    started: float = NOW - 100,
    memory: int | None = None,
    **kw: Any,
) -> Running:
    """``workers``: (node, cpus, gpus) per worker."""
    allocs = tuple(WorkerAlloc(n, millicores(c), memory, g) for n, c, g in workers)
    return Running(job_id, org, kw.pop("category", "train"), PRIORITY[priority], allocs, started, **kw)


def placed(decision: Decision) -> dict[str, tuple[WorkerAlloc, ...]]:
    return {p.job_id: p.workers for p in decision.placements}


def kinds(decision: Decision) -> dict[str, str]:
    return {job_id: wait.kind for job_id, wait in decision.waiting.items()}


def check_waits(decision: Decision) -> None:
    """Invariants every decision keeps: each Wait message starts with its kind, positions are 1..n."""
    for wait in decision.waiting.values():
        assert wait.message.startswith(wait.kind + ": "), wait
        assert len(wait.ahead) <= 5
    assert sorted(w.position for w in decision.waiting.values()) == list(range(1, len(decision.waiting) + 1))
    ids = set(placed(decision))
    assert not ids & set(decision.waiting)
    assert not ids & set(decision.unschedulable)
    assert not set(decision.waiting) & set(decision.unschedulable)

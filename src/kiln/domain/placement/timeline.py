"""When and where a waiting job can start as the running jobs end (policy.py's reservation), and which of them it
waits for. Pure, no I/O.

The running jobs' ends are taken in order: by deadline (or, for the jobs that borrowed from this job while its
start was unknown, at once when preemption gives it back what they took); then, with no end in sight, its
borrowers (preemption off), then every other job. Where it first fits, with what those jobs give back added to
what is free now, is its plan; the time is its earliest start, unknown (None) when a job with no end stands in
the way. Which kind of job with no end stands in the way says whether jobs behind it may borrow (``lend``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kiln.domain.placement.packing import V_SOON, NodeState, Res, Shape, fit
from kiln.domain.placement.types import Pending, Running, WorkerAlloc

# How a job's end counts: by a deadline (or given back at once), then, with no end in sight, a job that borrowed
# from the waiting job (preemption off), then any other.
ENDS, BORROWED, ENDLESS = 0, 1, 2

Released = tuple[str, int, WorkerAlloc]  # (job id, node index, worker)


@dataclass
class Timeline:
    plan: list[tuple[NodeState, tuple[int, ...]]] | None  # where it fits once ``released`` ended; None: nowhere
    start: float | None  # when, if known
    lend: bool  # unknown for want of a job with no end that did not borrow from it: jobs behind it may borrow
    extra: dict[int, Res] = field(default_factory=dict)  # node index -> what the released jobs give back
    released: list[Released] = field(default_factory=list)  # in the order they end


def earliest(
    job: Pending,
    shape: Shape,
    nodes: Sequence[NodeState],
    by_name: Mapping[str, NodeState],
    running: Sequence[Running],
    placed: Sequence[tuple[Pending, list[tuple[NodeState, tuple[int, ...]]]]],
    *,
    now: float,
    preemption: bool,
) -> Timeline:
    """Where and when ``job`` fits on ``nodes`` (V_SOON: what is free and what preempted jobs give back, plus
    what ``running`` and the jobs ``placed`` by this decision give back as they end). ``running``: the jobs that
    hold resources it could use (not those already being preempted or preempted now for another job)."""
    where = {n.index for n in nodes}
    events: list[tuple[float, int, str, NodeState, WorkerAlloc]] = []
    for r in running:
        if r.backfill_for == job.job_id:
            end, tier = (now, ENDS) if preemption else (r.deadline or math.inf, BORROWED)
        else:
            end, tier = (r.deadline, ENDS) if r.deadline is not None else (math.inf, ENDLESS)
        for w in r.workers:
            node = by_name.get(w.node)
            if node is not None and node.index in where:
                events.append((end, tier if end == math.inf else ENDS, r.job_id, node, w))
    for p, plan in placed:
        end, tier = (now + p.timeout, ENDS) if p.timeout is not None else (math.inf, ENDLESS)
        for node, gpus in plan:
            if node.index in where:
                events.append((end, tier, p.job_id, node, WorkerAlloc(node.name, p.millicores, p.memory, gpus)))
    events.sort(key=lambda e: (e[0], e[1], e[2], e[3].index))
    out = Timeline(None, None, False)
    start, tier = now, ENDS
    i = 0
    while i < len(events):
        start, tier = events[i][0], events[i][1]
        while i < len(events) and events[i][:2] == (start, tier):
            _, _, job_id, node, w = events[i]
            out.extra.setdefault(node.index, Res()).add(w.millicores, w.memory or 0, w.gpus)
            out.released.append((job_id, node.index, w))
            i += 1
        result = fit(nodes, shape, V_SOON, out.extra)
        if isinstance(result, list):
            out.plan = result
            break
    if out.plan is not None:
        out.start = start if start < math.inf else None
        out.lend = out.start is None and tier == ENDLESS
    return out


def givers(back: Mapping[int, Res], released: Sequence[Released]) -> list[str]:
    """Which of the ``released`` (job id, node index, worker) give back ``back`` (per node index): those whose GPUs
    it is, then, in their order, those whose CPUs and memory cover the rest. ``back`` is used up."""
    waits: dict[str, None] = {}
    for job_id, index, w in released:
        res = back.get(index)
        if res is not None and res.gpus.intersection(w.gpus):
            waits[job_id] = None
            res.cpus -= w.millicores
            res.memory -= w.memory or 0
    for job_id, index, w in released:
        res = back.get(index)
        if res is not None and job_id not in waits and (res.cpus > 0 or res.memory > 0):
            waits[job_id] = None
            res.cpus -= w.millicores
            res.memory -= w.memory or 0
    return list(waits)

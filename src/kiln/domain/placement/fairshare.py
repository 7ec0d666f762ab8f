"""Scheduling order: priority classes highest first; within a class, weighted dominant-resource fair share
between organisations. Pure, no I/O.

An organisation's dominant share is the largest of its GPUs, CPUs and memory in use divided by the cluster's
total of each, divided by its weight (default 1). Within a class the next job is always the oldest one (by
``submitted``, then job id) of the organisation with the lowest share, and that job's demand is added to the
organisation's share before the next pick. So the order interleaves organisations however fast each submits,
and an organisation that already holds much of the cluster comes after those that hold little. Ties go to the
organisation whose next job is the oldest (plain FIFO when nobody runs anything).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

from kiln.domain.placement.types import Pending, Running

MIN_WEIGHT = 1e-9  # a weight of 0 (or less) puts the organisation last, not nowhere


class Shares:
    """Dominant shares of organisations against cluster totals, updated as demand is added."""

    def __init__(
        self, totals: tuple[float, float, float], running: Sequence[Running], weights: Mapping[str, float]
    ) -> None:
        gpus, cpus, memory = totals
        # Multipliers (1/total, 0 for a resource the cluster has none of) avoid divisions in the loop.
        self.inv = (1.0 / gpus if gpus else 0.0, 1.0 / cpus if cpus else 0.0, 1.0 / memory if memory else 0.0)
        self.weights = weights
        self.used: dict[str, list[float]] = {}
        for job in running:
            use = self.used.setdefault(job.org_id, [0.0, 0.0, 0.0])
            for w in job.workers:
                use[0] += len(w.gpus)
                use[1] += w.millicores
                use[2] += w.memory or 0

    def share(self, org_id: str) -> float:
        use = self.used.get(org_id)
        if use is None:
            return 0.0
        inv = self.inv
        dominant = max(use[0] * inv[0], use[1] * inv[1], use[2] * inv[2])
        return dominant / max(self.weights.get(org_id, 1.0), MIN_WEIGHT)

    def add(self, org_id: str, job: Pending) -> None:
        use = self.used.setdefault(org_id, [0.0, 0.0, 0.0])
        use[0] += job.gpus * job.workers
        use[1] += job.millicores * job.workers
        use[2] += (job.memory or 0) * job.workers


def fair_order(
    jobs: Sequence[Pending],
    totals: tuple[float, float, float],
    running: Sequence[Running] = (),
    weights: Mapping[str, float] | None = None,
) -> list[Pending]:
    """``jobs`` in scheduling order (see the module's docstring). ``totals``: cluster GPUs, CPUs, memory."""
    shares = Shares(totals, running, weights or {})
    classes: dict[int, dict[str, list[Pending]]] = {}
    for job in jobs:
        classes.setdefault(job.priority, {}).setdefault(job.org_id, []).append(job)
    order: list[Pending] = []
    for priority in sorted(classes, reverse=True):
        queues = classes[priority]
        heap: list[tuple[float, float, str, str, int]] = []
        for org_id, queue in queues.items():
            queue.sort(key=lambda j: (j.submitted, j.job_id))
            head = queue[0]
            heap.append((shares.share(org_id), head.submitted, head.job_id, org_id, 0))
        heapq.heapify(heap)
        while heap:
            _, _, _, org_id, i = heapq.heappop(heap)
            queue = queues[org_id]
            job = queue[i]
            order.append(job)
            shares.add(org_id, job)
            i += 1
            if i < len(queue):
                head = queue[i]
                heapq.heappush(heap, (shares.share(org_id), head.submitted, head.job_id, org_id, i))
    return order

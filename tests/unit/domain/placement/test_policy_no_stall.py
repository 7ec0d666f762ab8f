"""The backfill property, over many seeded random workloads (policy.decide): no job waits while it fits now and
the only jobs ahead of it cannot start before every running job ends, i.e. where the start of the job it would
wait for is unknown, or that start is not delayed by it. Checked against an independent count of what is free,
not the policy's own layers."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest

from kiln.domain.placement.policy import SLACK, decide
from kiln.domain.placement.types import PRIORITY, Decision, Node, Pending, Running, WorkerAlloc
from kiln.domain.quota import Limits

from .policy_helpers import GI, NOW, check_waits

CASES = 400


def _nodes(rng: random.Random) -> list[Node]:
    out = []
    for i in range(rng.randint(1, 3)):
        gpus = tuple(range(rng.choice((0, 2, 4))))
        out.append(
            Node(
                f"n{i}",
                rng.choice((2000, 4000, 8000)),
                rng.choice((8, 16)) * GI,
                gpus,
                dict.fromkeys(gpus, rng.choice(("H200", "T4"))),
                {"zone": rng.choice("ab")},
            )
        )
    return out


def _running(rng: random.Random, nodes: list[Node], deadlines: bool) -> list[Running]:
    """Jobs that hold resources, never more than a node has; of the highest class, so nobody can preempt them."""
    free = {n.name: [n.millicores, n.memory, set(n.gpus)] for n in nodes}
    out = []
    for i in range(rng.randint(0, 6)):
        node = rng.choice(nodes)
        room = free[node.name]
        cpus = rng.choice((250, 500, 1000, 1500))
        memory = rng.choice((0, GI, 4 * GI))
        gpus = tuple(sorted(rng.sample(sorted(room[2]), k=min(len(room[2]), rng.choice((0, 0, 1, 2))))))
        if cpus > room[0] or memory > room[1]:
            continue
        room[0] -= cpus
        room[1] -= memory
        room[2] -= set(gpus)
        deadline = NOW + rng.choice((10.0, 100.0, 1000.0)) if deadlines and rng.random() < 0.6 else None
        alloc = WorkerAlloc(node.name, cpus, memory or None, gpus)
        out.append(Running(f"r{i}", f"o{rng.randrange(2)}", "train", PRIORITY["high"], (alloc,), NOW - 10, deadline))
    return out


def _pending(rng: random.Random, timeouts: bool, one_org: bool) -> list[Pending]:
    return [
        Pending(
            f"p{i:02d}",
            "o0" if one_org else f"o{rng.randrange(3)}",
            "o",
            "train",
            rng.choice((PRIORITY["low"], PRIORITY["normal"], PRIORITY["high"])),
            NOW - 100 + rng.uniform(0, 50),
            workers=rng.choice((1, 1, 1, 2)),
            millicores=rng.choice((100, 250, 500, 1000, 2000, 4000)),
            memory=rng.choice((None, GI, 4 * GI)),
            gpus=rng.choice((0, 0, 1, 2)),
            gpu_type=rng.choice((None, None, "H200", "T4")),
            node_selector=rng.choice(({}, {}, {"zone": "a"})),
            timeout=rng.choice((None, 5.0, 50.0, 500.0)) if timeouts else None,
        )
        for i in range(rng.randint(1, 14))
    ]


# -- an independent count of what is free --------------------------------------------------------------------


def _free(nodes: Sequence[Node], held: Sequence[WorkerAlloc]) -> dict[str, list]:  # type: ignore[type-arg]
    free = {n.name: [n.millicores, n.memory, set(n.gpus)] for n in nodes}
    for w in held:
        room = free[w.node]
        room[0] -= w.millicores
        room[1] -= w.memory or 0
        room[2] -= set(w.gpus)
    return free


def _fits(job: Pending, nodes: Sequence[Node], free: dict[str, list]) -> bool:  # type: ignore[type-arg]
    """Could the whole gang be placed on what is ``free``? Workers are identical, so per node it is the least of
    free / asked over the resources; the gang fits when the nodes together hold all its workers."""
    room = 0
    for n in nodes:
        if any(n.labels.get(k) != v for k, v in job.node_selector.items()):
            continue
        cpus, memory, gpus = free[n.name]
        typed = [g for g in gpus if job.gpu_type is None or not job.gpus or n.gpu_types.get(g) == job.gpu_type]
        counts = [cpus // job.millicores]
        if job.memory:
            counts.append(memory // job.memory)
        if job.gpus:
            counts.append(len(typed) // job.gpus)
        room += max(min(counts), 0)
    return room >= job.workers


def _earliest_start(
    holder: Pending, nodes: Sequence[Node], running: Sequence[Running], ahead: Sequence[tuple[WorkerAlloc, float]]
) -> float:
    """When ``holder`` fits at the earliest as the running jobs end (by their deadlines) and the jobs placed
    ahead of it end (by their timeouts); inf when only jobs with no end stand in the way."""
    ends = sorted({r.deadline for r in running if r.deadline is not None} | {e for _, e in ahead if e < math.inf})
    for t in [NOW, *ends, math.inf]:
        held = [w for r in running if r.deadline is None or r.deadline > t for w in r.workers]
        held += [w for w, end in ahead if end > t]
        if _fits(holder, nodes, _free(nodes, held)):
            return t
    return math.inf  # (not reached: it fits on empty nodes, or it would be unschedulable)


def _order_key(job: Pending) -> tuple[int, float, str]:
    return (-job.priority, job.submitted, job.job_id)  # one organisation: priority, then FIFO


def _held_back(decision: Decision) -> list[str]:
    return [i for i, w in decision.waiting.items() if w.kind in ("reservation", "priority")]


# -- the properties ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(CASES))
def test_no_job_waits_behind_a_job_whose_start_is_unknown(seed: int) -> None:
    """Nothing has an end (services, notebooks, jobs without a timeout): then no job ahead of another can start
    before every running job ends, and every job that fits what is free after the decision must have started."""
    rng = random.Random(seed)
    nodes = _nodes(rng)
    running = _running(rng, nodes, deadlines=False)
    pending = _pending(rng, timeouts=False, one_org=False)
    limits = {"o1": {"train": Limits(millicores=2000)}} if rng.random() < 0.3 else {}
    decision = decide(pending, nodes, running, limits=limits, now=NOW, preemption=seed % 2 == 0)
    check_waits(decision)
    assert decision.preemptions == {}
    held = [w for r in running for w in r.workers] + [w for p in decision.placements for w in p.workers]
    free = _free(nodes, held)
    for p in pending:
        wait = decision.waiting.get(p.job_id)
        if wait is None or wait.kind == "quota":
            continue
        assert not _fits(p, nodes, free), (p, wait)
    assert _held_back(decision) == []


@pytest.mark.parametrize("seed", range(CASES))
def test_a_job_held_back_would_delay_a_job_with_a_known_start(seed: int) -> None:
    """With deadlines and timeouts: a job that fits what is free and still waits is held back by the reserved
    job, whose start is known, and would end after that start (or never): it could delay it. Every other waiting
    job does not fit what is free."""
    rng = random.Random(10_000 + seed)
    nodes = _nodes(rng)
    running = _running(rng, nodes, deadlines=True)
    pending = _pending(rng, timeouts=True, one_org=True)
    decision = decide(pending, nodes, running, now=NOW, preemption=seed % 2 == 0)
    check_waits(decision)
    by_id = {p.job_id: p for p in pending}
    held = [w for r in running for w in r.workers] + [w for p in decision.placements for w in p.workers]
    free = _free(nodes, held)
    for job_id, wait in decision.waiting.items():
        if wait.kind not in ("reservation", "priority"):
            assert not _fits(by_id[job_id], nodes, free), wait
    held_back = _held_back(decision)
    if not held_back:
        return
    reserved = by_id[decision.reservation or ""]
    ahead = [
        (w, NOW + by_id[p.job_id].timeout if by_id[p.job_id].timeout is not None else math.inf)  # type: ignore[operator]
        for p in decision.placements
        if _order_key(by_id[p.job_id]) < _order_key(reserved)
        for w in p.workers
    ]
    start = _earliest_start(reserved, nodes, running, ahead)
    assert start < math.inf, (reserved, held_back)
    for job_id in held_back:
        job = by_id[job_id]
        assert decision.waiting[job_id].ahead[0] == reserved.job_id
        assert job.timeout is None or NOW + job.timeout > start + SLACK, (job, start)


def test_the_properties_saw_both_kinds_of_case() -> None:
    """The generators reach what the properties are about: jobs held back, and borrowers."""
    held = borrowed = 0
    for seed in range(CASES):
        rng = random.Random(10_000 + seed)
        nodes = _nodes(rng)
        decision = decide(_pending(rng, True, True), nodes, _running(rng, nodes, True), now=NOW)
        held += bool(_held_back(decision))
        rng = random.Random(seed)
        nodes = _nodes(rng)
        running = _running(rng, nodes, deadlines=False)
        decision = decide(_pending(rng, False, False), nodes, running, now=NOW)
        borrowed += any(p.backfill_for for p in decision.placements)
    assert held > CASES // 20 and borrowed > CASES // 20, (held, borrowed)

"""policy.decide on random workloads: the invariants every decision keeps."""

from __future__ import annotations

import random

import pytest

from kiln.domain.placement.policy import decide
from kiln.domain.placement.types import PRIORITY, Node, Pending, Running, WorkerAlloc
from kiln.domain.quota import Limits

from .policy_helpers import GI, NOW, check_waits


def workload(seed: int) -> tuple[list[Pending], list[Node], list[Running], dict[str, dict[str, Limits]]]:
    rng = random.Random(seed)
    nodes = [
        Node(
            f"n{i}",
            rng.choice((8, 16, 32)) * 1000,
            rng.choice((32, 64)) * GI,
            tuple(range(rng.choice((0, 2, 4, 8)))),
            {},
            {"zone": rng.choice("ab")},
        )
        for i in range(rng.randint(1, 4))
    ]
    nodes = [
        Node(n.name, n.millicores, n.memory, n.gpus, dict.fromkeys(n.gpus, rng.choice(("H200", "T4"))), n.labels)
        for n in nodes
    ]
    running: list[Running] = []
    for i in range(rng.randint(0, 8)):
        node = rng.choice(nodes)
        gpus = tuple(
            g
            for g in node.gpus
            if rng.random() < 0.3 and all(g not in w.gpus for r in running for w in r.workers if w.node == node.name)
        )
        running.append(
            Running(
                f"r{i}",
                f"o{rng.randrange(3)}",
                "train",
                rng.choice(list(PRIORITY.values())),
                (WorkerAlloc(node.name, rng.choice((1000, 2000)), GI, gpus),),
                NOW - rng.uniform(1, 1000),
                NOW + rng.uniform(10, 1000) if rng.random() < 0.5 else None,
                rng.random() < 0.15,
                backfill_for=f"p{rng.randrange(25):02d}" if rng.random() < 0.3 else None,  # borrowed from a waiting job
            )
        )
    pending = [
        Pending(
            f"p{i:02d}",
            f"o{rng.randrange(3)}",
            f"o{i % 3}",
            "train",
            rng.choice(list(PRIORITY.values())),
            NOW - rng.uniform(0, 100),
            workers=rng.choice((1, 1, 1, 2, 3)),
            millicores=rng.choice((1000, 2000, 4000)),
            memory=rng.choice((None, 4 * GI, 16 * GI)),
            gpus=rng.choice((0, 0, 1, 2, 4)),
            gpu_type=rng.choice((None, None, "H200", "T4", "A100")),
            node_selector=rng.choice(({}, {}, {"zone": "a"})),
            timeout=rng.choice((None, 50.0, 500.0)),
        )
        for i in range(rng.randint(0, 25))
    ]
    limits = {"o0": {"train": Limits(gpus=4, millicores=8000)}} if rng.random() < 0.5 else {}
    return pending, nodes, running, limits


@pytest.mark.parametrize("seed", range(300))
def test_invariants(seed: int) -> None:
    pending, nodes, running, limits = workload(seed)
    preemption = seed % 2 == 0
    decision = decide(pending, nodes, running, limits=limits, usage={}, now=NOW, preemption=preemption)
    check_waits(decision)
    by_id = {p.job_id: p for p in pending}
    assert set(decision.waiting) | set(decision.unschedulable) | {p.job_id for p in decision.placements} == set(by_id)
    # nothing is over-committed: running (less nothing: victims still hold theirs) plus placements fit each node
    cpus = {n.name: n.millicores for n in nodes}
    memory = {n.name: n.memory for n in nodes}
    gpus: dict[str, set[int]] = {n.name: set() for n in nodes}
    for r in running:
        for w in r.workers:
            if w.node in cpus:
                cpus[w.node] -= w.millicores
                memory[w.node] -= w.memory or 0
                gpus[w.node].update(w.gpus)
    for p in decision.placements:
        job = by_id[p.job_id]
        assert len(p.workers) == job.workers  # a gang whole
        for w in p.workers:
            node = next(n for n in nodes if n.name == w.node)
            assert all(node.labels.get(k) == v for k, v in job.node_selector.items())
            assert len(w.gpus) == job.gpus and not set(w.gpus) & gpus[w.node]
            assert all(g in node.gpus for g in w.gpus)
            if job.gpu_type and job.gpus:
                assert all(node.gpu_types[g] == job.gpu_type for g in w.gpus)
            gpus[w.node].update(w.gpus)
            cpus[w.node] -= w.millicores
            memory[w.node] -= w.memory or 0
    for n in nodes:
        held = [w for r in running for w in r.workers if w.node == n.name]
        assert cpus[n.name] >= min(n.millicores - sum(w.millicores for w in held), 0)
        assert memory[n.name] >= min(n.memory - sum(w.memory or 0 for w in held), 0)
    # victims: strictly lower priority than the job they are preempted for, or its borrowers; never already
    # preempting
    running_by_id = {r.job_id: r for r in running}
    if not preemption:
        assert decision.preemptions == {}
    for victim, why in decision.preemptions.items():
        r = running_by_id[victim]
        assert not r.preempting
        winner = by_id[why.split()[2].rstrip(":")]
        assert r.priority < winner.priority or (r.backfill_for == winner.job_id and r.priority <= winner.priority)
        assert decision.waiting[winner.job_id].kind == "preempting"
    # quota: what is placed stays within the limits
    for org, scopes in limits.items():
        placed = [by_id[p.job_id] for p in decision.placements if by_id[p.job_id].org_id == org]
        limit = scopes["train"]
        assert limit.gpus is None or sum(j.gpus * j.workers for j in placed) <= limit.gpus
    # deterministic
    again = decide(list(reversed(pending)), nodes, running, limits=limits, usage={}, now=NOW, preemption=preemption)
    assert again == decision

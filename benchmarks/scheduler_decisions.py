"""Scheduling decisions per second: the pure policy (kiln.domain.placement.policy.decide) against a FIFO baseline.

    .venv/bin/python benchmarks/scheduler_decisions.py [--jobs 10000] [--orgs 100] [--reps 5] [--json PATH]

Section ``decide`` (the decision function only, no database): one synthetic workload of N pending jobs from M
organisations (mixed priorities, about 5% gangs of 2-8 workers, about 40% GPU jobs, some with GPU types, node
selectors and timeouts, quotas on a third of the organisations, fair-share weights on a few), decided on

* local    one node like the local executor (64 CPUs, 512Gi, 8 GPUs), a few running jobs;
* cluster  16 nodes x 8 H200 GPUs (112 CPUs, 2Ti each, two zones), ~80 running jobs holding 3/4 of the
           GPUs, half with deadlines, 4 already being preempted; once without and once with preemption.

Each case times ``decide()`` R times after one warm-up and reports pending jobs decided per second (median run)
against the target >= 1,000/s. The baseline, measured in the same run on the same jobs and nodes, is the plain
policy it replaced (the FIFO placement of Kiln core, extended to several nodes): FIFO by submit time, never-fits
and quota checks, first fit per worker, the first job that does not fit holds the queue. The ratio (< 1) says
what the full policy (fair share, best fit, reservation and backfill, preemption, reasons) costs over that.

Sections ``loop`` (the reconcile loop's whole scheduling pass against SQLite, and PostgreSQL with ``--postgres``)
and ``handoff`` (a running job's exit to the next queued job RUNNING, on a real server) are in scheduler_loop.py.

The machine is shared and noisy: nothing is asserted, run it two or three times.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from report import finish, parse_args, print_table  # noqa: E402
from scheduler_loop import section_handoff, section_loop  # noqa: E402

from kiln.domain.placement.policy import decide  # noqa: E402
from kiln.domain.placement.types import PRIORITY, Decision, Node, Pending, Running, WorkerAlloc  # noqa: E402
from kiln.domain.quota import Limits, OrgUsage, blocked_by  # noqa: E402

GI = 1024**3
NOW = 2_000_000_000.0
TARGET = 1000.0  # pending jobs decided per second


# -- workload -----------------------------------------------------------------------------------------


def local_nodes() -> list[Node]:
    return [Node("local", 64_000, 512 * GI, tuple(range(8)), {i: "H200" for i in range(8)})]


def cluster_nodes() -> list[Node]:
    return [
        Node(
            f"gpu-{i:02d}",
            112_000,
            2048 * GI,
            tuple(range(8)),
            {g: "H200" for g in range(8)},
            {"zone": "a" if i < 8 else "b"},
        )
        for i in range(16)
    ]


def make_running(nodes: list[Node], rng: random.Random, fill: float, preempting: int) -> list[Running]:
    """Running jobs on ``fill`` of each node's GPUs (1-4 GPUs each) plus some CPU-only ones."""
    running: list[Running] = []
    for node in nodes:
        free = list(node.gpus)
        millicores = node.millicores
        while len(free) > len(node.gpus) * (1 - fill):
            n = min(rng.choice((1, 1, 2, 4)), len(free))
            gpus, free = tuple(free[:n]), free[n:]
            c = min(millicores, 4000 * n)
            millicores -= c
            running.append(_running(len(running), node.name, c, 16 * GI * n, gpus, rng))
        for _ in range(2):
            running.append(_running(len(running), node.name, 2000, 4 * GI, (), rng))
    for r in rng.sample(range(len(running)), min(preempting, len(running))):
        old = running[r]
        running[r] = Running(
            old.job_id, old.org_id, old.category, old.priority, old.workers, old.started, old.deadline, True
        )
    return running


def _running(i: int, node: str, millicores: int, memory: int, gpus: tuple[int, ...], rng: random.Random) -> Running:
    return Running(
        f"run-{i}",
        f"org-{rng.randrange(100)}",
        "train",
        rng.choice((0, 0, 1, 1, 1, 2)),
        (WorkerAlloc(node, millicores, memory, gpus),),
        NOW - rng.uniform(10, 36000),
        NOW + rng.uniform(60, 7200) if rng.random() < 0.5 else None,
    )


def make_pending(n_jobs: int, n_orgs: int, rng: random.Random) -> list[Pending]:
    """Organisations submit at very different rates (Zipf-like): org-0 the most."""
    rates = [1.0 / (k + 1) for k in range(n_orgs)]
    orgs = rng.choices(range(n_orgs), weights=rates, k=n_jobs)
    jobs = []
    for i, org in enumerate(orgs):
        roll = rng.random()
        # CPUs in millicores, as the policy counts them (kiln.domain.placement.types)
        workers, gpus, millicores, gpu_type = 1, 0, rng.choice((1000, 2000, 4000)), None
        if roll < 0.05:  # gangs
            workers, gpus, millicores = rng.choice((2, 4, 8)), rng.choice((1, 2, 8)), 8000
        elif roll < 0.45:  # GPU jobs
            gpus, millicores = rng.choice((1, 1, 1, 2, 4, 8)), 8000
            gpu_type = "H200" if rng.random() < 0.3 else None
        jobs.append(
            Pending(
                job_id=f"job-{i:05d}",
                org_id=f"org-{org}",
                org_name=f"org-{org}",
                category=rng.choice(("train", "train", "serve", "dev")),
                priority=rng.choices(list(PRIORITY.values()), weights=(2, 6, 1))[0],
                submitted=NOW - n_jobs + i + rng.random(),
                workers=workers,
                millicores=millicores,
                memory=rng.choice((None, 8 * GI, 32 * GI)),
                gpus=gpus,
                gpu_type=gpu_type,
                node_selector={"zone": "b"} if rng.random() < 0.05 else {},
                timeout=rng.choice((None, None, 600.0, 3600.0)),
            )
        )
    return jobs


def make_quotas(n_orgs: int, rng: random.Random) -> tuple[dict[str, dict[str, Limits]], dict[str, OrgUsage]]:
    limits: dict[str, dict[str, Limits]] = {}
    usage: dict[str, OrgUsage] = {}
    for org in range(0, n_orgs, 3):
        org_id = f"org-{org}"
        limits[org_id] = {"train": Limits(gpus=16, millicores=256_000), "total": Limits(gpus=24, count=50)}
        used = OrgUsage()
        for _ in range(rng.randrange(4)):
            used.add("train", 2, 16_000, 32 * GI)
        usage[org_id] = used
    return limits, usage


# -- the baseline: the FIFO policy this one replaces ----------------------------------------------------


def fifo_first_fit(
    pending: list[Pending],
    nodes: list[Node],
    running: list[Running],
    limits: dict[str, dict[str, Limits]],
    usage: dict[str, OrgUsage],
) -> int:
    """What the FIFO placement of Kiln core did, on several nodes: sort by submit time; per job the never-fits
    and quota checks, then first fit per worker (a gang all or nothing); the first job that does not fit holds
    the queue and every job after it gets its "queued: position N" line. Returns how many it placed."""
    free = {n.name: [n.millicores, n.memory, set(n.gpus)] for n in nodes}
    for r in running:
        for w in r.workers:
            slot = free.get(w.node)
            if slot is not None:
                slot[0] -= w.millicores
                slot[1] -= w.memory or 0
                slot[2].difference_update(w.gpus)
    used = {
        org: OrgUsage({k: replace(v) for k, v in u.by_category.items()}, replace(u.total)) for org, u in usage.items()
    }
    waiting: dict[str, str] = {}
    placed = 0
    blocked: str | None = None
    position = 0
    for job in sorted(pending, key=lambda j: (j.submitted, j.job_id)):
        if not any(
            n.millicores >= job.millicores and n.memory >= (job.memory or 0) and len(n.gpus) >= job.gpus for n in nodes
        ):
            waiting[job.job_id] = "never fits"
            continue
        org_limits = limits.get(job.org_id)
        total = (job.gpus * job.workers, job.millicores * job.workers, (job.memory or 0) * job.workers)
        if org_limits:
            why = blocked_by(job.org_name, job.category, org_limits, used.setdefault(job.org_id, OrgUsage()), *total)
            if why:
                waiting[job.job_id] = why
                continue
        position += 1
        if blocked is not None:
            waiting[job.job_id] = f"queued: position {position}, behind {blocked}"
            continue
        taken = []
        for _ in range(job.workers):
            for name, slot in free.items():
                if slot[0] >= job.millicores and slot[1] >= (job.memory or 0) and len(slot[2]) >= job.gpus:
                    gpus = sorted(slot[2])[: job.gpus]
                    slot[0] -= job.millicores
                    slot[1] -= job.memory or 0
                    slot[2].difference_update(gpus)
                    taken.append((name, gpus))
                    break
            else:
                break
        if len(taken) < job.workers:
            for name, gpus in taken:  # all or nothing
                free[name][0] += job.millicores
                free[name][1] += job.memory or 0
                free[name][2].update(gpus)
            waiting[job.job_id] = "capacity: ..."
            blocked = job.job_id
            continue
        placed += 1
        position -= 1
        used.setdefault(job.org_id, OrgUsage()).add(job.category, *total)
    return placed


# -- timing ---------------------------------------------------------------------------------------------


def timed(fn: Callable[[], Any], reps: int) -> tuple[list[float], Any]:
    result = fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return times, result


def outcome(decision: Decision) -> dict[str, Any]:
    return {
        "placed": len(decision.placements),
        "waiting": dict(Counter(w.kind for w in decision.waiting.values())),
        "unschedulable": len(decision.unschedulable),
        "preemptions": len(decision.preemptions),
        "reservation": decision.reservation,
    }


def row(metric: str, value: float, baseline: float | None, target: str, ok: bool | None, unit: str) -> dict:
    return {
        "metric": metric,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "ratio": (value / baseline) if baseline else None,
        "target": target,
        "pass": ok,
    }


# -- sections -------------------------------------------------------------------------------------------


def section_decide(args: argparse.Namespace, results: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    rng = random.Random(args.seed)
    pending = make_pending(args.jobs, args.orgs, rng)
    limits, usage = make_quotas(args.orgs, rng)
    weights = {f"org-{k}": 2.0 for k in range(1, args.orgs, 10)}
    cases = [
        ("local", local_nodes(), False),
        ("cluster", cluster_nodes(), False),
        ("cluster+preemption", cluster_nodes(), True),
    ]
    out: dict[str, Any] = {}
    for name, nodes, preemption in cases:
        running = make_running(nodes, random.Random(args.seed + 1), fill=0.75, preempting=0 if name == "local" else 4)

        def run_policy(nodes: list[Node] = nodes, running: list[Running] = running, pre: bool = preemption) -> Any:
            return decide(
                pending,
                nodes,
                running,
                limits=limits,
                usage=usage,
                weights=weights,
                now=NOW,
                preemption=pre,
            )

        def run_fifo(nodes: list[Node] = nodes, running: list[Running] = running) -> Any:
            return fifo_first_fit(pending, nodes, running, limits, usage)

        base_times, base_placed = timed(run_fifo, args.reps)
        times, decision = timed(run_policy, args.reps)
        rate = len(pending) / statistics.median(times)
        base_rate = len(pending) / statistics.median(base_times)
        summary = outcome(decision)
        out[name] = {
            "nodes": len(nodes),
            "running": len(running),
            "pending": len(pending),
            "times_s": times,
            "baseline_times_s": base_times,
            "decisions_per_s": rate,
            "baseline_decisions_per_s": base_rate,
            "baseline_placed": base_placed,
            "outcome": summary,
        }
        print(
            f"{name:20s} {len(nodes):2d} node(s), {len(running):3d} running: decide() median "
            f"{statistics.median(times) * 1000:7.1f} ms (min {min(times) * 1000:.1f}, max {max(times) * 1000:.1f}) "
            f"-> {rate:9.0f} jobs/s; FIFO baseline {statistics.median(base_times) * 1000:6.1f} ms"
        )
        print(f"{'':20s} outcome: {summary}; baseline placed {base_placed}")
        rows.append(row(f"decide() jobs/s, {name}", rate, base_rate, f"≥ {TARGET:,.0f}/s", rate >= TARGET, "/s"))
    results["decide"] = out


SECTIONS: dict[str, Callable[[argparse.Namespace, dict[str, Any], list[dict[str, Any]]], None]] = {
    "decide": section_decide,
    "loop": section_loop,
    "handoff": section_handoff,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000, help="pending jobs (default 10000)")
    parser.add_argument("--orgs", type=int, default=100, help="organisations (default 100)")
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions per case, after one warm-up")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--skip", nargs="*", default=[], choices=sorted(SECTIONS))
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--postgres", metavar="URL", help="also run the loop section on PostgreSQL (a new database)")
    parser.add_argument("--handoffs", type=int, default=10, help="job exits measured by the handoff section")
    args = parse_args(parser, {"jobs": 200, "orgs": 5, "reps": 1, "handoffs": 2})
    started = time.monotonic()
    results: dict[str, Any] = {
        "python": sys.executable,
        "cpus_on_machine": os.cpu_count(),
        "jobs": args.jobs,
        "orgs": args.orgs,
        "reps": args.reps,
        "seed": args.seed,
    }
    rows: list[dict[str, Any]] = []
    for name, section in SECTIONS.items():
        if name not in args.skip:
            print(f"\n[{name}] {args.jobs} pending jobs from {args.orgs} organisations, {args.reps} timed runs each")
            section(args, results, rows)
    print_table(rows, metric_width=40, digits={"/s": 0})
    print(
        "value = pending jobs decided per second (median run); baseline = FIFO + first fit holding the queue at the "
        "first job not fitting\n(placement.decide's policy), same jobs and nodes, same run; ratio < 1: what the full "
        "policy costs over it."
    )
    finish(results, rows, started, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

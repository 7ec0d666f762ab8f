"""The words of the reserved job's reason (policy.py decides; this says it): what it waits for, each job named,
and what would let it start sooner. Pure, no I/O.

A job id in a reason may be followed by what the reason says of that job, in parentheses with none inside
(``job-… (a replica of service web: scale the service down or stop it)``): the callers hide the two together from
other organisations (kiln.usecases.jobs.scheduler_inputs.redact), since the words may name its service.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kiln.domain.placement.packing import NodeState, Shape
from kiln.domain.placement.types import Pending, Running
from kiln.domain.quantities import format_cpus, format_memory

NAMED = 5  # at most this many holders named in one reason


def seconds(value: float) -> str:
    return f"{max(value, 0):.0f}s"


def holder(
    job_id: str,
    reserved: str,
    running: Mapping[str, Running],
    placed: Mapping[str, Pending],
    now: float,
    preemption: bool,
) -> str:
    """One job the reserved job waits for, and what would end it: ``job-… (no timeout: wait for it to end or
    cancel it)``, ``job-… (a replica of service web: …)``, ``job-… (ends by its timeout in 600s)``."""
    r = running.get(job_id)
    if r is None:  # placed by this same decision
        p = placed.get(job_id)
        timeout = p.timeout if p is not None else None
        return f"{job_id} (about to start, {'timeout ' + seconds(timeout) if timeout is not None else 'no timeout'})"
    ends = f"ends by its timeout in {seconds(r.deadline - now)}" if r.deadline is not None else "no timeout"
    if r.backfill_for == reserved:
        if preemption:
            return f"{job_id} (backfilled on its resources; preempted to give them back once it can start)"
        return f"{job_id} (backfilled on its resources, {ends}; preemption is off)"
    if r.service:
        return f"{job_id} (a replica of service {r.service}: scale the service down or stop it)"
    if r.deadline is not None:
        return f"{job_id} ({ends})"
    return f"{job_id} (no timeout: wait for it to end or cancel it)"


def names(texts: Sequence[str], total: int) -> str:
    """``a``, ``a and b``, ``a, b and 3 more``: the first ``texts`` of ``total``."""
    shown = list(texts[:NAMED])
    if total > len(shown):
        shown.append(f"{total - len(shown)} more")
    if len(shown) < 2:
        return "".join(shown)
    return ", ".join(shown[:-1]) + " and " + shown[-1]


def room(nodes: Sequence[NodeState], shape: Shape, view: Sequence[int]) -> str | None:
    """What a single-worker job could ask for and start now, in what it asks more of than is free (``1.5 CPUs``,
    ``1.5 CPUs and 2 GiB memory``), or None: a gang, or nothing free of something it lacks."""
    workers, cpus, memory, gpus, _, _ = shape
    if workers != 1 or not nodes:
        return None
    free_c = max(sum(n.c[layer] for layer in view) for n in nodes)
    free_m = max(sum(n.m[layer] for layer in view) for n in nodes)
    free_g = max(len(set().union(*(n.g[layer] for layer in view))) for n in nodes)
    parts = []
    for asked, free, text in (
        (gpus, free_g, f"{free_g} GPU{'' if free_g == 1 else 's'}"),
        (cpus, free_c, f"{format_cpus(free_c)} CPU{'' if free_c == 1000 else 's'}"),
        (memory, free_m, f"{format_memory(max(free_m, 0))} memory"),
    ):
        if asked > free:
            if free <= 0:
                return None
            parts.append(text)
    return " and ".join(parts) or None


def reserved_note(
    start: float | None,
    waits_on: Sequence[str],
    texts: Sequence[str],
    now: float,
    lend: bool,
    lent: bool,
    preemption: bool,
    room_now: str | None,
) -> str:
    """What the reserved job's capacity message adds: ``; next in line, ...``. ``texts``: ``holder`` of the first
    of ``waits_on`` (the jobs whose resources it needs); ``lend``: jobs behind it may borrow, as it waits for
    jobs with no end; ``lent``: something was free to borrow; ``room_now``: ``room`` (what it could ask for and
    start now)."""
    verb = "holds" if len(waits_on) == 1 else "hold"
    who = names(texts, len(waits_on))
    if start is not None:
        note = f"; next in line, resources reserved (it can start in {seconds(start - now)})"
        return note + (f": it needs what {who} {verb}" if texts else "")
    if not texts:
        return "; next in line, resources reserved for it as they free up"
    if lend:
        note = f"; next in line: it needs what {who} {verb}, with no end in sight"
    else:
        note = f"; next in line, resources reserved as they free up: it needs what {who} {verb}"
    if room_now:
        note += f"; it could start now asking for at most {room_now}"
    if lent:
        note += "; meanwhile jobs behind it may use the free resources (backfill)"
        note += (
            " and are preempted to give them back once it can start"
            if preemption
            else " and it then waits for them too (preemption is off)"
        )
    return note

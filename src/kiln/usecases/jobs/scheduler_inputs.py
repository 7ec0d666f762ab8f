"""What the decision function (kiln.domain.placement) is given, read from the database in one place: the
reconciler (kiln.scheduler.loop) decides with it, ``kiln jobs why`` (usecases/jobs/scheduling.py) explains with it and
a submit (usecases/jobs/jobs.py) refuses a job that could never fit with it, so they can never disagree about what
holds a job.

This is the edge between CPUs as users write them (``cpus: 0.1`` in specs, allocations and the inventory) and the
policy's whole millicores (kiln.domain.quantities.millicores): converted here on the way in, and back in
``allocation_of`` (through the backend's slots) on the way out."""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Select, bindparam, select
from sqlalchemy.orm import Session

from kiln.backends.base import Backend, Inventory, Slot
from kiln.db.tables import Job, Organization, Service
from kiln.domain.placement.policy import decide
from kiln.domain.placement.types import Decision, Node, Pending, Running, WorkerAlloc
from kiln.domain.quantities import millicores
from kiln.domain.quota import Limits, OrgUsage
from kiln.domain.spec import JobSpec
from kiln.domain.states import JobState
from kiln.domain.stored_spec import SERVICE_LABEL, StoredSpec
from kiln.usecases.access.quotas import load_limits, load_usage

JOB_ID = re.compile(r"\bjob-[0-9a-z]{16}\b")
# A job id with what a message says of it right after, in parentheses (``job-… (a replica of service web: …)``):
# hidden together from other organisations, since the words can name its service or its timeout.
JOB_REF = re.compile(r"\bjob-[0-9a-z]{16}\b(?: \([^()]*\))?")
WAITING_STATES = [JobState.QUEUED, JobState.RESTARTING]
ACTIVE_STATES = [JobState.STARTING, JobState.RUNNING]
# The columns of a waiting job the scheduler needs: rows of these, not ORM objects, since a long queue is read
# on every pass.
_QUEUE_COLUMNS = (
    Job.id,
    Job.org_id,
    Job.category,
    Job.priority,
    Job.created_at,
    Job.workers,
    Job.spec,
    Job.state,
    Job.message,
    Job.not_before,
    Job.lease_owner,
    Job.lease_expires_at,
)
# The columns of an active job the scheduler needs; of its spec only the timeout and the service whose replica it
# is, read by the database out of the JSON (every submit placed at once reads every active job: decoding each
# one's whole spec there cost more than the rest of the read).
_ACTIVE_COLUMNS = (
    Job.id,
    Job.org_id,
    Job.category,
    Job.priority,
    Job.allocation,
    Job.started_at,
    Job.running_at,
    Job.spec["timeout"].as_float().label("timeout"),
    Job.spec[("labels", SERVICE_LABEL)].as_string().label("service_id"),
    Job.preempt_reason,
)


@functools.cache
def _queue_statement(limited: bool) -> Select[Any]:
    """The waiting jobs of a backend, oldest first (built once: building a statement costs more than running it
    on a short queue, and a submit placed at once reads it). ``limited``: at most ``limit`` of them."""
    query = (
        select(*_QUEUE_COLUMNS)
        .where(Job.backend == bindparam("backend"), Job.state.in_([str(x) for x in WAITING_STATES]))
        .order_by(Job.created_at, Job.id)
    )
    return query.limit(bindparam("limit")) if limited else query


@functools.cache
def _active_statement(released: bool) -> Select[Any]:
    """The active jobs of a backend (``released``: but those named in the bound list ``released``)."""
    query = select(*_ACTIVE_COLUMNS).where(
        Job.backend == bindparam("backend"), Job.state.in_([str(x) for x in ACTIVE_STATES])
    )
    return query.where(Job.id.not_in(bindparam("released", expanding=True))) if released else query


_ORGS = select(Organization.id, Organization.name, Organization.share_weight).where(
    Organization.id.in_(bindparam("org_ids", expanding=True))
)


def node_of(inv: Inventory) -> Node:
    return Node(
        name=inv.name,
        millicores=millicores(inv.cpus),
        memory=inv.memory,
        gpus=tuple(inv.gpus),
        gpu_types=dict(inv.gpu_names),
        labels=dict(inv.labels),
    )


def slots_of(allocation: dict[str, Any] | None, default_node: str) -> tuple[Slot, ...]:
    """The slots an allocation holds; allocations written before gangs existed hold one slot."""
    if not allocation:
        return ()
    if allocation.get("slots"):
        return tuple(
            Slot(s["node"], float(s["cpus"]), s.get("memory"), tuple(s.get("gpus", ()))) for s in allocation["slots"]
        )
    return (
        Slot(
            default_node,
            float(allocation.get("cpus", 0.0)),
            allocation.get("memory"),
            tuple(allocation.get("gpus", ())),
        ),
    )


def allocation_of(slots: tuple[Slot, ...], backfill_for: str | None = None) -> dict[str, Any]:
    """The allocation a job is given, as stored and shown. ``backfill_for``: the waiting job whose reserved
    resources it borrows (Placement.backfill_for), kept so that every later decision knows that job may take them
    back (the API's ``Allocation`` does not show it)."""
    memory = [s.memory for s in slots]
    total = sum(millicores(s.cpus) for s in slots)  # exact: 3 slots of 0.1 CPU hold 0.3, not 0.30000000000000004
    out: dict[str, Any] = {
        "cpus": total / 1000,
        "memory": None if any(m is None for m in memory) else sum(m for m in memory if m is not None),
        "gpus": [g for s in slots for g in s.gpus],
        "slots": [{"node": s.node, "cpus": s.cpus, "memory": s.memory, "gpus": list(s.gpus)} for s in slots],
    }
    if backfill_for:
        out["backfill_for"] = backfill_for
    return out


def _epoch(value: datetime | None) -> float:
    return value.timestamp() if value is not None else 0.0


def pending_of(job: Any, org_name: str) -> Pending:
    """A waiting job as the policy sees it: resources per member, read from the stored spec without
    re-validating it (it was valid at submit; a full model per job would dominate a 10,000-job pass)."""
    spec = StoredSpec(job.spec)
    return Pending(
        job_id=job.id,
        org_id=job.org_id,
        org_name=org_name,
        category=job.category,
        priority=job.priority,
        submitted=_epoch(job.created_at),
        workers=job.workers,
        millicores=millicores(spec.cpus),
        memory=spec.memory,
        gpus=spec.gpus,
        gpu_type=spec.gpu_type,
        node_selector=dict(spec.node_selector),
        timeout=spec.timeout,
    )


def never_fits(spec: JobSpec, nodes: list[Node]) -> str | None:
    """Why a job with this spec could never run on these nodes even when they are idle, or None. Asked of
    the decision function itself, so submit-time refusals and the scheduler agree."""
    res = spec.resources
    probe = Pending(
        job_id="-",
        org_id="-",
        org_name="-",
        category="train",
        priority=spec.priority_value,
        submitted=0.0,
        workers=spec.gang_size,
        millicores=millicores(res.cpus),
        memory=res.memory,
        gpus=res.gpus,
        gpu_type=res.gpu_type,
        node_selector=spec.node_selector,
        timeout=spec.timeout,
    )
    return decide([probe], nodes, [], now=0.0).unschedulable.get("-")


@dataclass
class Snapshot:
    """Everything one decision needs, plus the rows it was built from."""

    queue: list[Any]  # rows of _QUEUE_COLUMNS
    pending: list[Pending]
    running: list[Running]
    nodes: list[Node]
    limits: dict[str, dict[str, Limits]]
    usage: dict[str, OrgUsage]
    weights: dict[str, float]
    names: dict[str, str]
    by_id: dict[str, Any] = field(default_factory=dict)

    def decide(self, now: float, preemption: bool) -> Decision:
        return decide(
            self.pending,
            self.nodes,
            self.running,
            limits=self.limits,
            usage=self.usage,
            weights=self.weights,
            now=now,
            preemption=preemption,
        )


def gather(
    s: Session, backend: Backend, now: datetime, *, ready_only: bool = True, released: Collection[str] = ()
) -> Snapshot:
    """Read the queue (oldest first), the active jobs and the organisations' limits, usage and weights.
    ``ready_only`` leaves out restarting jobs still in their back-off. ``released``: active jobs whose attempts
    the caller saw end and whose transitions it has not written yet; what they hold counts as free. Read through
    the session's connection: what the caller's transaction added and did not flush is not seen."""
    snap = _gather(s, backend, now, ready_only=ready_only, released=released, queue_limit=None)
    assert snap is not None  # (no limit)
    return snap


def gather_short(
    s: Session, backend: Backend, now: datetime, queue_limit: int, new: Any | None = None
) -> Snapshot | None:
    """``gather``, or None where more than ``queue_limit`` jobs wait (nothing more is read then): a submit's read.
    ``new``: a job (a Job row) the caller's transaction added and has not written, queued last."""
    return _gather(s, backend, now, ready_only=True, released=(), queue_limit=queue_limit, new=new)


def _gather(
    s: Session,
    backend: Backend,
    now: datetime,
    *,
    ready_only: bool,
    released: Collection[str],
    queue_limit: int | None,
    new: Any | None = None,
) -> Snapshot | None:
    params: dict[str, Any] = {"backend": backend.name}
    if queue_limit is not None:
        params["limit"] = queue_limit + 1
    # Its reads go through the session's connection, past the ORM (half their cost, on every submit placed at
    # once): they see what the caller's transaction has written, not what it added and did not flush.
    conn = s.connection()
    queue = list(conn.execute(_queue_statement(queue_limit is not None), params))
    if new is not None:
        queue.append(new)
    if queue_limit is not None and len(queue) > queue_limit:
        return None
    if ready_only:
        queue = [j for j in queue if j.state == JobState.QUEUED or j.not_before is None or j.not_before <= now]
    if not queue:  # most passes: nothing waits, so nothing else needs reading
        return Snapshot([], [], [], [], {}, {}, {}, {})
    if released:
        params["released"] = sorted(released)
    active = conn.execute(_active_statement(bool(released)), params).all()
    nodes = [node_of(inv) for inv in backend.nodes()]
    default_node = nodes[0].name if nodes else "local"
    org_ids = sorted({j.org_id for j in queue} | {a.org_id for a in active})
    limits = load_limits(s, org_ids)
    limited = [o for o in org_ids if o in limits]
    usage = load_usage(s, limited, released) if limited else {}
    names: dict[str, str] = {}
    weights: dict[str, float] = {}
    for org_id, name, weight in conn.execute(_ORGS, {"org_ids": org_ids}):
        names[org_id] = name
        weights[org_id] = float(weight or 1.0)
    services = _service_names(s, active)
    running = []
    for a in active:
        slots = slots_of(a.allocation, default_node)
        if not slots:
            continue
        began = a.running_at or a.started_at
        timeout = a.timeout or None
        running.append(
            Running(
                job_id=a.id,
                org_id=a.org_id,
                category=a.category,
                priority=a.priority,
                workers=tuple(WorkerAlloc(x.node, millicores(x.cpus), x.memory, x.gpus) for x in slots),
                started=_epoch(began),
                deadline=_epoch(began) + float(timeout) if timeout and began else None,
                preempting=bool(a.preempt_reason),
                backfill_for=(a.allocation or {}).get("backfill_for"),
                service=services.get(a.service_id or ""),
            )
        )
    pending = [pending_of(j, names.get(j.org_id, j.org_id)) for j in queue]
    return Snapshot(queue, pending, running, nodes, limits, usage, weights, names, {j.id: j for j in queue})


def _service_names(s: Session, active: Sequence[Any]) -> dict[str, str]:
    """Service id → name, for the services whose replicas are among the ``active`` jobs (the reasons name them)."""
    ids = {a.service_id for a in active if a.service_id is not None}
    if not ids:
        return {}
    rows = s.execute(select(Service.id, Service.name).where(Service.id.in_(sorted(ids))))
    return {service_id: name for service_id, name in rows}


def redact(message: str, viewer_org: str | None, org_of: dict[str, str]) -> str:
    """``message`` with the ids of jobs outside ``viewer_org`` replaced, together with what the message says of
    each in parentheses right after its id (its service, its timeout): None is a platform admin, who sees all."""
    if viewer_org is None:
        return message

    def hide(match: re.Match[str]) -> str:
        job_id = match.group(0).split(" ", 1)[0]
        return match.group(0) if org_of.get(job_id) == viewer_org else "a job of another organisation"

    return JOB_REF.sub(hide, message)

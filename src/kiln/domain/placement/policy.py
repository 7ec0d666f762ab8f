"""The scheduling decision: which waiting jobs start now and where, which running ones to preempt, and why each
of the others waits. Pure and deterministic: no database, no processes, no I/O.

Policy, in the order ``decide`` applies it:

1. Never fits: a job no set of these nodes could ever hold (per-worker demand beyond every matching node, an
   absent ``gpu_type``, a ``node_selector`` matching nothing, a gang larger than the nodes could hold at once) or
   whose demand exceeds its organisation's quota limit outright is *unschedulable*.
2. Order (fairshare.py): priority classes highest first; within a class weighted dominant-resource fair share
   between organisations, FIFO within an organisation.
3. In that order each job is
   * *quota*-blocked when its organisation's quota (counting what this decision already placed) has no room
     for it: it waits and holds nothing back for anybody;
   * placed when its whole gang fits the free resources nobody has earmarked (best fit, packing.py), or
     (backfill) the resources earmarked for the reserved job where that cannot delay it. When the reserved job's
     start is known (from the running jobs' deadlines), only a job whose ``timeout`` surely ends it before then
     may (EASY backfill). When its start is unknown, because it needs what a job with no end holds (a service's
     replica, a notebook, a job without a timeout), any job may (Slurm's rule: a start at no known time cannot
     be delayed); such a job *borrows* from the reserved job (``Placement.backfill_for``, kept with its
     allocation, then ``Running.backfill_for``);
   * else *preempting* when resources of running jobs already being preempted, or (``preemption=True``) of
     running jobs of strictly lower priority, or of the running jobs that borrowed from it, that it preempts now
     make it fit: the victims are the lowest priority first, then the most recently started, only as many as
     needed; it earmarks what it will use. So the reserved job gets the capacity first as soon as it can use it:
     once what it waited for has ended, its borrowers give back what they borrowed;
   * else the first such job gets the *reservation*: where it would go once running jobs end (by their
     deadlines; its borrowers at once, being preempted for it; then, with no end in sight, its borrowers, then
     the rest) is worked out, and what of that is free now is earmarked for it. Later jobs that would fit but for
     an earmark wait with *reservation* (or *priority* when the holder is of a higher class); those that would
     not fit anyway wait for *capacity* (or *gang*, when only some workers fit). Without preemption a reserved
     job that waits only for its borrowers lends no more: it waits for those to end, and no longer than that.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from kiln.domain.placement import reasons
from kiln.domain.placement.fairshare import fair_order
from kiln.domain.placement.packing import (
    AVAIL,
    EASY,
    EXTRA,
    HELD,
    SOON,
    V_AVAIL,
    V_EASY,
    V_FREE,
    V_SOON,
    NodeState,
    Res,
    Shape,
    capacity_message,
    fit,
    matching,
    never_fits,
    shape_of,
)
from kiln.domain.placement.timeline import earliest, givers
from kiln.domain.placement.types import (
    Decision,
    Node,
    Pending,
    Placement,
    Running,
    Wait,
    WorkerAlloc,
    priority_name,
)
from kiln.domain.quota import Limits, OrgUsage
from kiln.domain.quota import blocked_by as quota_blocked_by
from kiln.domain.quota import never_fits as quota_never_fits

AHEAD = 5  # at most this many job ids in Wait.ahead
SLACK = 1e-6  # seconds: a backfill that ends exactly when the reserved job can start does not delay it

# bits of what a job shape is already known not to fit (the views only shrink during a decision)
F_AVAIL, F_EASY, F_SOON, F_FREE = 1, 2, 4, 8


class _Holder:
    """A waiting job with resources earmarked for it."""

    __slots__ = ("earmark", "job", "preempting", "start", "waits_on")

    def __init__(self, job: Pending, preempting: bool, waits_on: tuple[str, ...], start: float | None) -> None:
        self.job = job
        self.preempting = preempting
        self.waits_on = waits_on  # running jobs it waits for
        self.start = start  # earliest start, when known (the reservation only)
        self.earmark: dict[int, Res] = {}  # node index -> what is earmarked there now

    def add(self, node: NodeState, res: Res) -> None:
        self.earmark.setdefault(node.index, Res()).add(res.cpus, res.memory, res.gpus)


def decide(
    pending: Sequence[Pending],
    nodes: Sequence[Node],
    running: Sequence[Running],
    *,
    limits: Mapping[str, dict[str, Limits]] | None = None,
    usage: Mapping[str, OrgUsage] | None = None,
    weights: Mapping[str, float] | None = None,
    now: float,
    preemption: bool = False,
) -> Decision:
    """Decide for ``pending`` on ``nodes``, given what ``running`` holds. ``limits`` and ``usage`` (the
    organisations' quotas and current usage, keyed by organisation id) are not modified; ``weights`` are
    fair-share weights by organisation id (default 1)."""
    return _Walk(nodes, running, limits or {}, usage or {}, now, preemption).run(pending, weights or {})


class _Walk:
    """One decision: the state that changes as jobs are taken in scheduling order."""

    def __init__(
        self,
        nodes: Sequence[Node],
        running: Sequence[Running],
        limits: Mapping[str, dict[str, Limits]],
        usage: Mapping[str, OrgUsage],
        now: float,
        preemption: bool,
    ) -> None:
        self.nodes = [NodeState(i, n) for i, n in enumerate(nodes)]
        self.by_name = {n.name: n for n in self.nodes}
        self.running = running
        for job in running:
            for w in job.workers:
                node = self.by_name.get(w.node)
                if node is not None:
                    node.hold(w, job.preempting)
        self.being_preempted = [r for r in running if r.preempting]  # and, as they are chosen, the victims
        self.preemptible = sorted(
            (r for r in running if not r.preempting), key=lambda r: (r.priority, -r.started, r.job_id)
        )
        self.running_by_id = {r.job_id: r for r in running}
        # waiting jobs that running jobs borrowed from (Running.backfill_for): each may preempt its borrowers
        self.lenders = {r.backfill_for for r in running if r.backfill_for and not r.preempting}
        self.limits = limits
        self.usage_in = usage
        self.usage: dict[str, OrgUsage] = {}  # copies of the organisations' usage this decision touched
        self.now = now
        self.preemption = preemption
        self.matches: dict[Shape, list[NodeState]] = {}
        self.nofit: dict[Shape, int] = {}
        self.preempt_failed: dict[Shape, int] = {}  # shape -> highest priority that could not preempt for it
        self.attributed: dict[Shape, _Holder] = {}
        self.holders: list[_Holder] = []
        self.holder_ids: list[str] = []
        self.reserved: _Holder | None = None  # the (one) capacity reservation
        self.easy_start: float | None = None  # when the reserved job can start at the earliest, if known
        # its start is unknown for want of a job with no end: jobs behind it may borrow (and give back)
        self.lend = False
        self.victims: set[str] = set()
        self.placed: list[tuple[Pending, list[tuple[NodeState, tuple[int, ...]]]]] = []
        # job id -> (kind, message or None: worked out at the end, ahead, shape)
        self.records: dict[str, tuple[str, str | None, tuple[str, ...], Shape]] = {}

    # -- the walk -------------------------------------------------------------------------------------------

    def run(self, pending: Sequence[Pending], weights: Mapping[str, float]) -> Decision:
        decision = Decision()
        schedulable = []
        impossible: dict[Shape, str | None] = {}
        for job in pending:
            shape = shape_of(job)
            if shape not in impossible:
                impossible[shape] = never_fits(self.nodes, shape)
            why = impossible[shape]
            org_limits = self.limits.get(job.org_id)
            if why is None and org_limits:
                memory = job.memory * job.workers if job.memory is not None else None
                why = quota_never_fits(
                    job.org_name or job.org_id,
                    job.category,
                    org_limits,
                    job.gpus * job.workers,
                    job.millicores * job.workers,
                    memory,
                )
            if why:
                decision.unschedulable[job.job_id] = why
            else:
                schedulable.append(job)
        totals = (
            float(sum(n.gpu_count for n in self.nodes)),
            float(sum(n.cpus for n in self.nodes)),  # millicores
            float(sum(n.memory for n in self.nodes)),
        )
        order = fair_order(schedulable, totals, self.running, weights)
        for job in order:
            self.step(job, decision)
        self.finish(order, decision)
        return decision

    def step(self, job: Pending, decision: Decision) -> None:
        shape = shape_of(job)
        nodes = self.matches.get(shape)
        if nodes is None:
            nodes = self.matches[shape] = matching(self.nodes, shape)
        org_limits = self.limits.get(job.org_id)
        if org_limits:
            why = quota_blocked_by(
                job.org_name or job.org_id, job.category, org_limits, self.usage_of(job.org_id), *self.total(job)
            )
            if why:
                self.records[job.job_id] = ("quota", why, (), shape)
                return
        failed = self.nofit.get(shape, 0)
        try:
            if not failed & F_AVAIL:
                plan = fit(nodes, shape, V_AVAIL)
                if isinstance(plan, list):
                    self.place(job, plan, V_AVAIL, decision)
                    return
                failed |= F_AVAIL
            if self.may_backfill(job) and not failed & F_EASY:
                plan = fit(nodes, shape, V_EASY)
                if isinstance(plan, list):
                    self.place(job, plan, V_EASY, decision)
                    return
                failed |= F_EASY
            if self.being_preempted and not failed & F_SOON:
                plan = fit(nodes, shape, V_SOON)
                if isinstance(plan, list):
                    self.claim(job, shape, plan, [], {})
                    return
                failed |= F_SOON
            if self.preemption and (
                job.job_id in self.lenders or self.preempt_failed.get(shape, -math.inf) < job.priority
            ):
                if self.preempt(job, shape, nodes, decision):
                    failed &= ~F_SOON  # what its victims give back beyond its needs is SOON free now
                    return
                self.preempt_failed[shape] = job.priority
            held = False
            if not failed & F_FREE:
                held = isinstance(fit(nodes, shape, V_FREE), list)
                if not held:
                    failed |= F_FREE
        finally:
            self.nofit[shape] = failed
        earlier = tuple(self.holder_ids[:AHEAD])
        if self.reserved is None:
            self.reserve(job, shape, nodes)
        if held and earlier:
            self.records[job.job_id] = self.held_back(job, shape, nodes)
        else:
            ahead = earlier
            if self.reserved is not None and self.reserved.job is job:
                ahead = tuple(dict.fromkeys(earlier + self.reserved.waits_on))
            self.records[job.job_id] = ("capacity", None, ahead[:AHEAD], shape)

    def finish(self, order: list[Pending], decision: Decision) -> None:
        """Positions, and the capacity messages from what is left free after this decision."""
        messages: dict[Shape, str] = {}
        position = 0
        for job in order:
            record = self.records.get(job.job_id)
            if record is None:
                continue
            position += 1
            kind, message, ahead, shape = record
            if message is None:
                message = messages.get(shape)
                if message is None:
                    message = messages[shape] = capacity_message(self.matches[shape], shape, V_FREE)
                kind = message.split(":", 1)[0]
                holder = self.reserved
                if holder is not None and holder.job is job:
                    message += self.reserved_note(holder, shape)
            decision.waiting[job.job_id] = Wait(kind, message, position, ahead)
        decision.reserved = list(self.holder_ids)
        decision.reservation = decision.reserved[0] if decision.reserved else None

    def reserved_note(self, holder: _Holder, shape: Shape) -> str:
        """The reserved job's reason beyond the numbers: the jobs it waits for, named, and what would let it
        start (reasons.py)."""
        job_id = holder.job.job_id
        placed = {p.job_id: p for p, _ in self.placed}
        texts = [
            reasons.holder(i, job_id, self.running_by_id, placed, self.now, self.preemption)
            for i in holder.waits_on[: reasons.NAMED]
        ]
        room = None if holder.start is not None else reasons.room(self.matches[shape], shape, (AVAIL, EASY))
        # "jobs behind it may use the free resources" only where something of what it needs was free to lend
        lent = self.lend and bool(holder.earmark)
        return reasons.reserved_note(
            holder.start, holder.waits_on, texts, self.now, self.lend, lent, self.preemption, room
        )

    # -- quota ----------------------------------------------------------------------------------------------

    @staticmethod
    def total(job: Pending) -> tuple[int, int, int | None]:
        memory = job.memory * job.workers if job.memory is not None else None
        return job.gpus * job.workers, job.millicores * job.workers, memory

    def usage_of(self, org_id: str) -> OrgUsage:
        usage = self.usage.get(org_id)
        if usage is None:
            given = self.usage_in.get(org_id)
            if given is None:
                usage = OrgUsage()
            else:
                usage = OrgUsage({k: replace(v) for k, v in given.by_category.items()}, replace(given.total))
            self.usage[org_id] = usage
        return usage

    def count_usage(self, job: Pending) -> None:
        if self.limits.get(job.org_id):
            self.usage_of(job.org_id).add(job.category, *self.total(job))

    # -- placing, earmarking ----------------------------------------------------------------------------------

    def may_backfill(self, job: Pending) -> bool:
        """May this job use what is earmarked for the reserved job? When that job's start is known, only if it
        surely ends (by its timeout) before then: EASY backfill. When its start is unknown for want of a job with
        no end that is not its own borrower (``lend``), any job may: a start at no known time cannot be delayed,
        and a job that borrows then is recorded as the reserved job's borrower, to give back what it took."""
        if self.lend:
            return True
        return (
            job.timeout is not None
            and self.easy_start is not None
            and self.now + job.timeout <= self.easy_start + SLACK
        )

    def place(
        self, job: Pending, plan: list[tuple[NodeState, tuple[int, ...]]], view: tuple[int, ...], decision: Decision
    ) -> None:
        memory = job.memory or 0
        allocs = []
        lender = None  # the reserved job, when this one borrows from it while its start is unknown
        for node, gpus in plan:
            taken = node.take(view, job.millicores, memory, gpus)
            borrowed = taken.get(EASY)
            if borrowed is not None and self.reserved is not None:
                if self.lend:
                    lender = self.reserved.job.job_id
                mark = self.reserved.earmark.get(node.index)
                if mark is not None:
                    mark.cpus -= borrowed.cpus
                    mark.memory -= borrowed.memory
                    mark.gpus -= borrowed.gpus
            allocs.append(WorkerAlloc(node.name, job.millicores, job.memory, gpus))
        decision.placements.append(Placement(job.job_id, tuple(allocs), lender))
        self.count_usage(job)
        self.placed.append((job, plan))

    def claim(
        self,
        job: Pending,
        shape: Shape,
        plan: list[tuple[NodeState, tuple[int, ...]]],
        victims: list[Running],
        extra: dict[int, Res],
    ) -> None:
        """The job waits for preempted jobs to stop: earmark what it will use. What the new ``victims`` give back
        (``extra``) and what jobs already being preempted give back (SOON) is used first and is claimed: nobody
        else counts on it; what it needs beyond that of the resources free now moves to HELD. What the victims
        give back beyond its needs is SOON free for the jobs after it."""
        holder = _Holder(job, True, (), None)
        back: dict[int, Res] = {}  # node index -> what of the plan jobs already being preempted give back
        for node, gpus in plan:
            taken = node.take(V_SOON, job.millicores, job.memory or 0, gpus, extra.get(node.index))
            now_free = taken.get(AVAIL)
            if now_free is not None:
                node.give(HELD, now_free)
                holder.add(node, now_free)
            if SOON in taken:
                back.setdefault(node.index, Res()).add(taken[SOON].cpus, taken[SOON].memory, taken[SOON].gpus)
        if extra:
            for index, left in extra.items():
                self.nodes[index].give(SOON, left)
            # SOON grew: what failed on it may fit now
            self.nofit = {shape: bits & ~F_SOON for shape, bits in self.nofit.items()}
            self.preempt_failed.clear()
        waits = [v.job_id for v in victims]
        if back:
            soon = [
                (r.job_id, n.index, w)
                for r in self.being_preempted
                for w in r.workers
                if (n := self.by_name.get(w.node)) is not None
            ]
            waits += [j for j in givers(back, soon) if j not in waits]
        self.being_preempted.extend(victims)
        holder.waits_on = tuple(dict.fromkeys(waits))
        self.holders.append(holder)
        self.holder_ids.append(job.job_id)
        self.placed.append((job, plan))  # for the reservation's estimate, it runs from now on
        self.count_usage(job)  # keep the quota room the preemption is for
        names = ", ".join(waits[:AHEAD]) + (f" and {len(waits) - AHEAD} more" if len(waits) > AHEAD else "")
        verb = "stops" if len(waits) == 1 else "stop"
        message = f"preempting: waits until {names or 'preempted jobs'} {verb} (being preempted for it)"
        self.records[job.job_id] = ("preempting", message, holder.waits_on[:AHEAD], shape)

    def preempt(self, job: Pending, shape: Shape, nodes: list[NodeState], decision: Decision) -> bool:
        """Preempt running jobs of lower priority if (and only if) that makes the whole gang fit."""
        where = {n.index for n in nodes}
        cands = [
            r
            for r in self.preemptible
            if (r.priority < job.priority or (r.backfill_for == job.job_id and r.priority <= job.priority))
            and r.job_id not in self.victims
            and any((n := self.by_name.get(w.node)) is not None and n.index in where for w in r.workers)
        ]
        if not cands or fit(nodes, shape, V_SOON, self.extra(cands)) is None:
            return False
        chosen: list[Running] = []
        extra: dict[int, Res] = {}
        for r in cands:  # lowest priority first, then the most recently started
            chosen.append(r)
            self.add_extra(extra, r)
            if fit(nodes, shape, V_SOON, extra) is not None:
                break
        for r in reversed(chosen[:-1]):  # drop the ones not needed after all, most valuable first
            rest = [v for v in chosen if v is not r]
            if fit(nodes, shape, V_SOON, self.extra(rest)) is not None:
                chosen = rest
        extra = self.extra(chosen)
        plan = fit(nodes, shape, V_SOON, extra)
        assert isinstance(plan, list)
        reason = f"preempted by {job.job_id} (priority {priority_name(job.priority)})"
        # A borrower gives back: it started on resources reserved for this job while its start was unknown.
        gives_back = (
            f"preempted by {job.job_id}: this job had backfilled on resources reserved for it, which it can use now"
        )
        for r in chosen:
            self.victims.add(r.job_id)
            decision.preemptions[r.job_id] = gives_back if r.backfill_for == job.job_id else reason
        self.claim(job, shape, plan, chosen, extra)
        return True

    def extra(self, jobs: Sequence[Running]) -> dict[int, Res]:
        extra: dict[int, Res] = {}
        for r in jobs:
            self.add_extra(extra, r)
        return extra

    def add_extra(self, extra: dict[int, Res], r: Running) -> None:
        for w in r.workers:
            node = self.by_name.get(w.node)
            if node is not None:
                extra.setdefault(node.index, Res()).add(
                    w.millicores, w.memory or 0, (g for g in w.gpus if g in node.all_gpus)
                )

    def reserve(self, job: Pending, shape: Shape, nodes: list[NodeState]) -> None:
        """The reservation: when and where the job fits as running jobs end (timeline.py), and what of that is
        free now, earmarked for it. Whether jobs behind it may borrow the earmark follows from what it waits for."""
        running = [r for r in self.running if not r.preempting and r.job_id not in self.victims]
        line = earliest(job, shape, nodes, self.by_name, running, self.placed, now=self.now, preemption=self.preemption)
        holder = _Holder(job, False, (), line.start)
        back: dict[int, Res] = {}  # node index -> what of the plan running jobs give back
        for node, gpus in line.plan or ():
            taken = node.take(V_SOON, job.millicores, job.memory or 0, gpus, line.extra.get(node.index))
            now_free = taken.get(AVAIL)
            if now_free is not None:
                node.give(EASY, now_free)
                holder.add(node, now_free)
            if EXTRA in taken:
                back.setdefault(node.index, Res()).add(taken[EXTRA].cpus, taken[EXTRA].memory, taken[EXTRA].gpus)
        self.lend = line.lend
        waits = givers(back, line.released)
        holder.waits_on = tuple(waits)
        self.reserved = holder
        self.easy_start = holder.start
        self.holders.append(holder)
        self.holder_ids.append(job.job_id)

    # -- why a job that would fit is held back ----------------------------------------------------------------

    def held_back(self, job: Pending, shape: Shape, nodes: list[NodeState]) -> tuple[str, str, tuple[str, ...], Shape]:
        """The job would fit what is free but for resources earmarked for jobs ahead of it: name the one whose
        earmark it needs (the first such, in scheduling order)."""
        primary = self.attributed.get(shape)
        if primary is None or primary.job is job:
            primary = None
            fallback = None
            for h in self.holders:
                if h.job is job:
                    continue
                fallback = fallback or h
                if h.earmark and fit(nodes, shape, V_AVAIL, h.earmark) is not None:
                    primary = h
                    break
            primary = primary or fallback
            assert primary is not None  # the caller saw holders ahead of the job
            self.attributed[shape] = primary
        first = primary.job
        kind = "priority" if first.priority > job.priority else "reservation"
        if primary.preempting:
            why = f"the free resources it needs are held for {first.job_id}, which waits on a preemption"
        else:
            why = f"the free resources it needs are reserved for {first.job_id}, next in line"
            if primary.start is None and self.lend:  # it may borrow those, but needs what a preemption holds too
                why += "; it could backfill on those, but needs resources held for a preemption as well"
            elif primary.start is None and not self.preemption:  # it waits only for the jobs that borrowed from it
                why += "; no backfill: it waits for the jobs that already backfilled there (preemption is off)"
            elif primary.start is None:
                why += "; when it can start is unknown"
            elif job.timeout is None:
                why += f"; a job with a timeout of at most {primary.start - self.now:.0f}s could backfill"
            elif not self.may_backfill(job):
                why += (
                    f"; its timeout {job.timeout:g}s ends after {first.job_id} can start "
                    f"(in {primary.start - self.now:.0f}s)"
                )
        if kind == "priority":
            why += f" (priority {priority_name(first.priority)})"
        others = [i for i in self.holder_ids[: AHEAD + 2] if i != first.job_id and i != job.job_id]
        ahead = (first.job_id, *others)
        return kind, f"{kind}: {why}", ahead[:AHEAD], shape

"""Usage metering and prices: who held what, for how long, and what it cost.

Every attempt's hold is a ``usage_records`` row, opened in the transaction that places the attempt (STARTING:
``open_usage``, from ``kiln.usecases.jobs.lifecycle.transition``) and closed in the one that releases it (its end, a
restart, a preemption, a requeue: ``close_usage``). So a server that stops loses nothing (the open row is in the
database; its use so far is the time since it opened), and a running job's use is visible as it runs.

A report sums, per group (organisation, user, job, category, GPU type or day), each hold's overlap with the
asked window times what it held: CPU-seconds, GiB-seconds of memory, GPU-seconds; and its cost under the price
versions in force during it (a price change mid-job splits the hold at the change). The sums are SQL, over the
records of the window (indexed by organisation and start), alike on SQLite and PostgreSQL.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    Float,
    String,
    Table,
    and_,
    bindparam,
    case,
    func,
    literal,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.orm import Session

from kiln.db.session import Database
from kiln.db.tables import Job, MetricSeries, Organization, Price, UsageRecord, User
from kiln.domain.usage import (
    GROUPS,
    RESOURCES,
    PriceRead,
    PriceSet,
    PriceVersion,
    UsageReport,
    UsageRow,
)
from kiln.errors import InvalidInput, NotFound
from kiln.usecases.access.identity import Principal
from kiln.usecases.usage import usage_hours
from kiln.usecases.usage.usage_hours import LONG_HOLD, Versions, whole_hours

GIB = 1024**3
CPU_SECONDS = "system/cpu_seconds"  # the job's system metrics (kiln.injob.sysmetrics) metering reads as used
RSS_BYTES = "system/rss_bytes"
# A hold's used figures come from its metrics, which may arrive after it closed: for this long after its end a
# report reads them live and the task ``usage`` writes them again (``settle``); then the record is final.
SETTLE_SECONDS = 600.0
SETTLE_PASS_SECONDS = 30.0  # how often the task ``usage`` runs
MAX_DAYS = 400  # a report by day spans at most this many days


def open_usage(s: Session, job: Job, now: datetime) -> None:
    """The placed attempt's hold, from ``now`` (the caller's transaction places it)."""
    allocation = job.allocation or {}
    resources = ((job.spec or {}).get("resources") or {}) if isinstance(job.spec, dict) else {}
    s.add(
        UsageRecord(
            org_id=job.org_id,
            user_id=job.user_id,
            job_id=job.id,
            attempt=job.attempt,
            category=job.category or "train",
            cpus=float(allocation.get("cpus") or 0.0),
            memory=int(allocation.get("memory") or 0),
            gpus=len(allocation.get("gpus") or []),
            gpu_type=str(resources.get("gpu_type") or ""),
            start_ts=now.timestamp(),
        )
    )


def unbill_usage(s: Session, job_id: str, seconds: float, until: datetime) -> None:
    """The job's open hold starts ``seconds`` later: what its start spent on a shared runtime's build (the
    platform's cost, not the job's: whichever job needs a runtime first builds it, the others wait for it). Never
    past ``until``, the moment its command started: a hold is billed at least from then, whatever a shim says."""
    if seconds <= 0:
        return
    u = UsageRecord
    later, bound = u.start_ts + seconds, until.timestamp()
    start = case((later <= bound, later), (u.start_ts < bound, bound), else_=u.start_ts)
    s.execute(update(u).where(u.job_id == job_id, u.end_ts.is_(None)).values(start_ts=start))


def close_usage(s: Session, job_id: str, now: datetime) -> None:
    """The job's open hold ends ``now`` (the caller's transaction releases it), with what it used as sampled."""
    u = UsageRecord
    s.execute(
        update(u)
        .where(u.job_id == job_id, u.end_ts.is_(None))
        .values(end_ts=now.timestamp(), used_cpu_seconds=_used_cpu(u), peak_memory=_peak_memory(u))
    )


def close_usage_many(s: Session, ends: list[tuple[str, float]]) -> None:
    """``close_usage`` for many jobs in one statement: each (job id, end as seconds since the epoch)."""
    if not ends:
        return
    table = cast(Table, UsageRecord.__table__)
    u = table.c
    statement = (
        update(table)
        .where(u.job_id == bindparam("b_job_id"), u.end_ts.is_(None))
        .values(end_ts=bindparam("b_end_ts"), used_cpu_seconds=_used_cpu(u), peak_memory=_peak_memory(u))
    )
    s.execute(statement, [{"b_job_id": job_id, "b_end_ts": end} for job_id, end in ends])


class UsageService:
    def __init__(self, db: Database, currency: str = "") -> None:
        """``currency``: what prices and costs are in (KILN_CURRENCY, an ISO 4217 code; "" when not set)."""
        self.db = db
        self.currency = currency or None

    # -- prices ---------------------------------------------------------------------------------------------

    def set_prices(self, principal: Principal, body: PriceSet) -> PriceVersion:
        """A new price version from now on: the rates given, the others carried over from the current one."""
        principal.require("prices:set")
        given: dict[tuple[str, str, str], float] = {}
        category = body.category or "*"
        if body.cpu_hour is not None:
            given[(category, "cpu", "*")] = body.cpu_hour
        if body.memory_gib_hour is not None:
            given[(category, "memory_gib", "*")] = body.memory_gib_hour
        for gpu_type, rate in body.gpu_hour.items():
            given[(category, "gpu", gpu_type or "*")] = rate
        if not given:
            raise InvalidInput("give at least one rate (cpu_hour, memory_gib_hour, gpu_hour)")
        now = time.time()
        with self.db.transaction() as s:
            versions = _versions(s)
            current = dict(versions[-1][1]) if versions else {}
            if versions and versions[-1][0] >= now:  # a version set in the same instant: this one after it
                now = versions[-1][0] + 0.001
            current.update(given)
            for (cat, resource, gpu_type), rate in current.items():
                s.add(
                    Price(
                        effective_ts=now,
                        category=cat,
                        resource=resource,
                        gpu_type=gpu_type,
                        rate=rate,
                        created_by=principal.user_id,
                    )
                )
        return _version(now, current, self.currency)

    def prices(self, principal: Principal) -> list[PriceVersion]:
        """Every price version, oldest first (any member may see what usage costs)."""
        principal.require("jobs:read")
        with self.db.read() as s:
            return [_version(at, rates, self.currency) for at, rates in _versions(s)]

    # -- reports --------------------------------------------------------------------------------------------

    def report(
        self,
        principal: Principal,
        *,
        org: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        by: str = "user",
        split: str | None = None,
        limit: int | None = None,
    ) -> UsageReport:
        """Usage of the caller's organisation (an org admin), or of ``org`` / every organisation (the platform
        admin), in [since, until) (default the last 30 days), grouped ``by`` and, with ``split``, by that too
        (cost per day by user: by=day, split=user); ``limit``: the first rows only (by cost, or by day), the
        totals still of them all."""
        principal.require("usage:read")
        for field, value in (("by", by), ("split", split)):
            if value is not None and value not in GROUPS:
                raise InvalidInput(f"{field}: one of {', '.join(GROUPS)}", details={"field": field})
        if split == by:
            raise InvalidInput("split: a group other than by's", details={"field": "split"})
        now = time.time()
        end = min((until or datetime.now(UTC)).timestamp(), now)
        start = (since or datetime.now(UTC) - timedelta(days=30)).timestamp()
        if start >= end:
            raise InvalidInput("since: must be before until (and before now)", details={"field": "since"})
        keys = [by] if split is None else [by, split]
        # one snapshot: the usage task adds settled holds into usage_hours between the report's parts otherwise
        with self.db.read(snapshot=True) as s:
            org_id = self._org_scope(s, principal, org)
            found = self._figures(s, org_id, start, end, now, keys, _versions(s))
            names = {group: self._names(s, group, list({k[i] for k, _ in found})) for i, group in enumerate(keys)}
            owners = self._owners(s, [k[0] for k, _ in found]) if by == "job" else {}
        out = [
            UsageRow(
                key=key[0],
                name=names[by].get(key[0], key[0]),
                split=key[1] if split else None,
                split_name=names[split].get(key[1], key[1]) if split else None,
                attempts=int(v[0]),
                cpu_seconds=v[1],
                memory_gib_seconds=v[2],
                gpu_seconds=v[3],
                cost=round(v[4], 6),
                used_cpu_seconds=v[5],
                peak_memory_bytes=int(v[6]),
                **owners.get(key[0], {}),
            )
            for key, v in found
        ]
        if by == "day":
            out.sort(key=lambda r: (r.key, -r.cost, r.split or ""))
        else:
            out.sort(key=lambda r: (-r.cost, -r.cpu_seconds, r.key, r.split or ""))
        return UsageReport(
            by=by,
            split=split,
            since=datetime.fromtimestamp(start, UTC),
            until=datetime.fromtimestamp(end, UTC),
            org=org,
            rows=out[:limit] if limit is not None else out,
            cpu_seconds=sum(r.cpu_seconds for r in out),
            memory_gib_seconds=sum(r.memory_gib_seconds for r in out),
            gpu_seconds=sum(r.gpu_seconds for r in out),
            cost=round(sum(r.cost for r in out), 6),
            used_cpu_seconds=sum(r.used_cpu_seconds for r in out),
            currency=self.currency,
        )

    @staticmethod
    def settle(s: Session) -> int:
        """Write again what the holds that ended lately used, from their metrics (some arrive after the end), in
        the leased task ``usage``'s transaction ``s``; how many holds."""
        u = UsageRecord
        result = s.execute(
            update(u)
            .where(u.end_ts > time.time() - SETTLE_SECONDS - 2 * SETTLE_PASS_SECONDS)
            .values(used_cpu_seconds=_used_cpu(u), peak_memory=_peak_memory(u))
        )
        return int(getattr(result, "rowcount", 0) or 0)

    def by_org(self, s: Session, start: float, end: float) -> dict[str, tuple[float, ...]]:
        """Per organisation name: CPU-, GiB- and GPU-seconds held and cost in [start, end) (``/metrics``)."""
        found = self._figures(s, None, start, end, end, ["org"], _versions(s))
        names = self._names(s, "org", [key[0] for key, _ in found])
        return {names.get(key[0], key[0]): figures[1:5] for key, figures in found}

    def cost(self, s: Session, org_id: str, user_id: str | None, start: float, end: float) -> float:
        """What the organisation (or one member) spent in [start, end) under the price table."""
        found = self._figures(s, org_id, start, end, end, ["org"], _versions(s), user_id=user_id)
        return sum(figures[4] for _, figures in found)

    def _org_scope(self, s: Session, principal: Principal, org: str | None) -> str | None:
        """The organisation id the report covers; None: every one (the platform admin's, without ``org``)."""
        if org is None:
            return None if principal.platform_admin else principal.org_id
        found = s.scalar(select(Organization.id).where(or_(Organization.name == org, Organization.id == org)))
        if found is None or (found != principal.org_id and not principal.platform_admin):
            raise NotFound(f"organisation {org} not found")
        return str(found)

    def _sums(
        self,
        s: Session,
        org_id: str | None,
        start: float,
        end: float,
        now: float,
        keys: list[str],
        versions: Versions,
        *,
        user_id: str | None = None,
        select_holds: Selection | None = None,
    ) -> list[tuple[tuple[str, ...], tuple[float, ...]]]:
        """Per group of ``keys``: holds, CPU-, GiB- and GPU-seconds held, cost, CPU-seconds used and the peak
        memory, of each hold's overlap with [start, end) (with "day" among the keys: with each UTC day's).
        ``select_holds``: the queries that find the holds (default: every hold that overlaps, by the indexes on
        start and end). A hold counts (``attempts``) in the window, or day, it began in."""
        u = UsageRecord
        dialect = self.db.dialect
        lo: Any
        hi: Any
        if "day" in keys:  # the days as rows, each hold joined to those it overlaps
            bounds = _days(start, end)
            days = union_all(
                *(
                    select(
                        literal(datetime.fromtimestamp(a, UTC).strftime("%Y-%m-%d"), String).label("day"),
                        literal(a, Float).label("lo"),
                        literal(b, Float).label("hi"),
                    )
                    for a, b in bounds
                )
            ).subquery("days")
            lo, hi = days.c.lo, days.c.hi
        else:
            lo, hi = literal(start), literal(end)
        closed_at = func.coalesce(u.end_ts, literal(now))
        held_from = _greatest(dialect, u.start_ts, lo)
        held_to = _least(dialect, closed_at, hi)
        held = _greatest(dialect, held_to - held_from, literal(0.0))
        memory_gib = u.memory / float(GIB)
        cost: ColumnElement[Any] = literal(0.0)
        for i, (at, rates) in enumerate(versions):
            until = versions[i + 1][0] if i + 1 < len(versions) else math.inf
            v_start = _greatest(dialect, held_from, literal(at))
            v_end = held_to if until == math.inf else _least(dialect, held_to, literal(until))
            overlap = _greatest(dialect, v_end - v_start, literal(0.0))
            per_hour = u.cpus * _rate(rates, "cpu") + memory_gib * _rate(rates, "memory_gib")
            per_hour = per_hour + u.gpus * _rate(rates, "gpu")
            cost = cost + overlap / 3600.0 * per_hour
        # Used CPU-seconds in the window: the hold's (as sampled; read from its metrics while it holds and until
        # it is settled) times the share of the hold the window has.
        duration = _greatest(dialect, closed_at - u.start_ts, literal(1e-9))
        live = or_(u.end_ts.is_(None), u.end_ts > now - SETTLE_SECONDS)
        used = case((live, _used_cpu(u)), else_=u.used_cpu_seconds)
        peak = case((live, _peak_memory(u)), else_=u.peak_memory)
        columns = {
            "org": u.org_id,
            "user": u.user_id,
            "job": u.job_id,
            "category": u.category,
            "gpu_type": u.gpu_type,
            "day": days.c.day if "day" in keys else literal("day"),
        }
        group = [columns[k] for k in keys]
        counted = func.sum(case((u.start_ts >= lo, 1), else_=0))  # holds that began in the window (or day)
        query = select(
            *group,
            counted,
            func.sum(held * u.cpus),
            func.sum(held * memory_gib),
            func.sum(held * u.gpus),
            func.sum(cost),
            func.sum(func.coalesce(used, 0.0) * held / duration),
            func.max(func.coalesce(peak, 0)),
        )
        if "day" in keys:
            query = query.select_from(u).join(days, and_(u.start_ts < days.c.hi, closed_at > days.c.lo))
        if org_id is not None:
            query = query.where(u.org_id == org_id)
        if user_id is not None:
            query = query.where(u.user_id == user_id)
        query = query.group_by(*group)
        selections = (select_holds or _overlapping)(start, end)
        n = len(keys)
        return _merge(
            [
                [
                    (tuple(str(x) for x in row[:n]), tuple(float(x or 0.0) for x in row[n:]))
                    for row in s.execute(query.where(*where))
                ]
                for where in selections
            ]
        )

    def _figures(
        self,
        s: Session,
        org_id: str | None,
        start: float,
        end: float,
        now: float,
        keys: list[str],
        versions: Versions,
        *,
        user_id: str | None = None,
    ) -> list[tuple[tuple[str, ...], tuple[float, ...]]]:
        """``_sums`` of [start, end), its whole hours read from usage_hours where it has any (and the report is
        not by job): those, plus the holds not settled yet, plus the settled holds' part-hours at each edge."""
        hours = None if "job" in keys else whole_hours(start, end)
        if hours is None:
            return self._sums(s, org_id, start, end, now, keys, versions, user_id=user_id)
        first, last = hours
        parts = [
            *usage_hours.settled_sums(s, org_id, user_id, first, last, keys),
            self._sums(s, org_id, start, end, now, keys, versions, user_id=user_id, select_holds=_unsettled),
        ]
        edges = ((start, first, _settled_at_start), (last, end, _settled_at_end))  # the part-hours
        for lo, hi, select_holds in edges:
            if lo < hi:
                parts.append(
                    self._sums(s, org_id, lo, hi, now, keys, versions, user_id=user_id, select_holds=select_holds)
                )
        return _merge(parts)

    def roll(self, s: Session, batch: int = usage_hours.ROLL_BATCH) -> int:
        """Add the settled holds into usage_hours (the leased task ``usage``, in its transaction ``s``)."""
        return usage_hours.roll(s, _versions(s), time.time() - SETTLE_SECONDS - 2 * SETTLE_PASS_SECONDS, batch)

    @staticmethod
    def _owners(s: Session, job_ids: list[str]) -> dict[str, dict[str, str]]:
        """Whose each job is: its user's and organisation's ids and names (a by-job report's rows)."""
        query = (
            select(Job.id, Job.user_id, User.name, Job.org_id, Organization.name)
            .outerjoin(User, User.id == Job.user_id)
            .outerjoin(Organization, Organization.id == Job.org_id)
        )
        return {
            job_id: {"user_id": user_id, "user_name": user_name, "org_id": org_id, "org_name": org_name}
            for ids in _chunks(job_ids)
            for job_id, user_id, user_name, org_id, org_name in s.execute(query.where(Job.id.in_(ids)))
        }

    @staticmethod
    def _names(s: Session, by: str, keys: list[str]) -> dict[str, str]:
        columns = {"org": (Organization.id, Organization.name), "user": (User.id, User.name), "job": (Job.id, Job.name)}
        if by not in columns:
            return {}
        key, name = columns[by]
        return {k: n or k for ids in _chunks(keys) for k, n in s.execute(select(key, name).where(key.in_(ids)))}


def _chunks(keys: list[str], size: int = 1000) -> list[list[str]]:
    """``keys`` (deduplicated, sorted) in lists of ``size``: a report by job may name more jobs than SQLite takes
    bound parameters in one statement (32,766)."""
    unique = sorted(set(keys))
    return [unique[i : i + size] for i in range(0, len(unique), size)]


# The holds one part of a report reads, as lists of WHERE clauses (one query each, results added): each list
# picks holds by an index (on start, on end, on the unsettled, on the long ones) rather than scanning them all.
Selection = Callable[[float, float], list[list[ColumnElement[bool]]]]


def _overlapping(lo: float, hi: float) -> list[list[ColumnElement[bool]]]:
    """Every hold that overlaps [lo, hi): those that began in it, those that began before and held into it."""
    u = UsageRecord
    return [
        [u.start_ts >= lo, u.start_ts < hi],
        [u.start_ts < lo, or_(u.end_ts.is_(None), u.end_ts > lo)],
    ]


def _unsettled(lo: float, hi: float) -> list[list[ColumnElement[bool]]]:
    """The holds not in usage_hours yet (open, or ended lately) that overlap [lo, hi)."""
    u = UsageRecord
    return [[u.rolled.is_(False), u.start_ts < hi, or_(u.end_ts.is_(None), u.end_ts > lo)]]


def _settled_at_start(lo: float, hi: float) -> list[list[ColumnElement[bool]]]:
    """The settled holds that overlap [lo, hi), the part-hour before a report's first whole hour: those that began
    in it, the short ones that ended within a day after ``lo`` and the long ones (by their own index)."""
    u = UsageRecord
    return [
        [u.rolled.is_(True), u.start_ts >= lo, u.start_ts < hi],
        [u.rolled.is_(True), u.start_ts < lo, u.end_ts > lo, u.end_ts < lo + LONG_HOLD],
        [u.long_hold.is_(True), u.start_ts < lo, u.end_ts >= lo + LONG_HOLD],
    ]


def _settled_at_end(lo: float, hi: float) -> list[list[ColumnElement[bool]]]:
    """The settled holds that overlap [lo, hi), the part-hour after a report's last whole hour (recent: those
    that ended after ``lo`` are few)."""
    u = UsageRecord
    return [
        [u.rolled.is_(True), u.start_ts >= lo, u.start_ts < hi],
        [u.rolled.is_(True), u.start_ts < lo, u.end_ts > lo],
    ]


def _merge(
    parts: list[list[tuple[tuple[str, ...], tuple[float, ...]]]],
) -> list[tuple[tuple[str, ...], tuple[float, ...]]]:
    """Parts of a report added up per group (the peak: the highest)."""
    found: dict[tuple[str, ...], list[float]] = {}
    for part in parts:
        for key, figures in part:
            total = found.get(key)
            if total is None:
                found[key] = list(figures)
            else:
                found[key] = [a + b for a, b in zip(total[:-1], figures[:-1], strict=True)] + [
                    max(total[-1], figures[-1])
                ]
    return [(key, tuple(figures)) for key, figures in found.items()]


def _used_cpu(u: Any) -> Any:
    """The CPU-seconds the hold's workers used so far: their ``system/cpu_seconds`` (each a running total of its
    attempt) sampled since the hold began."""
    m = MetricSeries
    return (
        select(func.sum(m.last_value))
        .where(m.job_id == u.job_id, m.name == CPU_SECONDS, m.last_time >= u.start_ts)
        .scalar_subquery()
    )


def _peak_memory(u: Any) -> Any:
    """The workers' peak resident memory together (each one's peak over the job's attempts, summed)."""
    m = MetricSeries
    return select(func.sum(m.max_value)).where(m.job_id == u.job_id, m.name == RSS_BYTES).scalar_subquery()


def _greatest(dialect: str, a: Any, b: Any) -> Any:
    return case((a > b, a), else_=b) if dialect == "sqlite" else func.greatest(a, b)


def _least(dialect: str, a: Any, b: Any) -> Any:
    return case((a < b, a), else_=b) if dialect == "sqlite" else func.least(a, b)


def _rate(rates: dict[tuple[str, str, str], float], resource: str) -> Any:
    """The rate of ``resource`` for each record's category (and GPU type): the most specific the version has."""
    u = UsageRecord
    default = rates.get(("*", resource, "*"), 0.0)
    whens: list[tuple[ColumnElement[bool], float]] = []
    for (category, res, gpu_type), rate in sorted(
        rates.items(), key=lambda item: (item[0][0] == "*", item[0][2] == "*")
    ):
        if res != resource or (category, gpu_type) == ("*", "*"):
            continue
        conditions = []
        if category != "*":
            conditions.append(u.category == category)
        if gpu_type != "*":
            conditions.append(u.gpu_type == gpu_type)
        whens.append((and_(*conditions), rate))
    return case(*whens, else_=default) if whens else literal(default)


def _versions(s: Session) -> list[tuple[float, dict[tuple[str, str, str], float]]]:
    """Every price version (its start, its rates), oldest first."""
    versions: dict[float, dict[tuple[str, str, str], float]] = defaultdict(dict)
    for row in s.scalars(select(Price).order_by(Price.effective_ts, Price.id)):
        versions[row.effective_ts][(row.category, row.resource, row.gpu_type)] = row.rate
    return sorted(versions.items())


def _version(at: float, rates: dict[tuple[str, str, str], float], currency: str | None) -> PriceVersion:
    return PriceVersion(
        currency=currency,
        effective_from=datetime.fromtimestamp(at, UTC),
        rates=[
            PriceRead(category=c, resource=r, gpu_type=g, rate=rate)
            for (c, r, g), rate in sorted(rates.items())
            if r in RESOURCES
        ],
    )


def _days(start: float, end: float) -> list[tuple[float, float]]:
    day = datetime.fromtimestamp(start, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    windows = []
    while day.timestamp() < end:
        nxt = day + timedelta(days=1)
        windows.append((max(start, day.timestamp()), min(end, nxt.timestamp())))
        day = nxt
        if len(windows) > MAX_DAYS:
            raise InvalidInput(f"since: a report by day spans at most {MAX_DAYS} days", details={"field": "since"})
    return windows

"""Usage metering and prices: who held what, for how long, and what it cost.

Every attempt's hold is a ``usage_records`` row, opened in the transaction that places the attempt (STARTING:
``open_usage``, from ``kiln.usecases.lifecycle.transition``) and closed in the one that releases it (its end, a
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
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, case, func, literal, or_, select, update
from sqlalchemy.orm import Session

from kiln.db.session import Database
from kiln.db.tables import Job, Organization, Price, UsageRecord, User
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
from kiln.usecases.identity import Principal

GIB = 1024**3
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


def close_usage(s: Session, job_id: str, now: datetime) -> None:
    """The job's open hold ends ``now`` (the caller's transaction releases it)."""
    s.execute(
        update(UsageRecord)
        .where(UsageRecord.job_id == job_id, UsageRecord.end_ts.is_(None))
        .values(end_ts=now.timestamp())
    )


class UsageService:
    def __init__(self, db: Database) -> None:
        self.db = db

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
        return _version(now, current)

    def prices(self, principal: Principal) -> list[PriceVersion]:
        """Every price version, oldest first (any member may see what usage costs)."""
        principal.require("jobs:read")
        with self.db.read() as s:
            return [_version(at, rates) for at, rates in _versions(s)]

    # -- reports --------------------------------------------------------------------------------------------

    def report(
        self,
        principal: Principal,
        *,
        org: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        by: str = "user",
    ) -> UsageReport:
        """Usage of the caller's organisation (an org admin), or of ``org`` / every organisation (the platform
        admin), in [since, until) (default the last 30 days), grouped ``by``."""
        principal.require("usage:read")
        if by not in GROUPS:
            raise InvalidInput(f"by: one of {', '.join(GROUPS)}", details={"field": "by"})
        now = time.time()
        end = min((until or datetime.now(UTC)).timestamp(), now)
        start = (since or datetime.now(UTC) - timedelta(days=30)).timestamp()
        if start >= end:
            raise InvalidInput("since: must be before until (and before now)", details={"field": "since"})
        with self.db.read() as s:
            org_id = self._org_scope(s, principal, org)
            versions = _versions(s)
            rows: dict[tuple[str, ...], list[float]] = defaultdict(lambda: [0.0] * 5)
            windows = _days(start, end) if by == "day" else [(start, end)]
            for lo, hi in windows:
                for key, values in self._sums(s, org_id, lo, hi, now, by, versions):
                    if by == "day":
                        key = (datetime.fromtimestamp(lo, UTC).strftime("%Y-%m-%d"),)
                    total = rows[key]
                    for i, value in enumerate(values):
                        total[i] += value
            names = self._names(s, by, [k[0] for k in rows])
        out = [
            UsageRow(
                key=key[0],
                name=names.get(key[0], key[0]),
                attempts=int(v[0]),
                cpu_seconds=v[1],
                memory_gib_seconds=v[2],
                gpu_seconds=v[3],
                cost=round(v[4], 6),
            )
            for key, v in rows.items()
        ]
        out.sort(key=lambda r: (r.key,) if by == "day" else (-r.cost, -r.cpu_seconds, r.key))
        return UsageReport(
            by=by,
            since=datetime.fromtimestamp(start, UTC),
            until=datetime.fromtimestamp(end, UTC),
            org=org,
            rows=out,
            cpu_seconds=sum(r.cpu_seconds for r in out),
            memory_gib_seconds=sum(r.memory_gib_seconds for r in out),
            gpu_seconds=sum(r.gpu_seconds for r in out),
            cost=round(sum(r.cost for r in out), 6),
        )

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
        lo: float,
        hi: float,
        now: float,
        by: str,
        versions: list[tuple[float, dict[tuple[str, str, str], float]]],
    ) -> list[tuple[tuple[str, ...], tuple[float, ...]]]:
        u = UsageRecord
        dialect = self.db.dialect
        start = _greatest(dialect, u.start_ts, literal(lo))
        end = _least(dialect, func.coalesce(u.end_ts, literal(now)), literal(hi))
        held = _greatest(dialect, end - start, literal(0.0))
        memory_gib = u.memory / float(GIB)
        cost: ColumnElement[Any] = literal(0.0)
        for i, (at, rates) in enumerate(versions):
            until = versions[i + 1][0] if i + 1 < len(versions) else math.inf
            v_start = _greatest(dialect, start, literal(at))
            v_end = end if until == math.inf else _least(dialect, end, literal(until))
            overlap = _greatest(dialect, v_end - v_start, literal(0.0))
            per_hour = u.cpus * _rate(rates, "cpu") + memory_gib * _rate(rates, "memory_gib")
            per_hour = per_hour + u.gpus * _rate(rates, "gpu")
            cost = cost + overlap / 3600.0 * per_hour
        key = {
            "org": u.org_id,
            "user": u.user_id,
            "job": u.job_id,
            "category": u.category,
            "gpu_type": u.gpu_type,
            "day": literal("day"),
        }[by]
        query = select(
            key,
            func.count(),
            func.sum(held * u.cpus),
            func.sum(held * memory_gib),
            func.sum(held * u.gpus),
            func.sum(cost),
        ).where(u.start_ts < hi, or_(u.end_ts.is_(None), u.end_ts > lo))
        if org_id is not None:
            query = query.where(u.org_id == org_id)
        out: list[tuple[tuple[str, ...], tuple[float, ...]]] = []
        for row in s.execute(query.group_by(key)):
            out.append(((str(row[0]),), tuple(float(x or 0.0) for x in row[1:])))
        return out

    @staticmethod
    def _names(s: Session, by: str, keys: list[str]) -> dict[str, str]:
        if by == "org":
            return dict(s.execute(select(Organization.id, Organization.name).where(Organization.id.in_(keys))).all())
        if by == "user":
            return dict(s.execute(select(User.id, User.name).where(User.id.in_(keys))).all())
        if by == "job":
            return {k: n or k for k, n in s.execute(select(Job.id, Job.name).where(Job.id.in_(keys))).all()}
        return {}


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


def _version(at: float, rates: dict[tuple[str, str, str], float]) -> PriceVersion:
    return PriceVersion(
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

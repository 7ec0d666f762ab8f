"""Settled holds summed by hour and by day, so that a report over a month reads days rather than every attempt.

A hold is settled once its used figures are final (``SETTLE_SECONDS`` after it ended). The leased task ``usage``
then adds it into ``usage_hours`` and ``usage_days`` (``roll``): split at the UTC hours it spans, each piece priced
under the versions in force during it (prices change only from their time on, so a settled hour's cost never
changes), one row per hour (and per day), organisation, user, category and GPU type. A report
(kiln.usecases.usage.usage) sums the whole days of its window from usage_days, the whole hours around them from
usage_hours, and reads the records themselves for the rest: the part-hours at its two edges, and the holds not
settled yet (the open ones and those that ended lately: few).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Table, bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from kiln.db.tables import UsageDay, UsageHour, UsageRecord
from kiln.errors import Conflict

HOUR = 3600
DAY = 86400
LONG_HOLD = 86400.0  # a hold longer than this is marked long_hold: the edges of a report find it by that index
ROLL_BATCH = 20_000  # holds a run of the task adds at most

Rates = dict[tuple[str, str, str], float]
Versions = list[tuple[float, Rates]]
Sums = dict[tuple[int, str, str, str, str], list[float]]  # per period start, org, user, category, GPU type


def rate_of(rates: Rates, resource: str, category: str, gpu_type: str) -> float:
    """The rate of ``resource`` for a hold of ``category`` and ``gpu_type``: the most specific the version has
    (what kiln.usecases.usage.usage's SQL picks alike)."""
    for cat, gpu in ((category, gpu_type), (category, "*"), ("*", gpu_type), ("*", "*")):
        if (cat, resource, gpu) in rates:
            return rates[(cat, resource, gpu)]
    return 0.0


def piece_cost(versions: Versions, record: Any, lo: float, hi: float) -> float:
    """What ``record`` (a usage record, or a row of its columns) held in [lo, hi) cost under the versions in force
    then."""
    cost = 0.0
    memory_gib = record.memory / 1024**3
    for i, (at, rates) in enumerate(versions):
        until = versions[i + 1][0] if i + 1 < len(versions) else math.inf
        overlap = min(hi, until) - max(lo, at)
        if overlap <= 0:
            continue
        per_hour = record.cpus * rate_of(rates, "cpu", record.category, record.gpu_type)
        per_hour += memory_gib * rate_of(rates, "memory_gib", record.category, record.gpu_type)
        per_hour += record.gpus * rate_of(rates, "gpu", record.category, record.gpu_type)
        cost += overlap / 3600.0 * per_hour
    return cost


def roll(s: Session, versions: Versions, settled_before: float, batch: int = ROLL_BATCH) -> int:
    """Add the holds that ended before ``settled_before`` and are not in ``usage_hours`` yet (at most ``batch``),
    in the task's transaction ``s``; how many."""
    u = UsageRecord
    # Oldest first (by the index on the unsettled): a batch touches few hours, and each is read once.
    columns = (u.id, u.org_id, u.user_id, u.category, u.gpu_type, u.cpus, u.memory, u.gpus, u.start_ts, u.end_ts)
    records = s.execute(
        select(*columns, u.used_cpu_seconds, u.peak_memory)
        .where(u.rolled.is_(False), u.end_ts.is_not(None), u.end_ts < settled_before)
        .order_by(u.end_ts)
        .limit(batch)
    ).all()
    if not records:
        return 0
    sums: Sums = {}
    for record in records:
        assert record.end_ts is not None
        duration = max(record.end_ts - record.start_ts, 1e-9)
        hour = int(record.start_ts // HOUR) * HOUR
        while hour < record.end_ts:
            lo, hi = max(record.start_ts, hour), min(record.end_ts, hour + HOUR)
            held = max(hi - lo, 0.0)
            key = (hour, record.org_id, record.user_id, record.category, record.gpu_type)
            total = sums.setdefault(key, [0.0] * 7)
            total[0] += 1 if lo == record.start_ts else 0  # a hold counts in the hour it began
            total[1] += held * record.cpus
            total[2] += held * record.memory / 1024**3
            total[3] += held * record.gpus
            total[4] += piece_cost(versions, record, lo, hi)
            total[5] += (record.used_cpu_seconds or 0.0) * held / duration
            total[6] = max(total[6], float(record.peak_memory or 0))
            hour += HOUR
    days: Sums = {}
    for (hour, *rest), figures in sums.items():
        total = days.setdefault((hour - hour % DAY, *rest), [0.0] * 7)  # type: ignore[arg-type]
        for i in range(6):
            total[i] += figures[i]
        total[6] = max(total[6], figures[6])
    _add(s, UsageHour, sums)
    _add(s, UsageDay, days)
    ids = [r.id for r in records]
    long_ids = [r.id for r in records if r.end_ts is not None and r.end_ts - r.start_ts > LONG_HOLD]
    for chunk_ids, values in [(chunk, {"rolled": True}) for chunk in _chunks(ids, 900)] + [
        (chunk, {"long_hold": True}) for chunk in _chunks(long_ids, 900)
    ]:  # no ORM objects of these rows in the session to keep in step
        marked = s.execute(
            update(u)
            .where(u.id.in_(chunk_ids), u.rolled.is_(False) if "rolled" in values else u.rolled.is_(True))
            .values(**values)
            .execution_options(synchronize_session=False)
        )
        if getattr(marked, "rowcount", len(chunk_ids)) != len(chunk_ids):
            # Another transaction added some of these holds meanwhile (only the task's lease holder should):
            # adding them again would count them twice. Nothing of this one is kept.
            raise Conflict("usage: holds were added into usage_hours by another transaction; try again")
    return len(records)


def _add(
    s: Session, model: type[UsageHour | UsageDay], sums: dict[tuple[int, str, str, str, str], list[float]]
) -> None:
    """Add ``sums`` (per period start, organisation, user, category, GPU type) into ``model``'s rows. Plain
    statements, not ORM objects: a batch touches tens of thousands of rows."""
    table = cast(Table, model.__table__)
    c = table.c
    starts = [key[0] for key in sums]
    existing = {
        (row.at, row.org_id, row.user_id, row.category, row.gpu_type): row
        for row in s.execute(select(table).where(c.at >= min(starts), c.at <= max(starts)))
    }
    inserts: list[dict[str, Any]] = []
    updates: list[dict[str, Any]] = []
    for key, f in sums.items():
        row = existing.get(key)
        if row is None:
            inserts.append(
                {
                    "at": key[0],
                    "day": datetime.fromtimestamp(key[0], UTC).strftime("%Y-%m-%d"),
                    "org_id": key[1],
                    "user_id": key[2],
                    "category": key[3],
                    "gpu_type": key[4],
                    "attempts": int(f[0]),
                    "cpu_seconds": f[1],
                    "memory_gib_seconds": f[2],
                    "gpu_seconds": f[3],
                    "cost": f[4],
                    "used_cpu_seconds": f[5],
                    "peak_memory": int(f[6]),
                }
            )
        else:
            updates.append(
                {
                    "row_id": row.id,
                    "new_attempts": row.attempts + int(f[0]),
                    "new_cpu": row.cpu_seconds + f[1],
                    "new_memory": row.memory_gib_seconds + f[2],
                    "new_gpu": row.gpu_seconds + f[3],
                    "new_cost": row.cost + f[4],
                    "new_used": row.used_cpu_seconds + f[5],
                    "new_peak": max(row.peak_memory, int(f[6])),
                }
            )
    if inserts:
        s.execute(insert(table), inserts)
    if updates:
        s.execute(
            update(table)
            .where(c.id == bindparam("row_id"))
            .values(
                attempts=bindparam("new_attempts"),
                cpu_seconds=bindparam("new_cpu"),
                memory_gib_seconds=bindparam("new_memory"),
                gpu_seconds=bindparam("new_gpu"),
                cost=bindparam("new_cost"),
                used_cpu_seconds=bindparam("new_used"),
                peak_memory=bindparam("new_peak"),
            ),
            updates,
        )


def period_sums(
    s: Session,
    model: type[UsageHour | UsageDay],
    org_id: str | None,
    user_id: str | None,
    lo: int,
    hi: int,
    keys: list[str],
) -> list[tuple[tuple[str, ...], tuple[float, ...]]]:
    """Per group of ``keys`` (org, user, category, gpu_type, day): the settled hours (or days) in [lo, hi)."""
    h = model
    columns: dict[str, Any] = {
        "org": h.org_id,
        "user": h.user_id,
        "category": h.category,
        "gpu_type": h.gpu_type,
        "day": h.day,
    }
    group = [columns[k] for k in keys]
    query = select(
        *group,
        func.sum(h.attempts),
        func.sum(h.cpu_seconds),
        func.sum(h.memory_gib_seconds),
        func.sum(h.gpu_seconds),
        func.sum(h.cost),
        func.sum(h.used_cpu_seconds),
        func.max(h.peak_memory),
    ).where(h.at >= lo, h.at < hi)
    if org_id is not None:
        query = query.where(h.org_id == org_id)
    if user_id is not None:
        query = query.where(h.user_id == user_id)
    n = len(keys)
    return [
        (tuple(str(x) for x in row[:n]), tuple(float(x or 0.0) for x in row[n:]))
        for row in s.execute(query.group_by(*group))
    ]


def settled_sums(
    s: Session, org_id: str | None, user_id: str | None, lo: int, hi: int, keys: list[str]
) -> list[list[tuple[tuple[str, ...], tuple[float, ...]]]]:
    """The settled holds in the whole hours [lo, hi), in parts to add up: its whole days from usage_days, the
    hours before and after them from usage_hours."""
    first_day, last_day = -(-lo // DAY) * DAY, hi // DAY * DAY
    if first_day >= last_day:
        return [period_sums(s, UsageHour, org_id, user_id, lo, hi, keys)]
    parts = [period_sums(s, UsageDay, org_id, user_id, first_day, last_day, keys)]
    for a, b in ((lo, first_day), (last_day, hi)):
        if a < b:
            parts.append(period_sums(s, UsageHour, org_id, user_id, a, b, keys))
    return parts


def whole_hours(start: float, end: float) -> tuple[int, int] | None:
    """The whole UTC hours inside [start, end), or None where there is none."""
    lo, hi = math.ceil(start / HOUR) * HOUR, math.floor(end / HOUR) * HOUR
    return (int(lo), int(hi)) if hi > lo else None


def _chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]

"""A job's metrics budget enforced where every point passes: the writer (``metrics_store``), whichever path the
points came by (the spool files the SDK and the shim's log and TensorBoard extraction write, HTTP appends with the
job's token, MLflow's log-batch, a service's request metrics). The ingester enforces the two limits that are about
reading spool files (``line``, ``spool``) and tells this module when it meets them (``note``).

The limits are ``metrics.limits`` of the job's stored spec over the operator's defaults, capped by the ceilings
(kiln.domain.metric_limits), read once per job (the spec never changes after submit). What a job has stored
(its series and points) is read once, when the writer first sees the job, and counted on from there; so is which
limits were reported, so that each is reported by one event per job (not per batch, and not again after a
restart). With several servers on PostgreSQL each counts what it stores on top of what it read: a job written
by two at once may pass a limit by what the other stored meanwhile (a batch or two), never by more.

Past ``series``: points of new series are dropped; the existing series keep receiving points (a job that logs
a name per step must not silence its loss curve). Past ``points``: further points are dropped, or, with
``on_limit: sample``, every ``sample_every``-th point of each series is kept (counted per series from where the
limit was met, in this server's memory: after a restart the count starts again).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from kiln.db.session import Database
from kiln.db.tables import Job, JobEvent, MetricSeries
from kiln.domain.metric_limits import CEILINGS, DEFAULTS, MetricLimits, resolve
from kiln.domain.stored_spec import StoredSpec
from kiln.metrics.parse import Columns, Parsed

LIMIT_REASON = "MetricsLimitExceeded"
CACHED_JOBS = 10_000  # jobs whose limits and usage are kept; past it the cache starts again (read anew)

SeriesCache = dict[tuple[str, str, str], tuple[int, str]]


def limits_from_settings(settings: Any) -> tuple[MetricLimits, MetricLimits]:
    """(defaults, ceilings) from the server's settings (``KILN_METRICS_*``)."""
    defaults = MetricLimits(
        series=settings.metrics_series_default,
        points=settings.metrics_points_default,
        line=settings.metrics_line_default,
        spool=settings.metrics_spool_default,
    )
    ceilings = MetricLimits(
        series=settings.metrics_max_series,
        points=settings.metrics_max_points,
        line=settings.metrics_max_line,
        spool=settings.metrics_max_spool,
    )
    return defaults, ceilings


@dataclass
class _Usage:
    limits: MetricLimits
    series: int
    points: int
    reported: set[str]
    sampled: dict[tuple[str, str], int] = field(default_factory=dict)  # per series: points met past the limit


@dataclass
class Admitted:
    """What a write may store of its batches, and what it changes once committed (``MetricBudgets.commit``)."""

    batches: list[tuple[str, Parsed, bool]]
    events: list[tuple[str, str]] = field(default_factory=list)  # (job id, message)
    _reported: list[tuple[str, str]] = field(default_factory=list)  # (job id, limit)
    _counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # job id -> (new series, points)
    _sampled: dict[tuple[str, tuple[str, str]], int] = field(default_factory=dict)
    _notes: list[tuple[str, str, str]] = field(default_factory=list)


class MetricBudgets:
    """Every job's limits and what it has stored, as the writer counts them (used under the writer's lock)."""

    def __init__(self, db: Database, defaults: MetricLimits = DEFAULTS, ceilings: MetricLimits = CEILINGS) -> None:
        self.db = db
        self.defaults = defaults
        self.ceilings = ceilings
        self._limits: dict[str, MetricLimits] = {}
        self._usage: dict[str, _Usage] = {}
        self._not_jobs: set[str] = set()
        self._notes: list[tuple[str, str, str]] = []  # (job id, limit, message) met by the ingester, to write
        self._notes_lock = threading.Lock()
        self.dropped = 0  # points dropped past a limit since start

    def limits(self, job_id: str) -> MetricLimits:
        """The job's limits (the operator's defaults for an id that is no job: an MLflow run's)."""
        found = self._limits.get(job_id)
        if found is None:
            with self.db.read() as s:
                row = s.execute(select(Job.spec).where(Job.id == job_id)).first()
            if row is None:
                self._not_jobs.add(job_id)  # an MLflow run's id: limited, but it has no events to write
            section = StoredSpec(row[0]).metrics.get("limits") if row is not None else None
            found = resolve(section if isinstance(section, Mapping) else None, self.defaults, self.ceilings)
            if len(self._limits) >= CACHED_JOBS:
                self._limits.clear()
                self._not_jobs.clear()
            self._limits[job_id] = found
        return found

    def note(self, job_id: str, limit: str, message: str) -> bool:
        """A limit the ingester met (``line``, ``spool``): reported by the next write, unless it was already.
        True where it is waiting for a write now."""
        usage = self._usage.get(job_id)
        if usage is not None and limit in usage.reported:
            return False
        with self._notes_lock:
            if not any(n[0] == job_id and n[1] == limit for n in self._notes):
                self._notes.append((job_id, limit, message))
        return True

    def full(self, job_id: str) -> bool:
        """Has the job (as this server counted it) as many series as it may? False where not known yet."""
        usage = self._usage.get(job_id)
        return usage is not None and usage.series >= usage.limits.series

    def _load(self, job_id: str, series: SeriesCache) -> _Usage:
        usage = self._usage.get(job_id)
        if usage is not None:
            return usage
        limits = self.limits(job_id)
        c = MetricSeries
        with self.db.read() as s:
            rows = s.execute(select(c.id, c.worker, c.name, c.axis, c.count).where(c.job_id == job_id)).all()
            messages = s.scalars(
                select(JobEvent.message).where(JobEvent.job_id == job_id, JobEvent.reason == LIMIT_REASON)
            ).all()
        # Every series of the job is known from here on: a name missing from the cache is a new series, and
        # a job at its series limit costs no query per batch for the names it is refused.
        for sid, worker, name, axis, _ in rows:
            series[(job_id, worker, name)] = (sid, axis)
        reported = {m.rsplit("(metrics.limits.", 1)[1].rstrip(")") for m in messages if "(metrics.limits." in m}
        usage = _Usage(limits, len(rows), sum(r[4] or 0 for r in rows), reported)
        if len(self._usage) >= CACHED_JOBS:
            self._usage.clear()
        self._usage[job_id] = usage
        return usage

    def admit(self, batches: list[tuple[str, Parsed, bool]], series: SeriesCache) -> Admitted:
        """The batches as the jobs' budgets let them be stored (same order and length), with the events of
        limits met for the first time. Nothing is counted until ``commit``."""
        out = Admitted([])
        with self._notes_lock:
            out._notes = list(self._notes)
        for job_id, parsed, gang in batches:
            usage = self._load(job_id, series) if parsed.series else self._usage.get(job_id)
            if usage is None:
                out.batches.append((job_id, parsed, gang))
                continue
            new_series, points = out._counts.get(job_id, (0, 0))
            kept, new_series, points = self._admit_one(out, job_id, usage, parsed, series, new_series, points)
            out._counts[job_id] = (new_series, points)
            out.batches.append((job_id, kept, gang))
        for job_id, limit, message in out._notes:
            self._load(job_id, series)  # what it reported already (after a restart: from its events)
            self._report(out, job_id, limit, message)
        return out

    def _admit_one(
        self,
        out: Admitted,
        job_id: str,
        usage: _Usage,
        parsed: Parsed,
        series: SeriesCache,
        new_series: int,
        points: int,
    ) -> tuple[Parsed, int, int]:
        limits = usage.limits
        kept = Parsed(events=parsed.events, errors=parsed.errors, first_error=parsed.first_error)
        refused = dropped = 0
        for key, columns in parsed.series.items():
            n = len(columns)
            room = max(0, limits.points - usage.points - points)
            if n <= room:
                take: Columns | None = columns
            else:
                take = self._past_points(out, job_id, usage, key, columns, room)
                dropped += n - (len(take) if take is not None else 0)
                self._report(
                    out,
                    job_id,
                    "points",
                    f"points limit {limits.points} reached: {usage.points + points + room} points stored, further "
                    + (
                        f"points sampled, 1 in {limits.sample_every} kept"
                        if limits.on_limit == "sample"
                        else "points dropped"
                    )
                    + " (metrics.limits.points)",
                )
            if take is None:
                continue
            if (job_id, *key) not in series:
                if usage.series + new_series >= limits.series:
                    refused += 1
                    dropped += len(take)
                    continue
                new_series += 1
            kept.series[key] = take
            points += len(take)
        if refused or parsed.refused:
            self._report(
                out,
                job_id,
                "series",
                f"series limit {limits.series} reached: {usage.series + new_series} series stored, new series "
                "dropped (metrics.limits.series)",
            )
        self.dropped += dropped + parsed.refused
        return kept, new_series, points

    @staticmethod
    def _past_points(
        out: Admitted, job_id: str, usage: _Usage, key: tuple[str, str], columns: Columns, room: int
    ) -> Columns | None:
        """What is kept of a series' points of which only ``room`` fit: those, and with ``on_limit: sample``
        every ``sample_every``-th of the rest (counted on from the series' earlier batches)."""
        limits = usage.limits
        keep = list(range(room))
        if limits.on_limit == "sample":
            seen = out._sampled.get((job_id, key), usage.sampled.get(key, 0))
            every = limits.sample_every
            past = len(columns) - room
            first = (every - 1 - seen) % every  # the index (past the room) of the next point to keep
            keep.extend(room + i for i in range(first, past, every))
            out._sampled[(job_id, key)] = seen + past
        if not keep:
            return None
        taken = Columns(columns.source)
        taken.steps = [columns.steps[i] for i in keep]
        taken.times = [columns.times[i] for i in keep]
        taken.values = [columns.values[i] for i in keep]
        taken.texts = [columns.texts[i] for i in keep]
        return taken

    def _report(self, out: Admitted, job_id: str, limit: str, message: str) -> None:
        usage = self._usage.get(job_id)
        if (usage is not None and limit in usage.reported) or (job_id, limit) in out._reported:
            return
        out._reported.append((job_id, limit))
        if job_id not in self._not_jobs:
            out.events.append((job_id, message))

    def commit(self, admitted: Admitted) -> None:
        """The write of ``admitted`` committed: count what it stored and reported."""
        for job_id, (new_series, points) in admitted._counts.items():
            usage = self._usage.get(job_id)
            if usage is not None:
                usage.series += new_series
                usage.points += points
        for (job_id, key), seen in admitted._sampled.items():
            usage = self._usage.get(job_id)
            if usage is not None:
                usage.sampled[key] = seen
        for job_id, limit in admitted._reported:
            usage = self._usage.get(job_id)
            if usage is not None:
                usage.reported.add(limit)
        if admitted._notes:
            with self._notes_lock:
                self._notes = [n for n in self._notes if n not in admitted._notes]

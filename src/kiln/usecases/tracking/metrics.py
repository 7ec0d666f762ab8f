"""Metrics use cases: ingest over HTTP, query (downsampled), summaries, comparisons across jobs, CSV.

Downsampling keeps a series' shape. With more points in range than asked for, the database computes an M4
aggregation (per bucket of the x range: the first, last, lowest and highest point; ``GROUP BY bucket`` and a join
back to the rows that hold those values) and LTTB takes that down to the number asked for; the global first,
last, lowest and highest points are always kept. A long series is aggregated from its chunk summaries
(``metric_chunks``: the M4 points of every 128 consecutive points, kept up to date at ingestion), so a query over
a million points reads a few thousand rows; the chunks that straddle a step_min/step_max bound are read point by
point.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from kiln.db.session import Database
from kiln.db.tables import MetricChunk, MetricPoint, MetricSeries, Run
from kiln.domain import limits
from kiln.domain.schemas import MetricSeriesData, MetricSeriesSummary, MetricsIngested
from kiln.errors import InvalidInput, NotFound
from kiln.metrics.downsample import Point, m4, shape_preserving
from kiln.metrics.parse import parse_lines
from kiln.metrics.store import CHUNK, MetricsStore
from kiln.usecases.access.identity import Principal
from kiln.usecases.jobs.jobs import JobService

RAW_M4_LIMIT = 100_000  # up to this many points in range, M4 runs over the points themselves
MAX_DOWNSAMPLE = limits.MAX_DOWNSAMPLE
MAX_RAW = 500_000  # points of one series without downsampling
MAX_SERIES = 1000  # per request
CSV_HEADER = ["job_id", "worker", "name", "step", "time", "value"]


class PointBudget:
    """The points one request may still return (limits.MAX_METRIC_POINTS over all its series): charged before a
    series' points are read, so that no query builds more than that, whatever its downsample and series count."""

    def __init__(self) -> None:
        self.left = limits.MAX_METRIC_POINTS

    def charge(self, series: MetricSeries, points: int) -> None:
        if points > self.left:
            raise InvalidInput(
                f"{series.name}: over {limits.MAX_METRIC_POINTS} points in one request; ask for fewer series "
                "(names, worker), a narrower step_min/step_max or a smaller downsample",
                details={"field": "downsample"},
            )
        self.left -= points


@dataclass
class SeriesQuery:
    names: list[str] | None = None
    worker: str | None = None
    step_min: int | None = None
    step_max: int | None = None
    downsample: int | None = None


def _value(kind: str, value: float | None, text_value: str | None) -> float | str | None:
    """What a point's value is in a response: a finite number, a string for text and for non-finite numbers."""
    if value is not None:
        return value
    return text_value


def _bucket_sql(dialect: str, expr: str) -> str:
    # Non-negative by construction (x >= lo): truncation is the floor. PostgreSQL's CAST rounds, so floor first.
    return f"CAST(FLOOR({expr}) AS BIGINT)" if dialect == "postgresql" else f"CAST({expr} AS INTEGER)"


class MetricsService:
    def __init__(
        self,
        db: Database,
        jobs: JobService,
        store: MetricsStore,
        on_ingested: Callable[[set[str]], None] | None = None,
    ) -> None:
        self.db = db
        self.jobs = jobs
        self.store = store
        self.on_ingested = on_ingested  # after points were stored, with their job

    # -- writing --------------------------------------------------------------------------------------

    def ingest(self, principal: Principal, job_id: str, body: bytes) -> MetricsIngested:
        """Store ndjson spool lines sent over HTTP (a job on a remote backend; or a member importing)."""
        principal.require("jobs:report" if principal.job_id is not None else "jobs:write")
        with self.db.read() as s:
            job = self.jobs.load(s, principal, job_id)
            gang = (job.workers or 1) > 1
        parsed = parse_lines(body)
        stored = self.store.append([(job_id, parsed, gang)]) if (parsed.series or parsed.events) else 0
        if parsed.series and self.on_ingested is not None:
            self.on_ingested({job_id})  # a trial's report: its pruner judges it now
        return MetricsIngested(points=stored, events=len(parsed.events), errors=parsed.errors)

    # -- reading --------------------------------------------------------------------------------------

    def _series(self, s: Session, job_id: str, q: SeriesQuery) -> list[MetricSeries]:
        query = select(MetricSeries).where(MetricSeries.job_id == job_id)
        if q.names:
            query = query.where(MetricSeries.name.in_(q.names))
        if q.worker:
            query = query.where(MetricSeries.worker == q.worker)
        return list(s.scalars(query.order_by(MetricSeries.name, MetricSeries.worker).limit(MAX_SERIES)))

    def query(self, principal: Principal, job_id: str, q: SeriesQuery) -> list[MetricSeriesData]:
        principal.require("jobs:read")
        _check(q)
        budget = PointBudget()
        with self.db.read() as s:
            self.jobs.load(s, principal, job_id)
            return [self._data(s, series, q, budget) for series in self._series(s, job_id, q)]

    def compare(self, principal: Principal, job_ids: list[str], q: SeriesQuery) -> dict[str, list[MetricSeriesData]]:
        """The same series of several jobs. Every job is checked first: one the caller cannot see fails the
        whole request (404), so nothing of the others is sent either."""
        principal.require("jobs:read")
        _check(q)
        if not job_ids or len(job_ids) > limits.MAX_COMPARE_JOBS:
            raise InvalidInput(f"jobs: give 1 to {limits.MAX_COMPARE_JOBS} job ids", details={"field": "jobs"})
        budget = PointBudget()
        with self.db.read() as s:
            for job_id in job_ids:
                self.jobs.load(s, principal, job_id)
            return {job_id: [self._data(s, x, q, budget) for x in self._series(s, job_id, q)] for job_id in job_ids}

    def compare_runs(
        self, principal: Principal, run_ids: list[str], q: SeriesQuery
    ) -> dict[str, list[MetricSeriesData]]:
        """The same series of several runs (MLflow's): a job's run is its job, a run logged from outside Kiln keeps
        its series under its own id. Reading needs ``runs:read``; a job's token reads its own job's run only. Every
        run is checked first: one that does not exist or is another organisation's fails the whole request (404),
        so nothing of the others is sent either."""
        if principal.job_id is None:
            principal.require("runs:read")
        _check(q)
        if not run_ids or len(run_ids) > limits.MAX_COMPARE_JOBS:
            raise InvalidInput(f"run: give 1 to {limits.MAX_COMPARE_JOBS} run ids", details={"field": "run"})
        budget = PointBudget()
        with self.db.read() as s:
            found = set(s.scalars(select(Run.id).where(Run.id.in_(run_ids), Run.org_id == principal.org_id)))
            for run_id in run_ids:
                if run_id not in found or (principal.job_id is not None and run_id != principal.job_id):
                    raise NotFound(f"run {run_id} not found")
            return {run_id: [self._data(s, x, q, budget) for x in self._series(s, run_id, q)] for run_id in run_ids}

    def summary(self, principal: Principal, job_id: str) -> list[MetricSeriesSummary]:
        principal.require("jobs:read")
        with self.db.read() as s:
            self.jobs.load(s, principal, job_id)
            rows = s.scalars(
                select(MetricSeries)
                .where(MetricSeries.job_id == job_id)
                .order_by(MetricSeries.name, MetricSeries.worker)
                .limit(MAX_SERIES)
            )
            return [
                MetricSeriesSummary(
                    name=r.name,
                    worker=r.worker,
                    kind=r.kind,
                    source=r.source,
                    count=r.count,
                    first_step=r.first_step,
                    last_step=r.last_step,
                    last_time=r.last_time,
                    last_value=_value(r.kind, r.last_value, r.last_text),
                    min=r.min_value,
                    max=r.max_value,
                )
                for r in rows
            ]

    @staticmethod
    def csv_rows(data: dict[str, list[MetricSeriesData]]) -> Iterator[str]:
        """``job_id,worker,name,step,time,value`` lines, the header first."""
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(CSV_HEADER)
        yield buf.getvalue()
        for job_id, series in data.items():
            for one in series:
                buf.seek(0)
                buf.truncate()
                for step, time, value in one.points:
                    writer.writerow([job_id, one.worker, one.name, "" if step is None else step, repr(time), value])
                yield buf.getvalue()

    # -- one series -----------------------------------------------------------------------------------

    def _data(self, s: Session, series: MetricSeries, q: SeriesQuery, budget: PointBudget) -> MetricSeriesData:
        by_step = series.axis == "step"
        ranged = q.step_min is not None or q.step_max is not None
        count = self._count(s, series, q) if ranged else series.count
        want = q.downsample
        if want is None and count > MAX_RAW:
            raise InvalidInput(
                f"{series.name}: {count} points; ask for at most {MAX_RAW} (downsample, or step_min/step_max)",
                details={"field": "downsample"},
            )
        # What the series will return at most: all its points in range, or the downsample (a long text series: every
        # n-th point and its last).
        budget.charge(series, count if want is None or count <= want else want + 1)
        if series.kind == "text" or want is None or count <= want:
            points = self._raw(s, series, q, want if series.kind == "text" else None)
        else:
            candidates = self._m4(s, series, q, want, count)
            points = [
                [int(x) if by_step else None, t, v]
                for x, t, v in shape_preserving(candidates, want)  # type: ignore[misc]
            ]
        return MetricSeriesData.model_construct(  # built from database rows: no validation pass over every point
            name=series.name,
            worker=series.worker,
            kind=series.kind,  # type: ignore[arg-type]
            source=series.source,
            axis=series.axis,  # type: ignore[arg-type]
            count=count,
            points=points,
        )

    @staticmethod
    def _range(q: SeriesQuery) -> tuple[str, dict[str, Any]]:
        where, params = "", {}
        if q.step_min is not None:
            where += " AND step >= :step_min"
            params["step_min"] = q.step_min
        if q.step_max is not None:
            where += " AND step <= :step_max"
            params["step_max"] = q.step_max
        return where, params

    def _count(self, s: Session, series: MetricSeries, q: SeriesQuery) -> int:
        where, params = self._range(q)
        sql = f"SELECT COUNT(*) FROM metric_points WHERE series_id = :sid{where}"
        return int(s.execute(text(sql), {"sid": series.id, **params}).scalar_one())

    def _raw(self, s: Session, series: MetricSeries, q: SeriesQuery, limit: int | None) -> list[list[Any]]:
        p = MetricPoint
        query = select(p.step, p.time, p.value, p.text).where(p.series_id == series.id)
        if q.step_min is not None:
            query = query.where(p.step >= q.step_min)
        if q.step_max is not None:
            query = query.where(p.step <= q.step_max)
        if limit is not None and series.count > limit:  # a long text series: evenly spaced points, and the last
            stride = math.ceil(series.count / limit)
            query = query.where((p.seq % stride == 0) | (p.seq == series.count - 1))
        order = (p.step, p.seq) if series.axis == "step" else (p.seq,)
        return [[step, t, _value(series.kind, v, tx)] for step, t, v, tx in s.execute(query.order_by(*order))]

    def _m4(self, s: Session, series: MetricSeries, q: SeriesQuery, want: int, count: int) -> list[Point]:
        """M4 candidates (x, time, value) of the finite points in range: ``want`` buckets."""
        if count <= RAW_M4_LIMIT or count // CHUNK < want:
            return self._m4_points(s, series, q, want)
        return self._m4_chunks(s, series, q, want)

    def _x(self, series: MetricSeries) -> str:
        return "step" if series.axis == "step" else "time"

    def _m4_points(self, s: Session, series: MetricSeries, q: SeriesQuery, want: int) -> list[Point]:
        x = self._x(series)
        where, params = self._range(q)
        base = f"series_id = :sid AND value IS NOT NULL AND {x} IS NOT NULL{where}"
        lo, hi = s.execute(
            text(f"SELECT MIN({x}), MAX({x}) FROM metric_points WHERE {base}"), {"sid": series.id, **params}
        ).one()
        if lo is None:
            return []
        span = float(hi - lo) or 1.0
        bucket = _bucket_sql(self.db.dialect, f"({x} - :lo) * :nb / :span")
        sql = f"""
            WITH pts AS (
                SELECT {x} AS x, time AS t, value AS v, {bucket} AS b FROM metric_points WHERE {base}
            ), w AS (
                SELECT x, t, v, MIN(x) OVER (PARTITION BY b) AS fx, MAX(x) OVER (PARTITION BY b) AS lx,
                       MIN(v) OVER (PARTITION BY b) AS mn, MAX(v) OVER (PARTITION BY b) AS mx
                FROM pts
            )
            SELECT x, t, v FROM w WHERE x = fx OR x = lx OR v = mn OR v = mx
        """
        # Window functions, not a join of the points to their buckets' summary: SQLite ran that join as a nested
        # loop (0.4 s for a 2,000-point series at 600 buckets; 0.03 s so).
        rows = s.execute(text(sql), {"sid": series.id, "lo": lo, "nb": want, "span": span, **params})
        return m4(((float(a), float(b), float(c)) for a, b, c in rows), float(lo), float(hi), want)

    def _m4_chunks(self, s: Session, series: MetricSeries, q: SeriesQuery, want: int) -> list[Point]:
        lo_bound = q.step_min if q.step_min is not None else -math.inf
        hi_bound = q.step_max if q.step_max is not None else math.inf
        ranged = q.step_min is not None or q.step_max is not None
        params: dict[str, Any] = {"sid": series.id}
        inside = ""
        if ranged:
            inside = " AND first_x >= :lo_b AND last_x <= :hi_b"
            params.update(lo_b=float(max(lo_bound, -1e300)), hi_b=float(min(hi_bound, 1e300)))
        lo, hi = s.execute(
            text(f"SELECT MIN(first_x), MAX(last_x) FROM metric_chunks WHERE series_id = :sid{inside}"), params
        ).one()
        candidates: list[Point] = []
        if lo is not None:
            span = float(hi - lo) or 1.0
            bucket = _bucket_sql(self.db.dialect, "(first_x - :lo) * :nb / :span")
            sql = f"""
                WITH c AS (
                    SELECT first_x, first_t, first_v, last_x, last_t, last_v, min_x, min_t, min_v,
                           max_x, max_t, max_v, {bucket} AS b
                    FROM metric_chunks WHERE series_id = :sid{inside}
                ), w AS (
                    SELECT c.*, MIN(first_x) OVER (PARTITION BY b) AS fx, MAX(last_x) OVER (PARTITION BY b) AS lx,
                           MIN(min_v) OVER (PARTITION BY b) AS mn, MAX(max_v) OVER (PARTITION BY b) AS mx
                    FROM c
                )
                SELECT first_x, first_t, first_v, last_x, last_t, last_v, min_x, min_t, min_v, max_x, max_t, max_v
                FROM w WHERE first_x = fx OR last_x = lx OR min_v = mn OR max_v = mx
            """
            for r in s.execute(text(sql), {**params, "lo": lo, "nb": want, "span": span}):
                candidates.extend(((r[0], r[1], r[2]), (r[3], r[4], r[5]), (r[6], r[7], r[8]), (r[9], r[10], r[11])))
        if ranged:  # the chunks that straddle a bound: their points in range, one by one
            c = MetricChunk
            straddling = select(c.chunk).where(
                c.series_id == series.id,
                c.last_x >= lo_bound,
                c.first_x <= hi_bound,
                (c.first_x < lo_bound) | (c.last_x > hi_bound),
            )
            chunks = list(s.scalars(straddling))
            p = MetricPoint
            x_col = p.step if series.axis == "step" else p.time
            for chunk in chunks:
                query = select(x_col, p.time, p.value).where(
                    p.series_id == series.id,
                    p.seq >= chunk * CHUNK,
                    p.seq < (chunk + 1) * CHUNK,
                    p.value.is_not(None),
                    x_col.is_not(None),
                )
                if q.step_min is not None:
                    query = query.where(p.step >= q.step_min)
                if q.step_max is not None:
                    query = query.where(p.step <= q.step_max)
                candidates.extend((float(a), float(b), float(v)) for a, b, v in s.execute(query))  # type: ignore[arg-type]
        if not candidates:
            return []
        xs = [c[0] for c in candidates]
        return m4(candidates, min(xs), max(xs), want)


def _check(q: SeriesQuery) -> None:
    if q.downsample is not None and not 4 <= q.downsample <= MAX_DOWNSAMPLE:
        raise InvalidInput(f"downsample: between 4 and {MAX_DOWNSAMPLE}", details={"field": "downsample"})

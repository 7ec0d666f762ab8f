"""Runs as search answers them: each run's record with its params, tags and each metric's latest point — all of
them (what MLflow's clients expect), or only a table's columns (``RunColumns``: the console's Runs page shows a few
columns of runs that may have hundreds of params) — and the columns a table shows when none were asked for,
counted in SQL over the page's runs by kiln.domain.run_table's rule (not from every param of every run).

A 10,000-run experiment of 50 params each sent 5,000 params in a page of 100 runs for the 7 columns shown: reading,
encoding and drawing them was most of the page's time (benchmarks/runs_page.py)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import distinct, func, or_, select
from sqlalchemy.orm import Session

from kiln.db.tables import Job, MetricSeries, Run, RunParam, RunTag, User
from kiln.domain import run_table, tracking
from kiln.domain.tracking import MetricPoint as LoggedPoint
from kiln.errors import InvalidInput
from kiln.usecases.jobs.run_rows import millis
from kiln.usecases.tracking.run_marks import trial_marks

MAX_COLUMNS = 100
# The tags a table reads of every run whatever its columns: the state and a trial's objective (kiln.domain.run_table).
TABLE_TAGS = (run_table.STATE_TAG, run_table.OBJECTIVE_TAG, run_table.DIRECTION_TAG)


@dataclass
class RunView:
    id: str
    experiment_id: str
    name: str
    user: str
    status: str
    start_time: int | None
    end_time: int | None
    lifecycle_stage: str
    job_id: str | None
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    metrics: list[LoggedPoint] = field(default_factory=list)  # each metric's latest point
    state: str = ""  # in Kiln's words (kiln.domain.run_table): its job's state, PRUNED, or its status renamed
    objective: str | None = None  # a study trial's: its study's objective metric
    direction: str | None = None  # and whether it is minimized or maximized


@dataclass(frozen=True)
class RunColumns:
    """The params, metrics and tags a search sends of each run (the table's own tags besides)."""

    params: frozenset[str] = frozenset()
    metrics: frozenset[str] = frozenset()
    tags: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, columns: list[str]) -> RunColumns:
        """``params.X``, ``metrics.X``, ``tags.X`` (``attributes.X``: a run's record, always sent)."""
        if len(columns) > MAX_COLUMNS:
            raise InvalidInput(f"columns: at most {MAX_COLUMNS}", details={"field": "columns"})
        found: dict[str, set[str]] = {"params": set(), "metrics": set(), "tags": set(), "attributes": set()}
        for column in columns:
            entity, _, key = column.partition(".")
            if entity not in found or not key or len(key) > tracking.MAX_KEY:
                raise InvalidInput(
                    f"columns: {column[:80]!r} is not params.X, metrics.X, tags.X or attributes.X",
                    details={"field": "columns"},
                )
            found[entity].add(key)
        return cls(frozenset(found["params"]), frozenset(found["metrics"]), frozenset(found["tags"]))

    def __or__(self, other: RunColumns) -> RunColumns:
        return RunColumns(self.params | other.params, self.metrics | other.metrics, self.tags | other.tags)


def run_views(s: Session, run_ids: list[str], columns: RunColumns | None = None) -> list[RunView]:
    """The runs ``run_ids`` (in that order) with their params, tags and each metric's latest point: every one, or
    only ``columns``' (and the table's own tags)."""
    return table_views(s, run_ids, columns)[0]


def table_views(
    s: Session, run_ids: list[str], columns: RunColumns | None = None, choose: bool = False
) -> tuple[list[RunView], list[str] | None]:
    """:func:`run_views`, and with ``choose`` the columns to show them with when none were asked for
    (:func:`chosen_columns`), which are read as well."""
    if not run_ids:
        return [], [] if choose else None
    views = _records(s, run_ids)
    tags: Any = select(RunTag.run_id, RunTag.key, RunTag.value).where(RunTag.run_id.in_(run_ids))
    if columns is not None or choose:
        tags = tags.where(RunTag.key.in_((columns or RunColumns()).tags | set(TABLE_TAGS)))
    for run_id, key, value in s.execute(tags):
        views[run_id].tags[key] = value
    marks = trial_marks(s, [v.job_id for v in views.values() if v.job_id])
    for job_id, mark in marks.items():
        if job_id in views:
            views[job_id].state = mark.state or views[job_id].state
            views[job_id].objective, views[job_id].direction = mark.objective, mark.direction
    chosen = None
    if choose:
        chosen = chosen_columns(s, list(views.values()))
        columns = (columns or RunColumns()) | RunColumns.parse(chosen)
    _fill(s, views, run_ids, columns)
    for job_id, mark in marks.items():  # the objective's last value as the pruner saw it, where the run lacks one
        found = views.get(job_id)
        if found is None or mark.last_value is None or (columns is not None and mark.objective not in columns.metrics):
            continue
        if all(p.key != mark.objective for p in found.metrics):
            found.metrics.append(LoggedPoint(mark.objective, mark.last_value, found.end_time or 0, mark.last_step or 0))
    return [views[r] for r in run_ids if r in views], chosen


def _records(s: Session, run_ids: list[str]) -> dict[str, RunView]:
    views: dict[str, RunView] = {}
    for row in s.execute(
        select(
            Run.id,
            Run.experiment_id,
            Run.name,
            Run.status,
            Run.start_time,
            Run.end_time,
            Run.lifecycle_stage,
            Run.job_id,
            Job.state,
            Job.finished_at,
            User.name,
        )
        .outerjoin(Job, Job.id == Run.job_id)
        .join(User, User.id == Run.user_id)
        .where(Run.id.in_(run_ids))
    ):
        run_id, experiment_id, name, status, start, end, stage, job_id, job_state, finished_at, user = row
        job_run = job_id is not None and job_state is not None
        views[run_id] = RunView(
            id=run_id,
            experiment_id=experiment_id,
            name=name,
            user=user,
            status=tracking.run_status(job_state) if job_run else status,
            start_time=start,
            end_time=millis(finished_at) if job_run else end,
            lifecycle_stage=stage,
            job_id=job_id,
            state=str(job_state) if job_run else run_table.STATE_OF_STATUS.get(status, status),
        )
    return views


def _fill(s: Session, views: dict[str, RunView], run_ids: list[str], columns: RunColumns | None) -> None:
    """Each run's params and each metric's latest point: all, or ``columns``'."""
    params: Any = select(RunParam.run_id, RunParam.key, RunParam.value).where(RunParam.run_id.in_(run_ids))
    latest: Any = select(
        MetricSeries.job_id,
        MetricSeries.name,
        MetricSeries.last_value,
        MetricSeries.last_text,
        MetricSeries.last_time,
        MetricSeries.last_step,
    ).where(MetricSeries.job_id.in_(run_ids), MetricSeries.kind == "scalar")
    if columns is not None:
        params = params.where(RunParam.key.in_(columns.params))
        latest = latest.where(MetricSeries.name.in_(columns.metrics))
    if columns is None or columns.params:
        for run_id, key, value in s.execute(params):
            views[run_id].params[key] = value
    if columns is not None and not columns.metrics:
        return
    seen: set[tuple[str, str]] = set()
    for run_id, name, number, words, last_time, step in s.execute(
        latest.order_by(MetricSeries.job_id, MetricSeries.name, MetricSeries.worker)
    ):
        if (run_id, name) in seen or (number is None and words is None):
            continue
        seen.add((run_id, name))
        point = LoggedPoint(name, as_float(number, words), round((last_time or 0) * 1000), int(step or 0))
        views[run_id].metrics.append(point)


def chosen_columns(s: Session, views: list[RunView]) -> list[str]:
    """The columns to show ``views`` with (their records, tags and trial marks read) when none were asked for:
    kiln.domain.run_table.default_columns's rule, its counts taken in SQL — how many of the runs have each param and
    whether its values differ, which metrics each run reports — rather than from every value. (A trial's objective
    is counted where the run logged it: the pruner's value stands in for it in the row only.)"""
    if not views:
        return []
    run_ids = [v.id for v in views]
    objectives = Counter(o for v in views for o in [v.objective or v.tags.get(run_table.OBJECTIVE_TAG)] if o)
    having: Counter[str] = Counter()
    differing: set[str] = set()
    for key, runs, values in s.execute(
        select(RunParam.key, func.count(), func.count(distinct(RunParam.value)))
        .where(RunParam.run_id.in_(run_ids))
        .group_by(RunParam.key)
    ):
        having[key] = runs
        if values > 1:
            differing.add(key)
    reported: dict[str, set[str]] = {}
    for run_id, name in s.execute(
        select(MetricSeries.job_id, MetricSeries.name)
        .where(MetricSeries.job_id.in_(run_ids), MetricSeries.kind == "scalar")
        .where(or_(MetricSeries.last_value.is_not(None), MetricSeries.last_text.is_not(None)))
        .distinct()
    ):
        reported.setdefault(name, set()).add(run_id)
    return run_table.choose_columns(objectives, having, differing, Counter({k: len(v) for k, v in reported.items()}))


def as_float(value: float | None, text: str | None) -> float:
    if value is not None:
        return float(value)
    try:
        return float(text or "nan")
    except ValueError:
        return math.nan

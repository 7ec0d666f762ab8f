"""Experiment tracking use cases: experiments, runs, what is logged to them, and run search (kiln.domain.tracking).

Who may do what: reading needs ``runs:read`` (every role), creating and logging ``runs:write`` (members); a job's
token logs to its own job's run only (``jobs:report``) and reads its organisation's experiments. Another
organisation's experiment or run is 404, as anything of theirs.

Search filters and orders in the database: params by text, or as numbers where the filter gives a number (their
``number`` column, indexed by key), metrics by each series' last value (``metric_series.last_value``, kept by the
metrics store at ingestion), attributes by column. A job's run takes its status from the job's state.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import delete, false, insert, select, update
from sqlalchemy.orm import Session

from kiln.db.session import Database
from kiln.db.tables import (
    Experiment,
    Job,
    MetricPoint,
    MetricSeries,
    Run,
    RunParam,
    RunTag,
    User,
    utcnow,
)
from kiln.domain import tracking
from kiln.domain.ids import new_id
from kiln.domain.run_search import SearchSyntaxError, parse_filter, parse_order_by
from kiln.domain.schemas import ExperimentRead
from kiln.domain.tracking import ACTIVE, DELETED, Batch, PointIn
from kiln.domain.tracking import MetricPoint as LoggedPoint
from kiln.errors import Conflict, Forbidden, InvalidInput, NotFound
from kiln.metrics.parse import Columns, Parsed
from kiln.metrics.store import MetricsStore
from kiln.usecases.access.identity import Principal
from kiln.usecases.jobs.run_rows import experiment_id_for, millis
from kiln.usecases.tracking import run_query
from kiln.usecases.tracking.experiments import experiment_summaries
from kiln.usecases.tracking.run_views import RunColumns, RunView, as_float, run_views, table_views


@dataclass
class ExperimentView:
    id: str
    name: str
    lifecycle_stage: str
    created_ms: int
    updated_ms: int
    tags: dict[str, str]


class TrackingService:
    def __init__(self, db: Database, store: MetricsStore) -> None:
        self.db = db
        self.store = store

    # ---- who may

    @staticmethod
    def _may_read(principal: Principal) -> None:
        if principal.job_id is None:
            principal.require("runs:read")

    @staticmethod
    def _may_write(principal: Principal, run: Run) -> None:
        if principal.job_id is not None:
            if run.job_id != principal.job_id:
                raise Forbidden(f"{principal.describe()} logs to its own job's run only, not to run {run.id}")
            principal.require("jobs:report")
        else:
            principal.require("runs:write")

    @classmethod
    def _may_log(cls, principal: Principal, run_id: str, job_id: str | None, stage: str) -> None:
        """``_may_write``, and the run must not be deleted."""
        if principal.job_id is not None:
            if job_id != principal.job_id:
                raise Forbidden(f"{principal.describe()} logs to its own job's run only, not to run {run_id}")
            principal.require("jobs:report")
        else:
            principal.require("runs:write")
        if stage != ACTIVE:
            raise InvalidInput(f"run {run_id} is deleted; restore it first")

    # ---- experiments

    def _experiment(self, s: Session, principal: Principal, experiment_id: str) -> Experiment:
        if experiment_id == tracking.DEFAULT_EXPERIMENT_ALIAS:
            experiment_id = experiment_id_for(s, principal.org_id, None)
        found = s.scalar(
            select(Experiment).where(Experiment.id == experiment_id, Experiment.org_id == principal.org_id)
        )
        if found is None:
            raise NotFound(f"experiment {experiment_id} not found")
        return found

    @staticmethod
    def _experiment_view(experiment: Experiment) -> ExperimentView:
        return ExperimentView(
            experiment.id,
            experiment.name,
            experiment.lifecycle_stage,
            millis(experiment.created_at) or 0,
            millis(experiment.updated_at) or 0,
            {str(k): str(v) for k, v in (experiment.tags or {}).items()},
        )

    def create_experiment(self, principal: Principal, name: str, tags: dict[str, str] | None = None) -> str:
        principal.require("runs:write")
        name = _experiment_name(name)
        for key in tags or {}:
            tracking.check_key(key, "tag") if key else None
        with self.db.transaction() as s:
            taken = s.scalar(
                select(Experiment.id).where(Experiment.org_id == principal.org_id, Experiment.name == name)
            )
            if taken is not None:
                raise Conflict(f"experiment {name!r} exists (id {taken})")
            experiment = Experiment(
                id=new_id("exp"), org_id=principal.org_id, name=name, lifecycle_stage=ACTIVE, tags=dict(tags or {})
            )
            s.add(experiment)
            s.flush()
            return experiment.id

    def get_experiment(self, principal: Principal, experiment_id: str) -> ExperimentView:
        self._may_read(principal)
        if experiment_id == tracking.DEFAULT_EXPERIMENT_ALIAS:
            experiment_id = self._default_made(principal.org_id)  # made on first use
        with self.db.read() as s:
            return self._experiment_view(self._experiment(s, principal, experiment_id))

    def _default_made(self, org_id: str) -> str:
        """The organisation's Default experiment's id; made (a write) only the first time."""
        with self.db.read() as s:
            found = s.scalar(
                select(Experiment.id).where(Experiment.org_id == org_id, Experiment.name == tracking.DEFAULT_EXPERIMENT)
            )
        if found is not None:
            return found
        with self.db.transaction() as s:
            return experiment_id_for(s, org_id, None)

    def experiment_by_name(self, principal: Principal, name: str) -> ExperimentView:
        self._may_read(principal)
        if name == tracking.DEFAULT_EXPERIMENT:
            self._default_made(principal.org_id)
        with self.db.read() as s:  # a read: searches and the console ask this at every page
            found = s.scalar(select(Experiment).where(Experiment.org_id == principal.org_id, Experiment.name == name))
            if found is None:
                raise NotFound(f"experiment {name!r} not found")
            return self._experiment_view(found)

    def search_experiments(
        self, principal: Principal, view: str = "ACTIVE_ONLY", max_results: int = 1000, page_token: str | None = None
    ) -> tuple[list[ExperimentView], str | None]:
        self._may_read(principal)
        offset = run_query.page_offset(page_token)
        max_results = _bounded(max_results, tracking.MAX_SEARCH_RESULTS)
        self._default_made(principal.org_id)
        with self.db.read() as s:
            query = select(Experiment).where(Experiment.org_id == principal.org_id)
            query = query.where(run_query.stage_filter(Experiment.lifecycle_stage, view))
            rows = list(
                s.scalars(query.order_by(Experiment.created_at, Experiment.id).offset(offset).limit(max_results + 1))
            )
            views = [self._experiment_view(e) for e in rows[:max_results]]
        return views, run_query.page_token(offset + max_results) if len(rows) > max_results else None

    def list_experiments(
        self, principal: Principal, view: str = "ACTIVE_ONLY", name: str | None = None
    ) -> list[ExperimentRead]:
        """The organisation's experiments with their run counts (kiln.usecases.tracking.experiments)."""
        self._may_read(principal)
        self._default_made(principal.org_id)
        with self.db.read() as s:
            return experiment_summaries(s, principal.org_id, view, name)

    def set_experiment_stage(self, principal: Principal, experiment_id: str, stage: str) -> None:
        principal.require("runs:write")
        with self.db.transaction() as s:
            experiment = self._experiment(s, principal, experiment_id)
            if experiment.name == tracking.DEFAULT_EXPERIMENT and stage == DELETED:
                raise InvalidInput("the Default experiment cannot be deleted", details={"field": "experiment_id"})
            experiment.lifecycle_stage = stage
            experiment.updated_at = utcnow()

    def rename_experiment(self, principal: Principal, experiment_id: str, name: str) -> None:
        principal.require("runs:write")
        name = _experiment_name(name)
        with self.db.transaction() as s:
            experiment = self._experiment(s, principal, experiment_id)
            taken = s.scalar(
                select(Experiment.id).where(Experiment.org_id == principal.org_id, Experiment.name == name)
            )
            if taken is not None and taken != experiment.id:
                raise Conflict(f"experiment {name!r} exists (id {taken})")
            experiment.name = name
            experiment.updated_at = utcnow()

    def set_experiment_tag(self, principal: Principal, experiment_id: str, key: str, value: str) -> None:
        principal.require("runs:write")
        tracking.check_key(key, "tag")
        with self.db.transaction() as s:
            experiment = self._experiment(s, principal, experiment_id)
            experiment.tags = {**(experiment.tags or {}), key: _bounded_text(value, tracking.MAX_TAG_VALUE, "tag")}
            experiment.updated_at = utcnow()

    # ---- runs

    def _run(self, s: Session, principal: Principal, run_id: str) -> Run:
        found = s.scalar(select(Run).where(Run.id == run_id, Run.org_id == principal.org_id))
        if found is None:
            raise NotFound(f"run {run_id} not found")
        return found

    def create_run(
        self,
        principal: Principal,
        experiment_id: str,
        name: str | None = None,
        start_time: int | None = None,
        tags: dict[str, str] | None = None,
    ) -> RunView:
        """A run without a job (logged from outside Kiln), RUNNING."""
        principal.require("runs:write")
        tags = {
            tracking.check_key(k, "tag"): _bounded_text(v, tracking.MAX_TAG_VALUE, "tag")
            for k, v in (tags or {}).items()
        }
        name = (name or tags.get("mlflow.runName") or "").strip()[: tracking.MAX_RUN_NAME]
        with self.db.transaction() as s:
            experiment = self._experiment(s, principal, experiment_id)
            if experiment.lifecycle_stage != ACTIVE:
                raise InvalidInput(f"experiment {experiment.name} is deleted; restore it first")
            run_id = new_id("run")
            s.add(
                Run(
                    id=run_id,
                    org_id=principal.org_id,
                    experiment_id=experiment.id,
                    user_id=principal.user_id,
                    name=name or run_id,
                    status="RUNNING",
                    start_time=start_time if start_time is not None else int(time.time() * 1000),
                    lifecycle_stage=ACTIVE,
                )
            )
            s.flush()
            if tags:
                s.execute(insert(RunTag), [{"run_id": run_id, "key": k, "value": v} for k, v in tags.items()])
        return self.get_run(principal, run_id)

    def get_run(self, principal: Principal, run_id: str) -> RunView:
        self._may_read(principal)
        with self.db.read() as s:
            self._run(s, principal, run_id)
            return run_views(s, [run_id])[0]

    def update_run(
        self,
        principal: Principal,
        run_id: str,
        status: str | None = None,
        end_time: int | None = None,
        name: str | None = None,
    ) -> RunView:
        """A run's status, end time and name, as its client sets them; a job's run keeps its job's status (the
        client ending it changes nothing but its name)."""
        if status is not None and status not in tracking.RUN_STATUSES:
            raise InvalidInput(f"status: one of {', '.join(tracking.RUN_STATUSES)}", details={"field": "status"})
        with self.db.transaction() as s:
            run = self._run(s, principal, run_id)
            self._may_write(principal, run)
            if run.job_id is None:
                if status is not None:
                    run.status = status
                    if status in tracking.ENDED and end_time is None and run.end_time is None:
                        end_time = int(time.time() * 1000)
                if end_time is not None:
                    run.end_time = end_time
            if name:
                run.name = name.strip()[: tracking.MAX_RUN_NAME]
        return self.get_run(principal, run_id)

    def set_run_stage(self, principal: Principal, run_id: str, stage: str) -> None:
        with self.db.transaction() as s:
            run = self._run(s, principal, run_id)
            principal.require("runs:write")
            run.lifecycle_stage = stage

    def log(self, principal: Principal, run_id: str, batch: Batch) -> int:
        """Store a batch of metrics, params and tags; params are written once (the same value again is no
        change, another one is refused). Returns the metric points stored."""
        if len(batch.metrics) > tracking.MAX_BATCH_METRICS:
            raise InvalidInput(
                f"metrics: at most {tracking.MAX_BATCH_METRICS} in one batch", details={"field": "metrics"}
            )
        if len(batch.params) > tracking.MAX_BATCH_PARAMS:
            raise InvalidInput(f"params: at most {tracking.MAX_BATCH_PARAMS} in one batch", details={"field": "params"})
        if len(batch.tags) > tracking.MAX_BATCH_TAGS:
            raise InvalidInput(f"tags: at most {tracking.MAX_BATCH_TAGS} in one batch", details={"field": "tags"})
        params = {
            _key(k, "param"): _bounded_text(v, tracking.MAX_PARAM_VALUE, f"param {k}") for k, v in batch.params.items()
        }
        tags = {_key(k, "tag"): _bounded_text(v, tracking.MAX_TAG_VALUE, f"tag {k}") for k, v in batch.tags.items()}
        parsed = _parsed(batch.metrics)
        if params or tags:
            with self.db.transaction() as s:
                run = self._run(s, principal, run_id)
                self._may_log(principal, run.id, run.job_id, run.lifecycle_stage)
                if params:
                    self._log_params(s, run_id, params)
                if tags:
                    self._set_tags(s, run_id, tags)
        else:  # metrics alone (most batches): the run's three columns read, no write lock taken for it
            with self.db.read() as s:
                found = s.execute(
                    select(Run.job_id, Run.lifecycle_stage).where(Run.id == run_id, Run.org_id == principal.org_id)
                ).first()
            if found is None:
                raise NotFound(f"run {run_id} not found")
            self._may_log(principal, run_id, *found)
        if not parsed.series:
            return 0
        return self.store.append([(run_id, parsed, False)])

    def _log_params(self, s: Session, run_id: str, params: dict[str, str]) -> None:
        known = dict(
            s.execute(select(RunParam.key, RunParam.value).where(RunParam.run_id == run_id, RunParam.key.in_(params)))
            .tuples()
            .all()
        )
        for key, value in params.items():
            if key in known and known[key] != value:
                raise InvalidInput(
                    f"param {key} of run {run_id} is {known[key][:200]!r}; a param is logged once (another value: "
                    f"{value[:200]!r})",
                    details={"field": f"params.{key}"},
                )
        new = [
            {"run_id": run_id, "key": k, "value": v, "number": tracking.param_number(v)}
            for k, v in params.items()
            if k not in known
        ]
        if new:
            s.execute(insert(RunParam), new)

    def _set_tags(self, s: Session, run_id: str, tags: dict[str, str]) -> None:
        s.execute(delete(RunTag).where(RunTag.run_id == run_id, RunTag.key.in_(tags)))
        s.execute(insert(RunTag), [{"run_id": run_id, "key": k, "value": v} for k, v in tags.items()])
        name = tags.get("mlflow.runName")
        if name:
            s.execute(update(Run).where(Run.id == run_id).values(name=name.strip()[: tracking.MAX_RUN_NAME]))

    def delete_tag(self, principal: Principal, run_id: str, key: str) -> None:
        with self.db.transaction() as s:
            run = self._run(s, principal, run_id)
            self._may_write(principal, run)
            if s.execute(delete(RunTag).where(RunTag.run_id == run_id, RunTag.key == key)).rowcount == 0:  # type: ignore[attr-defined]
                raise NotFound(f"run {run_id} has no tag {key[:200]!r}")

    def metric_history(
        self, principal: Principal, run_id: str, key: str, max_results: int = 25000, page_token: str | None = None
    ) -> tuple[list[LoggedPoint], str | None]:
        """Every point of a run's metric ``key`` in the order logged (all members' series, worker0 first)."""
        self._may_read(principal)
        offset = run_query.page_offset(page_token)
        max_results = _bounded(max_results, 100_000)
        with self.db.read() as s:
            self._run(s, principal, run_id)
            series = select(MetricSeries.id).where(MetricSeries.job_id == run_id, MetricSeries.name == key)
            rows = s.execute(
                select(MetricPoint.step, MetricPoint.time, MetricPoint.value, MetricPoint.text)
                .join(MetricSeries, MetricSeries.id == MetricPoint.series_id)
                .where(MetricPoint.series_id.in_(series))
                .order_by(MetricSeries.worker, MetricPoint.series_id, MetricPoint.seq)
                .offset(offset)
                .limit(max_results + 1)
            ).all()
        points = [
            LoggedPoint(key, as_float(value, text), round(t * 1000), int(step or 0))
            for step, t, value, text in rows[:max_results]
        ]
        return points, run_query.page_token(offset + max_results) if len(rows) > max_results else None

    # ---- search

    def search_runs(
        self,
        principal: Principal,
        experiment_ids: Iterable[str],
        filter_string: str | None = None,
        view: str = "ACTIVE_ONLY",
        max_results: int = tracking.DEFAULT_SEARCH_RESULTS,
        order_by: list[str] | None = None,
        page_token: str | None = None,
    ) -> tuple[list[RunView], str | None]:
        """Runs as MLflow's clients read them: every param, tag and metric of each."""
        page = self.search_table(principal, experiment_ids, filter_string, view, max_results, order_by, page_token)
        return page.runs, page.next_page_token

    def search_table(
        self,
        principal: Principal,
        experiment_ids: Iterable[str],
        filter_string: str | None = None,
        view: str = "ACTIVE_ONLY",
        max_results: int = tracking.DEFAULT_SEARCH_RESULTS,
        order_by: list[str] | None = None,
        page_token: str | None = None,
        columns: list[str] | None = None,
        default_columns: bool = False,
        experiment_names: Iterable[str] = (),
    ) -> RunPage:
        """A page of runs for a table: with ``columns`` (``params.X``, ``metrics.X``, ``tags.X``) only those of each
        run (and the table's own tags); with ``default_columns`` also the columns kiln.domain.run_table would show
        these runs with (``RunPage.columns``). Neither: every param, tag and metric, as search_runs. Experiments by
        id, or by name (``experiment_names``: the console's first search needs no look-up before it)."""
        self._may_read(principal)
        experiment_ids = [*experiment_ids, *(self.experiment_by_name(principal, n).id for n in experiment_names)]
        wanted = RunColumns.parse(columns) if columns is not None else None
        try:
            conditions = parse_filter(filter_string)
            order = parse_order_by(order_by)
        except SearchSyntaxError as exc:
            raise InvalidInput(
                str(exc), details={"field": "filter" if "order" not in str(exc) else "order_by"}
            ) from None
        offset = run_query.page_offset(page_token)
        max_results = _bounded(max_results, tracking.MAX_SEARCH_RESULTS)
        ids = [
            self._default_made(principal.org_id) if e == tracking.DEFAULT_EXPERIMENT_ALIAS else e
            for e in experiment_ids
        ]
        with self.db.read() as s:  # a read: on SQLite a search never waits for, or blocks, a writer
            query = (
                select(Run.id)
                .outerjoin(Job, Job.id == Run.job_id)
                .join(User, User.id == Run.user_id)
                .where(Run.org_id == principal.org_id)
                .where(Run.experiment_id.in_(ids) if ids else false())
                .where(run_query.stage_filter(Run.lifecycle_stage, view))
            )
            for cond in conditions:
                query = query.where(run_query.condition(cond))
            ordering = [c for key in order for c in run_query.order(key)]
            ordering += [Run.start_time.desc().nulls_last(), Run.id.desc()]
            found = list(s.scalars(query.order_by(*ordering).offset(offset).limit(max_results + 1)))
            views, chosen = table_views(s, found[:max_results], wanted, default_columns)
        token = run_query.page_token(offset + max_results) if len(found) > max_results else None
        return RunPage(views, token, chosen)


@dataclass
class RunPage:
    runs: list[RunView]
    next_page_token: str | None
    columns: list[str] | None  # the default columns chosen, where asked for


def _bounded(value: int, most: int) -> int:
    if value < 1 or value > most:
        raise InvalidInput(f"max_results: 1 to {most}", details={"field": "max_results"})
    return value


def _bounded_text(value: str, most: int, what: str) -> str:
    if len(value) > most:
        raise InvalidInput(f"{what}: at most {most} characters", details={"field": what})
    if "\x00" in value:
        raise InvalidInput(f"{what}: must not contain NUL", details={"field": what})
    return value


def _key(key: str, what: str) -> str:
    try:
        return tracking.check_key(key, what)
    except ValueError as exc:
        raise InvalidInput(str(exc), details={"field": what}) from None


def _experiment_name(name: str) -> str:
    name = (name or "").strip()
    if not name or len(name) > tracking.MAX_EXPERIMENT_NAME or any(ord(c) < 32 for c in name):
        raise InvalidInput(
            f"experiment name: 1 to {tracking.MAX_EXPERIMENT_NAME} printable characters", details={"field": "name"}
        )
    return name


def _parsed(points: list[PointIn]) -> Parsed:
    """The store's batch of a log-batch's points, column by column; each distinct key is checked once (a batch
    repeats a few keys)."""
    worker = tracking.API_WORKER
    parsed = Parsed()
    series = parsed.series
    for point in points:
        key, value, timestamp, step = point["key"], point["value"], point["timestamp"], point.get("step", 0)
        columns = series.get((worker, key))
        if columns is None:
            if len(key) > 200:
                raise InvalidInput(f"metric {key[:80]!r}…: at most 200 characters", details={"field": "metrics"})
            columns = series[(worker, _key(key, "metric"))] = Columns("api")
        value = float(value)
        columns.steps.append(step)
        columns.times.append(timestamp / 1000.0)
        if value - value == 0.0:  # finite (NaN and the infinities give NaN)
            columns.values.append(value)
            columns.texts.append(None)
        else:
            columns.values.append(None)
            columns.texts.append("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))
    return parsed

"""The ``pipelines`` task: drives every running pipeline run, one server at a time (a leased task).

A pass takes each running run and moves its steps on, one transition at a time, until none is left to make:

- a **running** job step whose job ended: SUCCEEDED (its outputs are read once, by the first step that takes them
  as an input: kiln.usecases.inputs.output_manifests), or, failed, WAITING for its next try after the back-off
  (``retry_backoff`` seconds, doubling) while it has retries left, else FAILED;
- a **waiting** step: SKIPPED when a step it depends on failed or was skipped, else, once they all succeeded (and
  its retry's back-off has passed), its ``when`` is evaluated over their metrics and params (false: SKIPPED), then
  a job step is either CACHED (an earlier job of the organisation ran the same job fields, code and inputs and
  succeeded: its result is reused and no job starts) or gets its job (RUNNING), with each upstream step named in
  its ``inputs`` staged from that step's job's outputs; a ``register_model`` step registers the version, a
  ``serve`` step creates the service or rolls it to that version;
- a run whose steps have all ended: SUCCEEDED, or FAILED when one failed.

Every transition is its own fenced transaction (``ctx.transaction()``), which checks the step is still where the
pass found it: a job is created in the same transaction that records it, so a server that dies anywhere leaves
either both or neither, and a step never runs twice. The work that writes elsewhere (reading a job's outputs,
registering a model, creating a service) comes before the transaction that records it, and is idempotent: a
server that died in between does it again harmlessly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from kiln.db.session import Database
from kiln.db.tables import Job, MetricSeries, PipelineRun, PipelineSchedule, PipelineStep, RunParam, utcnow
from kiln.domain.models import ModelRegister
from kiln.domain.pipeline_when import Ref
from kiln.domain.pipelines import (
    STEP_DONE,
    Pipeline,
    RunState,
    Step,
    StepState,
    cache_key,
    next_time,
    parse_pipeline,
)
from kiln.domain.serving import ServiceSubmit, ServiceUpdate
from kiln.domain.spec import InputSpec, JobSpec
from kiln.domain.states import JobState
from kiln.errors import Conflict, KilnError
from kiln.tasks.runner import LeaseLost, Task, TaskContext
from kiln.usecases.access.identity import Principal
from kiln.usecases.inputs.output_manifests import OutputManifests
from kiln.usecases.jobs.jobs import JobService
from kiln.usecases.models.model_registry import ModelRegistry
from kiln.usecases.models.serving import ServingService
from kiln.usecases.notifications import notification_outbox
from kiln.usecases.notifications.notification_outbox import Subject
from kiln.usecases.pipelines import all_ended, new_run, run_principal

log = logging.getLogger(__name__)

INTERVAL = 0.25  # seconds between passes (a submit, a cancel or a resume wakes it at once)
MAX_TRANSITIONS = 10_000  # a pass's bound (a run has at most 200 steps, each a few transitions)


# What a pass looks for (built once: a pass runs four times a second).
_DUE = select(PipelineSchedule.id).where(PipelineSchedule.next_at <= bindparam("now"))
_RUNNING = select(PipelineRun.id).where(PipelineRun.state == RunState.RUNNING)


class _Moved(Exception):
    """A step was not where this pass found it (another server moved it, or the run stopped)."""


class PipelineDriver:
    def __init__(
        self,
        db: Database,
        jobs: JobService,
        manifests: OutputManifests,
        models: ModelRegistry | None = None,
        serving: ServingService | None = None,
        drain_metrics: Callable[[], int] | None = None,
    ) -> None:
        """``drain_metrics``: a pass of the metrics ingester, so that a ``when`` reads an upstream job's last
        points (they may still be in its spool when its job ends)."""
        self.drain_metrics = drain_metrics
        # (principal, spec, code) → (name, each job step's checked spec): a scheduled run's check, as a submit's
        # (PipelineService.check, set once the service exists).
        self.check: Callable[[Principal, dict[str, Any], str | None], tuple[str, dict[str, Any]]] | None = None
        self.db = db
        self.jobs = jobs
        self.manifests = manifests
        self.models = models
        self.serving = serving
        self._task = Task("pipelines", self.run_once, INTERVAL, lease_scope="pipelines")

    def task(self) -> Task:
        return self._task

    def wake(self) -> None:
        self._task.wake.set()

    def run_once(self, ctx: TaskContext) -> float | None:
        # One read for what this pass has to do (four passes a second, most of which find nothing): the schedules
        # whose time has come, and the running runs as they were before those started any.
        with self.db.read() as s:
            conn = s.connection()  # (ids only: past the ORM)
            due_ids = list(conn.execute(_DUE, {"now": utcnow()}).scalars())
            runs = list(conn.execute(_RUNNING).scalars())
        if due_ids:
            with self.db.read() as s:
                due = list(s.scalars(select(PipelineSchedule).where(PipelineSchedule.id.in_(due_ids))))
                for row in due:
                    s.expunge(row)
            self._scheduled(ctx, due)
            with self.db.read() as s:
                runs = list(s.connection().execute(_RUNNING).scalars())
        soonest: float | None = None
        for run_id in runs:
            if ctx.stopping.is_set():
                break
            try:
                wait = self._drive(ctx, run_id)
            except LeaseLost:
                raise
            except Exception:  # one run's trouble never stops the others
                log.exception("pipeline run %s: a pass failed; it is tried again", run_id)
                wait = None
            if wait is not None:
                soonest = wait if soonest is None else min(soonest, wait)
        return soonest

    # -- schedules ----------------------------------------------------------------------------------------

    def _scheduled(self, ctx: TaskContext, due: list[PipelineSchedule]) -> None:
        """A run of each schedule whose time has come (``due``, read by the pass); its next time the first after now
        (so a server that was down across several times starts one run, not one per time it missed)."""
        for row in due:
            if ctx.stopping.is_set():
                return
            try:
                self._start_scheduled(ctx, row)
            except LeaseLost:
                raise
            except Exception:
                log.exception("pipeline schedule %s: could not start its run; tried again", row.id)

    def _start_scheduled(self, ctx: TaskContext, row: PipelineSchedule) -> None:
        checked: tuple[str, dict[str, Any]] | None = None
        why = ""
        try:
            with self.db.read() as s:
                principal = run_principal(s, row.user_id, f"pipeline schedule {row.id}")
            if self.check is None:
                raise Conflict("this server checks no pipelines")
            checked = self.check(principal, row.spec, row.code_sha256)  # its datasets' versions as they are now
        except KilnError as exc:
            why = exc.message
        started = None
        with ctx.transaction() as s:
            fresh = s.get(PipelineSchedule, row.id, with_for_update=s.get_bind().dialect.name == "postgresql")
            if fresh is None or fresh.next_at != row.next_at:
                return  # removed, or its time taken meanwhile
            now = utcnow()
            if checked is not None:
                name, jobs = checked
                started = new_run(s, principal, name, row.spec, jobs, row.code_sha256, row.use_cache).id
                fresh.last_run_id, fresh.message = started, ""
            else:
                fresh.message = f"{now:%Y-%m-%d %H:%M:%S} UTC started no run: {why}"
            fresh.last_at, fresh.next_at = now, next_time(fresh.cron, now)
        if started is not None:
            log.info("pipeline schedule %s started run %s", row.id, started)

    # -- one run ------------------------------------------------------------------------------------------

    def _drive(self, ctx: TaskContext, run_id: str) -> float | None:
        """Make every transition the run's steps are ready for, on what one read found (each written transition
        applied to it too, so that the steps it unblocks move in the same pass); the seconds until a retry is due,
        if any. A step another server moved meanwhile ends the pass: the next one reads afresh."""
        with self.db.read() as s:
            run = s.get(PipelineRun, run_id)
            if run is None or run.state != RunState.RUNNING:
                return None
            s.expunge(run)
            rows = {r.name: r for r in s.scalars(select(PipelineStep).where(PipelineStep.run_id == run_id))}
            for row in rows.values():
                s.expunge(row)
            job_ids = [r.job_id for r in rows.values() if r.job_id]
            jobs = {j.id: j for j in s.scalars(select(Job).where(Job.id.in_(job_ids)))} if job_ids else {}
            for job in jobs.values():
                s.expunge(job)
        pipeline = parse_pipeline(run.spec["pipeline"])
        try:
            for _ in range(MAX_TRANSITIONS):
                if ctx.stopping.is_set():
                    return None
                if all_ended(list(rows.values())):
                    self._finish(ctx, run, list(rows.values()))
                    return None
                moved, due = False, None
                for name, step in pipeline.steps.items():
                    row = rows[name]
                    if row.state == StepState.RUNNING:
                        moved |= self._running(ctx, run, step, row, jobs.get(row.job_id or ""))
                    elif row.state == StepState.WAITING:
                        went, wait = self._waiting(ctx, run, pipeline, step, row, rows, jobs)
                        moved |= went
                        if wait is not None:
                            due = wait if due is None else min(due, wait)
                if not moved:
                    return due
        except _Moved:
            return 0.0
        return 0.0

    def _set(self, ctx: TaskContext, row: PipelineStep, expected: str, **values: Any) -> bool:
        """The step moves from ``expected``, in the database and in ``row``; _Moved (nothing written) where another
        server moved it first or the run is no longer running."""
        with ctx.transaction() as s:
            fresh = self._locked(s, row)
            if fresh is None or fresh.state != expected or not self._run_running(s, row.run_id):
                raise _Moved
            for key, value in values.items():
                setattr(fresh, key, value)
        for key, value in values.items():
            setattr(row, key, value)
        return True

    @staticmethod
    def _locked(s: Session, row: PipelineStep) -> PipelineStep | None:
        pg = s.get_bind().dialect.name == "postgresql"
        return s.get(PipelineStep, (row.run_id, row.name), with_for_update=pg)

    @staticmethod
    def _run_running(s: Session, run_id: str) -> bool:
        return s.scalar(select(PipelineRun.state).where(PipelineRun.id == run_id)) == RunState.RUNNING

    def _running(self, ctx: TaskContext, run: PipelineRun, step: Step, row: PipelineStep, job: Job | None) -> bool:
        if job is None or not JobState(job.state).terminal:
            return False
        now = utcnow()
        if job.state == JobState.SUCCEEDED:  # its outputs are read by the first step that takes them as an input
            return self._set(ctx, row, StepState.RUNNING, state=StepState.SUCCEEDED, message="", finished_at=now)
        why = f"job {job.id} {job.state}" + (f": {job.message}" if job.message else "")
        if row.tries <= step.retries:
            delay = step.retry_backoff * 2 ** max(row.tries - 1, 0)
            message = f"{why}; try {row.tries + 1} of {step.retries + 1} in {delay:g} s"
            return self._set(
                ctx,
                row,
                StepState.RUNNING,
                state=StepState.WAITING,
                retry_at=now + timedelta(seconds=delay),
                message=message,
            )
        return self._set(ctx, row, StepState.RUNNING, state=StepState.FAILED, message=why, finished_at=now)

    def _waiting(
        self,
        ctx: TaskContext,
        run: PipelineRun,
        pipeline: Pipeline,
        step: Step,
        row: PipelineStep,
        rows: dict[str, PipelineStep],
        jobs: dict[str, Job],
    ) -> tuple[bool, float | None]:
        now = utcnow()
        upstream = [rows[d] for d in step.depends_on]
        broken = next(
            (u for u in upstream if u.state in (StepState.FAILED, StepState.SKIPPED, StepState.CANCELLED)), None
        )
        if broken is not None:
            why = f"upstream step {broken.name} {broken.state.lower()}"
            return self._set(ctx, row, StepState.WAITING, state=StepState.SKIPPED, message=why, finished_at=now), None
        if not all(u.state in STEP_DONE for u in upstream):
            return False, None
        if row.retry_at is not None and row.retry_at > now:
            return False, (row.retry_at - now).total_seconds()
        if step.when is not None:
            if self.drain_metrics is not None:
                self.drain_metrics()
            with self.db.read() as s:
                values = {ref: _value(s, rows[ref.step].job_id, ref) for ref in step.when.refs}
            ok, why = step.when.evaluate(values)
            if not ok:
                text = f"when is false: {step.when.text}" + (f" ({why})" if why else "")
                return self._set(
                    ctx, row, StepState.WAITING, state=StepState.SKIPPED, message=text, finished_at=now
                ), None
        if step.kind == "job":
            return self._start_job(ctx, run, step, row, rows), None
        if step.kind == "register_model":
            return self._register(ctx, run, step, row, rows), None
        return self._serve(ctx, run, step, row, rows), None

    def _start_job(
        self, ctx: TaskContext, run: PipelineRun, step: Step, row: PipelineStep, rows: dict[str, PipelineStep]
    ) -> bool:
        now = utcnow()
        spec = JobSpec.model_validate(run.spec["jobs"][step.name])
        inputs = list(spec.inputs)
        digests = [item.ref for item in inputs]  # pinned dataset and model versions never change
        for dep in step.depends_on:  # a step after one that ran again runs again (a cached one: the same job)
            digests.append(f"after {dep}:{rows[dep].job_id or rows[dep].result.get('model') or ''}")
        try:
            for item in step.step_inputs:
                source = rows[item.step].job_id or ""
                ctx.fence()  # reading a job's outputs may write their manifest
                manifest = self.manifests.pin(run.org_id, source, f"steps.{step.name}.inputs")
                inputs.append(InputSpec(job=source, name=item.step, path=item.path))
                digests.append(f"{item.step}:{manifest.digest}")
        except KilnError as exc:
            return self._set(ctx, row, StepState.WAITING, state=StepState.FAILED, message=exc.message, finished_at=now)
        labels = {**spec.labels, "pipeline": run.name, "pipeline-run": run.id, "pipeline-step": step.name}
        labels["pipeline-try"] = str(row.attempts + 1)  # its jobs counted across retries and resumes
        spec = spec.model_copy(update={"inputs": inputs, "labels": labels})
        code = step.code_sha256 or run.code_sha256
        key = cache_key(step, code, digests)
        if run.use_cache and step.cache:
            earlier = self._cached(run.org_id, key)
            if earlier is not None:
                return self._set(
                    ctx,
                    row,
                    StepState.WAITING,
                    state=StepState.CACHED,
                    job_id=earlier,
                    cached=True,
                    cache_key=key,
                    message=f"the result of job {earlier} (the same job, code and inputs)",
                    started_at=now,
                    finished_at=now,
                )
        with ctx.transaction() as s:
            fresh = self._locked(s, row)
            if fresh is None or fresh.state != StepState.WAITING or not self._run_running(s, row.run_id):
                raise _Moved
            job = self.jobs.new_job(
                s, run.org_id, run.user_id, spec, code, f"step {step.name} of pipeline run {run.id}"
            )
            fresh.state, fresh.job_id, fresh.tries, fresh.cache_key = StepState.RUNNING, job.id, fresh.tries + 1, key
            fresh.attempts += 1
            fresh.cached, fresh.retry_at, fresh.started_at = False, None, fresh.started_at or now
            fresh.message = f"job {job.id}" + (f" (try {fresh.tries} of {step.retries + 1})" if fresh.tries > 1 else "")
            mirrored = {k: getattr(fresh, k) for k in ("state", "job_id", "tries", "attempts", "cache_key", "cached")}
            mirrored.update(retry_at=None, started_at=fresh.started_at, message=fresh.message)
        for key, value in mirrored.items():
            setattr(row, key, value)
        self.jobs.wake()
        return True

    def _cached(self, org_id: str, key: str) -> str | None:
        """The job of an earlier step of the organisation with this cache key that succeeded (and still exists)."""
        with self.db.read() as s:
            found = s.execute(
                select(PipelineStep.job_id)
                .join(Job, Job.id == PipelineStep.job_id)
                .where(
                    PipelineStep.org_id == org_id,
                    PipelineStep.cache_key == key,
                    PipelineStep.state.in_([StepState.SUCCEEDED, StepState.CACHED]),
                    Job.org_id == org_id,
                    Job.state == JobState.SUCCEEDED,
                )
                .limit(1)
            ).first()
        return found[0] if found else None

    def _register(
        self, ctx: TaskContext, run: PipelineRun, step: Step, row: PipelineStep, rows: dict[str, PipelineStep]
    ) -> bool:
        assert step.register_model is not None
        spec = step.register_model
        now = utcnow()
        try:
            if self.models is None:
                raise Conflict("this server keeps no models")
            with self.db.read() as s:
                principal = run_principal(s, run.user_id, f"pipeline run {run.id}")
            body = ModelRegister(
                job_id=rows[spec.source].job_id or "",
                path=spec.path,
                framework=spec.framework,  # type: ignore[arg-type]
                description=spec.description or f"pipeline {run.name}, run {run.id}",
            )
            ctx.fence()
            version = self.models.register(principal, spec.name, body)
        except (KilnError, ValueError) as exc:
            message = exc.message if isinstance(exc, KilnError) else str(exc)
            return self._set(ctx, row, StepState.WAITING, state=StepState.FAILED, message=message, finished_at=now)
        ref = f"{version.name}@{version.version}"
        return self._set(
            ctx,
            row,
            StepState.WAITING,
            state=StepState.SUCCEEDED,
            result={"model": ref},
            message=f"registered {ref}",
            started_at=now,
            finished_at=now,
        )

    def _serve(
        self, ctx: TaskContext, run: PipelineRun, step: Step, row: PipelineStep, rows: dict[str, PipelineStep]
    ) -> bool:
        assert step.serve is not None and step.serve_model_step is not None
        now = utcnow()
        model = str((rows[step.serve_model_step].result or {}).get("model") or "")
        try:
            if self.serving is None:
                raise Conflict("this server serves no models")
            with self.db.read() as s:
                principal = run_principal(s, run.user_id, f"pipeline run {run.id}")
            spec = step.serve.model_copy(update={"model": model})
            try:
                ctx.fence()
                self.serving.create(principal, ServiceSubmit(spec=spec))
                what = f"service {spec.name} created with {model}"
            except Conflict:  # it exists: rolled to the new version, unless it serves that one already
                current = self.serving.get(principal, spec.name)
                if f"{current.model_name}@{current.model_version}" == model:
                    what = f"service {spec.name} serves {model} already"
                else:
                    ctx.fence()
                    self.serving.update(principal, spec.name, ServiceUpdate(model=model))
                    what = f"service {spec.name} rolled to {model}"
        except KilnError as exc:
            return self._set(ctx, row, StepState.WAITING, state=StepState.FAILED, message=exc.message, finished_at=now)
        return self._set(
            ctx,
            row,
            StepState.WAITING,
            state=StepState.SUCCEEDED,
            result={"service": step.serve.name, "model": model},
            message=what,
            started_at=now,
            finished_at=now,
        )

    def _finish(self, ctx: TaskContext, run: PipelineRun, rows: list[PipelineStep]) -> None:
        failed = [r.name for r in rows if r.state == StepState.FAILED]
        with ctx.transaction() as s:
            fresh = s.get(PipelineRun, run.id, with_for_update=s.get_bind().dialect.name == "postgresql")
            if fresh is None or fresh.state != RunState.RUNNING:
                return
            fresh.state = RunState.FAILED if failed else RunState.SUCCEEDED
            fresh.message = f"failed: {', '.join(failed)}" if failed else ""
            fresh.finished_at = fresh.updated_at = utcnow()
            kind = "pipeline_run.failed" if failed else "pipeline_run.succeeded"
            about = Subject("pipeline_run", fresh.org_id, fresh.id, fresh.name, fresh.user_id, f"/pipelines/{fresh.id}")
            notification_outbox.recorded(s, kind, about, state=fresh.state, message=fresh.message)


def _value(s: Session, job_id: str | None, ref: Ref) -> float | str | None:
    """An upstream step's metric (its last value; the first member's where a gang's members each have one) or
    param, for its ``when``."""
    if not job_id:
        return None
    if ref.kind == "params":
        return s.scalar(select(RunParam.value).where(RunParam.run_id == job_id, RunParam.key == ref.key))
    found = s.execute(
        select(MetricSeries.last_value, MetricSeries.last_text)
        .where(MetricSeries.job_id == job_id, MetricSeries.name == ref.key)
        .order_by(MetricSeries.worker)
        .limit(1)
    ).first()
    if found is None:
        return None
    return found[0] if found[0] is not None else found[1]

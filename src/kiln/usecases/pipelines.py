"""Pipeline runs as the API sees them: submit one (the whole spec checked, every job step's job spec checked as a
submit would be, before anything is created), read and list them, cancel one (its running steps' jobs cancelled),
resume one (its failed, skipped and cancelled steps run again; the steps that succeeded are kept). The steps are
driven by the ``pipelines`` task (kiln.tasks.pipelines)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from kiln.db.session import Database
from kiln.db.tables import Organization, PipelineRun, PipelineSchedule, PipelineStep, User, utcnow
from kiln.domain.ids import new_id
from kiln.domain.pipelines import (
    STEP_ENDED,
    PipelineDryRun,
    PipelineError,
    PipelineRunRead,
    PipelineScheduleRead,
    PipelineScheduleSubmit,
    PipelineStepRead,
    PipelineSubmit,
    RunState,
    StepState,
    check_cron,
    next_time,
    parse_pipeline,
)
from kiln.errors import Conflict, InvalidInput, KilnError, NotFound
from kiln.usecases.access.identity import Principal
from kiln.usecases.jobs.jobs import JobService

MAX_LIST = 200


def run_principal(s: Session, user_id: str, what: str) -> Principal:
    """The user who started ``what`` (a run, a schedule) as they are now (their role may have changed): what
    its steps act as. NotFound when the user is disabled."""
    found = s.execute(
        select(User, Organization).join(Organization, Organization.id == User.org_id).where(User.id == user_id)
    ).first()
    if found is None or found[0].disabled:
        raise NotFound(f"the user who started {what} is disabled or gone")
    user, org = found
    return Principal(user.id, user.name, org.id, org.name, "pipeline", user.role, user.platform_admin)


class PipelineService:
    def __init__(self, db: Database, jobs: JobService, wake: Callable[[], None]) -> None:
        self.db = db
        self.jobs = jobs
        self.wake = wake

    def submit(self, principal: Principal, body: PipelineSubmit) -> PipelineRunRead:
        principal.require("pipelines:write")
        name, checked = self.check(principal, body.spec, body.code_sha256)
        with self.db.transaction() as s:
            run = new_run(s, principal, name, body.spec, checked, body.code_sha256, body.use_cache)
            read = self._read(s, run, principal.user_name)
        self.wake()
        return read

    def dry_run(self, principal: Principal, body: PipelineSubmit) -> PipelineDryRun:
        """Every check ``submit`` makes but the code's (a client asks this before it uploads its code, so that a
        refused pipeline uploads nothing), creating nothing."""
        principal.require("pipelines:write")
        name, checked = self.check(principal, body.spec, None, code_checked=False)
        return PipelineDryRun(name=name, steps=checked)

    def check(
        self, principal: Principal, spec: dict[str, Any], code_sha256: str | None, *, code_checked: bool = True
    ) -> tuple[str, dict[str, Any]]:
        """The pipeline's name and each job step's spec as a submit checks it (its inputs pinned); InvalidInput
        naming ``spec.steps.STEP.field`` otherwise."""
        try:
            pipeline = parse_pipeline(spec)
        except PipelineError as exc:
            raise InvalidInput(f"{exc.field}: {exc.message}", details={"field": f"spec.{exc.field}"}) from None
        checked: dict[str, Any] = {}
        for name, step in pipeline.steps.items():
            if step.job is None:
                continue
            if step.job.experiment is None:  # a pipeline's job steps are runs of its own experiment
                step.job = step.job.model_copy(update={"experiment": pipeline.name})
            try:
                code = (step.code_sha256 or code_sha256) if code_checked else None
                job_spec = self.jobs.check_submit(principal, step.job, code)
            except KilnError as exc:
                field = str((exc.details or {}).get("field") or "").removeprefix("spec.")
                raise InvalidInput(
                    f"steps.{name}: {exc.message}",
                    details={"field": f"spec.steps.{name}" + (f".{field}" if field else "")},
                ) from None
            checked[name] = job_spec.model_dump(mode="json")
        return pipeline.name, checked

    # -- schedules ----------------------------------------------------------------------------------------------

    def schedule(self, principal: Principal, body: PipelineScheduleSubmit) -> PipelineScheduleRead:
        """A pipeline run on a cron schedule: checked whole now, and each run's job steps again when it starts."""
        principal.require("pipelines:write")
        try:
            cron = check_cron(body.cron)
        except PipelineError as exc:
            raise InvalidInput(f"cron: {exc.message}", details={"field": "cron"}) from None
        name, _ = self.check(principal, body.spec, body.code_sha256)
        now = utcnow()
        row = PipelineSchedule(
            id=new_id("psch"),
            org_id=principal.org_id,
            user_id=principal.user_id,
            name=name,
            spec=body.spec,
            code_sha256=body.code_sha256,
            use_cache=body.use_cache,
            cron=cron,
            next_at=next_time(cron, now),
            message="",
            created_at=now,
        )
        with self.db.transaction() as s:
            s.add(row)
            s.flush()
            read = _schedule_read(row, principal.user_name)
        self.wake()
        return read

    def list_schedules(self, principal: Principal) -> list[PipelineScheduleRead]:
        principal.require("pipelines:read")
        with self.db.read() as s:
            rows = s.execute(
                select(PipelineSchedule, User.name)
                .join(User, User.id == PipelineSchedule.user_id)
                .where(PipelineSchedule.org_id == principal.org_id)
                .order_by(PipelineSchedule.created_at)
            ).all()
            return [_schedule_read(row, user) for row, user in rows]

    def unschedule(self, principal: Principal, schedule_id: str) -> None:
        principal.require("pipelines:write")
        with self.db.transaction() as s:
            row = s.scalar(
                select(PipelineSchedule).where(
                    PipelineSchedule.id == schedule_id, PipelineSchedule.org_id == principal.org_id
                )
            )
            if row is None:
                raise NotFound(f"pipeline schedule {schedule_id} not found")
            s.delete(row)

    def get(self, principal: Principal, run_id: str) -> PipelineRunRead:
        principal.require("pipelines:read")
        with self.db.read() as s:
            run = self._load(s, principal, run_id)
            return self._read(s, run)

    def list_runs(self, principal: Principal, name: str | None = None, limit: int = 50) -> list[PipelineRunRead]:
        principal.require("pipelines:read")
        query = select(PipelineRun).where(PipelineRun.org_id == principal.org_id)
        if name:
            query = query.where(PipelineRun.name == name)
        with self.db.read() as s:
            runs = s.scalars(query.order_by(PipelineRun.created_at.desc()).limit(min(limit, MAX_LIST))).all()
            return [self._read(s, run) for run in runs]

    def cancel(self, principal: Principal, run_id: str) -> PipelineRunRead:
        """Cancel a running run: its waiting and running steps are CANCELLED, and the running ones' jobs
        cancelled."""
        principal.require("pipelines:write")
        with self.db.transaction() as s:
            run = self._load(s, principal, run_id, lock=True)
            if run.state != RunState.RUNNING:
                raise Conflict(f"pipeline run {run_id} is {run.state}; only a running run is cancelled")
            run.state = RunState.CANCELLED
            run.message = f"cancelled by {principal.user_name}"
            run.updated_at = run.finished_at = utcnow()
            running = []
            for step in self._steps(s, run.id):
                if step.state in (StepState.WAITING, StepState.RUNNING):
                    if step.state == StepState.RUNNING and step.job_id:
                        running.append(step.job_id)
                    step.state, step.message, step.finished_at = StepState.CANCELLED, "the run was cancelled", utcnow()
        for job_id in running:
            try:
                self.jobs.cancel(principal, job_id)
            except KilnError:  # it ended meanwhile
                pass
        self.wake()
        return self.get(principal, run_id)

    def resume(self, principal: Principal, run_id: str) -> PipelineRunRead:
        """Run a failed or cancelled run's failed, skipped and cancelled steps again (from their first try); the
        steps that succeeded (or were cached) are kept, and their results reused."""
        principal.require("pipelines:write")
        with self.db.transaction() as s:
            run = self._load(s, principal, run_id, lock=True)
            if run.state not in (RunState.FAILED, RunState.CANCELLED):
                raise Conflict(f"pipeline run {run_id} is {run.state}; a failed or cancelled run is resumed")
            again = 0
            for step in self._steps(s, run.id):
                if step.state in (StepState.FAILED, StepState.SKIPPED, StepState.CANCELLED):
                    step.state, step.job_id, step.tries, step.retry_at = StepState.WAITING, None, 0, None
                    step.message, step.started_at, step.finished_at = "", None, None
                    again += 1
            run.state, run.message, run.finished_at, run.updated_at = RunState.RUNNING, "", None, utcnow()
            run.message = f"resumed by {principal.user_name}: {again} step(s) again"
        self.wake()
        return self.get(principal, run_id)

    # -- reading ---------------------------------------------------------------------------------------------

    @staticmethod
    def _load(s: Session, principal: Principal, run_id: str, lock: bool = False) -> PipelineRun:
        query = select(PipelineRun).where(PipelineRun.id == run_id, PipelineRun.org_id == principal.org_id)
        if lock and s.get_bind().dialect.name == "postgresql":
            query = query.with_for_update()
        run = s.scalar(query)
        if run is None:
            raise NotFound(f"pipeline run {run_id} not found")
        return run

    @staticmethod
    def _steps(s: Session, run_id: str) -> list[PipelineStep]:
        return list(
            s.scalars(select(PipelineStep).where(PipelineStep.run_id == run_id).order_by(PipelineStep.position))
        )

    def _read(self, s: Session, run: PipelineRun, user: str | None = None) -> PipelineRunRead:
        if user is None:
            user = s.scalar(select(User.name).where(User.id == run.user_id)) or run.user_id
        raw_steps = (run.spec.get("pipeline") or {}).get("steps") or {}
        steps = []
        for row in self._steps(s, run.id):
            raw = raw_steps.get(row.name) or {}
            depends = raw.get("depends_on") or []
            steps.append(
                PipelineStepRead(
                    name=row.name,
                    kind=row.kind,
                    state=StepState(row.state),
                    depends_on=[depends] if isinstance(depends, str) else list(depends),
                    job_id=row.job_id,
                    cached=row.cached,
                    tries=row.tries,
                    message=row.message,
                    result=dict(row.result or {}),
                    started_at=row.started_at,
                    finished_at=row.finished_at,
                )
            )
        return PipelineRunRead(
            id=run.id,
            name=run.name,
            state=RunState(run.state),
            message=run.message,
            user=user,
            use_cache=run.use_cache,
            created_at=run.created_at,
            finished_at=run.finished_at,
            steps=steps,
        )


def new_run(
    s: Session,
    principal: Principal,
    name: str,
    spec: dict[str, Any],
    checked: dict[str, Any],
    code_sha256: str | None,
    use_cache: bool,
) -> PipelineRun:
    """A RUNNING run of ``spec`` and its WAITING steps, in the caller's transaction (the task wakes for it)."""
    pipeline = parse_pipeline(spec)
    now = utcnow()
    run = PipelineRun(
        id=new_id("prun"),
        org_id=principal.org_id,
        user_id=principal.user_id,
        name=name,
        spec={"pipeline": spec, "jobs": checked},
        code_sha256=code_sha256,
        use_cache=use_cache,
        state=RunState.RUNNING,
        message="",
        created_at=now,
        updated_at=now,
    )
    s.add(run)
    s.flush()
    for position, (step_name, step) in enumerate(pipeline.steps.items()):
        s.add(
            PipelineStep(
                run_id=run.id,
                name=step_name,
                org_id=principal.org_id,
                position=position,
                kind=step.kind,
                state=StepState.WAITING,
                tries=0,
                attempts=0,
                cached=False,
                result={},
                message="",
            )
        )
    s.flush()
    return run


def _schedule_read(row: PipelineSchedule, user: str) -> PipelineScheduleRead:
    return PipelineScheduleRead(
        id=row.id,
        name=row.name,
        cron=row.cron,
        next_at=row.next_at,
        last_run_id=row.last_run_id,
        last_at=row.last_at,
        message=row.message,
        use_cache=row.use_cache,
        user=user,
        created_at=row.created_at,
    )


def all_ended(steps: list[PipelineStep]) -> bool:
    return all(StepState(step.state) in STEP_ENDED for step in steps)

"""Tuning studies' use cases: start, read, list, stop, trials, events. They record intent; the ``studies`` task
(kiln.tasks.studies) runs the trials."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from kiln.db.session import Database
from kiln.db.tables import Job, TuningEvent, TuningStudy, TuningTrial, utcnow
from kiln.domain.ids import new_id
from kiln.domain.studies import (
    PruneReport,
    StudyEventRead,
    StudyRead,
    StudyReason,
    StudySpec,
    StudyState,
    StudySubmit,
    TrialCounts,
    TrialRead,
    TrialState,
    TrialVerdict,
)
from kiln.errors import Conflict, InvalidInput, KilnError, NotFound
from kiln.usecases.access.idempotency import Idempotency, IdempotentRequest, Remember
from kiln.usecases.access.identity import Principal
from kiln.usecases.jobs.jobs import JobService, request_cancel
from kiln.usecases.notifications import notification_events


def add_event(
    s: Session,
    study: TuningStudy,
    reason: str,
    message: str = "",
    *,
    trial: int | None = None,
    to: StudyState | None = None,
    now: datetime | None = None,
) -> None:
    """An event of ``study``; with ``to``, its move to that state (stamped, and finished if terminal)."""
    now = now or utcnow()
    current = study.state
    if to is not None:
        if StudyState(current).terminal:
            raise Conflict(f"study {study.id} already ended ({current})")
        study.state = to
        study.reason = reason
        study.message = message
        study.updated_at = now
        if to.terminal:
            study.finished_at = now
    s.add(
        TuningEvent(
            study_id=study.id,
            time=now,
            from_state=current if to is not None else None,
            to_state=to,
            reason=reason,
            trial=trial,
            message=message,
        )
    )
    if to is not None and to.terminal:  # told to its subscriptions, committed with its end
        notification_events.study_ended(s, study)


def end_trial(s: Session, trial: TuningTrial, state: TrialState, message: str, job: Job | None) -> None:
    """Mark ``trial`` ended (Optuna is told later: ``told`` stays False) and cancel its job if it still runs."""
    trial.state = state
    trial.message = message
    trial.finished_at = utcnow()
    if job is not None:
        request_cancel(s, job, f"cancelled: trial {trial.number} of study {trial.study_id} {message}")


def _rank(trial: TrialRead, direction: str) -> tuple[Any, ...]:
    """Sort key of the objective order: succeeded best first, then pruned by their last value, running, failed,
    cancelled; ties by number."""
    sign = -1.0 if direction == "maximize" else 1.0
    group = {"SUCCEEDED": 0, "PRUNED": 1, "RUNNING": 2, "FAILED": 3, "CANCELLED": 4}[trial.state]
    value = trial.value if trial.state == TrialState.SUCCEEDED else trial.last_value
    return (group, value is None, sign * value if value is not None else 0.0, trial.number)


def trial_read(trial: TuningTrial, job: Any, now: datetime) -> TrialRead:
    """A TrialRead from a trial row and its job's (state, started_at, running_at, finished_at) or None."""
    duration = None
    if job is not None and job.state is not None:
        start = job.running_at or job.started_at
        if start is not None:
            end = job.finished_at or (trial.finished_at if TrialState(trial.state).terminal else None) or now
            duration = max(0.0, (end - start).total_seconds())
    return TrialRead(
        study_id=trial.study_id,
        number=trial.number,
        job_id=trial.job_id,
        state=TrialState(trial.state),
        job_state=job.state if job is not None else None,
        params=trial.params,
        value=trial.value,
        last_step=trial.last_step,
        last_value=trial.last_value,
        pruned_step=trial.pruned_step,
        pruning=PruneReport.model_validate(trial.prune_report) if trial.prune_report else None,
        message=trial.message,
        created_at=trial.created_at,
        finished_at=trial.finished_at,
        duration_seconds=duration,
    )


def _trial_query() -> Any:
    return (
        select(TuningTrial, Job.state, Job.started_at, Job.running_at, Job.finished_at)
        .outerjoin(Job, Job.id == TuningTrial.job_id)
        .order_by(TuningTrial.number)
    )


class _JobTimes:
    def __init__(self, row: Any) -> None:
        self.state, self.started_at, self.running_at, self.finished_at = row[1], row[2], row[3], row[4]


def read_trials(s: Session, study_ids: Iterable[str]) -> dict[str, list[TrialRead]]:
    now = utcnow()
    out: dict[str, list[TrialRead]] = {}
    ids = list(study_ids)
    if not ids:
        return out
    for row in s.execute(_trial_query().where(TuningTrial.study_id.in_(ids))):
        out.setdefault(row[0].study_id, []).append(trial_read(row[0], _JobTimes(row), now))
    return out


def best_of(trials: list[TrialRead], direction: str) -> TrialRead | None:
    done = [t for t in trials if t.state == TrialState.SUCCEEDED and t.value is not None]
    if not done:
        return None
    return min(done, key=lambda t: _rank(t, direction))


def _counts(trials: list[TrialRead]) -> TrialCounts:
    counts = TrialCounts(total=len(trials))
    for t in trials:
        field = t.state.lower()
        setattr(counts, field, getattr(counts, field) + 1)
    return counts


def study_read(study: TuningStudy, trials: list[TrialRead]) -> StudyRead:
    spec = StudySpec.model_validate(study.spec)
    return StudyRead(
        id=study.id,
        name=study.name,
        org_id=study.org_id,
        user_id=study.user_id,
        state=StudyState(study.state),
        reason=study.reason,
        message=study.message,
        spec=spec,
        code_sha256=study.code_sha256,
        planned_trials=study.planned_trials,
        trials=_counts(trials),
        best=best_of(trials, spec.objective.direction),
        created_at=study.created_at,
        updated_at=study.updated_at,
        finished_at=study.finished_at,
    )


class StudyService:
    def __init__(
        self, db: Database, jobs: JobService, wake: Callable[[], None], idempotency: Idempotency | None = None
    ) -> None:
        self.db = db
        self.jobs = jobs
        self.wake = wake  # the studies task: a new study, or one stopped
        self.idempotency = idempotency or jobs.idempotency  # the Idempotency-Keys of creates

    def load(self, s: Session, principal: Principal, study_id: str, *, lock: bool = False) -> TuningStudy:
        query = select(TuningStudy).where(TuningStudy.id == study_id)
        if not principal.platform_admin:
            query = query.where(TuningStudy.org_id == principal.org_id)
        if lock and self.db.dialect == "postgresql":
            query = query.with_for_update()
        study = s.scalar(query)
        if study is None:  # the same answer whether it does not exist or is another organisation's
            raise NotFound(f"study {study_id} not found")
        return study

    def create(
        self, principal: Principal, body: StudySubmit, idempotency: IdempotentRequest | None = None
    ) -> StudyRead:
        """A new RUNNING study. With ``idempotency`` (the request's Idempotency-Key), a repeat of the same request
        answers the study the first one created, as it is now (the same study: same id), and creates none."""
        principal.require("studies:write")
        return self.idempotency.create(
            principal, idempotency, "study", lambda remember: self._create(principal, body, remember), self._read_by_id
        )

    @staticmethod
    def _read_by_id(s: Session, study_id: str) -> StudyRead | None:
        study = s.get(TuningStudy, study_id)
        return None if study is None else study_read(study, read_trials(s, [study.id]).get(study.id, []))

    def _create(self, principal: Principal, body: StudySubmit, remember: Remember) -> StudyRead:
        spec = body.spec
        try:  # the trial spec gets every check a job submit makes (its inputs pinned for every trial)
            trial = self.jobs.check_submit(principal, spec.trial, body.code_sha256)
        except KilnError as exc:
            raise _in_trial(exc) from None
        spec = spec.model_copy(update={"trial": trial})
        now = utcnow()
        with self.db.transaction() as s:
            study = TuningStudy(
                id=new_id("study"),
                org_id=principal.org_id,
                user_id=principal.user_id,
                name=spec.display_name,
                spec=spec.model_dump(mode="json"),
                code_sha256=body.code_sha256,
                state=StudyState.RUNNING,
                reason=StudyReason.SUBMITTED,
                message="",
                planned_trials=spec.planned_trials,
                created_at=now,
                updated_at=now,
            )
            s.add(study)
            s.flush()  # the study's row before the rows that refer to it
            s.add(
                TuningEvent(
                    study_id=study.id,
                    time=now,
                    to_state=StudyState.RUNNING,
                    reason=StudyReason.SUBMITTED,
                    message=f"submitted by {principal.user_name}: {study.planned_trials} trials, "
                    f"{spec.parallelism} at a time, {spec.algorithm}, early stopping {spec.early_stopping.type}",
                )
            )
            s.flush()
            remember(s, study.id)
            read = study_read(study, [])
        self.wake()
        return read

    def get(self, principal: Principal, study_id: str) -> StudyRead:
        principal.require("studies:read")
        with self.db.read() as s:
            study = self.load(s, principal, study_id)
            return study_read(study, read_trials(s, [study.id]).get(study.id, []))

    def list_studies(
        self,
        principal: Principal,
        *,
        states: list[StudyState] | None = None,
        limit: int = 50,
        before: str | None = None,
    ) -> list[StudyRead]:
        principal.require("studies:read")
        query = select(TuningStudy).order_by(TuningStudy.created_at.desc(), TuningStudy.id.desc()).limit(limit)
        if not principal.platform_admin:
            query = query.where(TuningStudy.org_id == principal.org_id)
        if states:
            query = query.where(TuningStudy.state.in_([str(x) for x in states]))
        if before:  # keyset paging on the sort key; the study named must be one the caller sees
            ref = select(TuningStudy.created_at).where(TuningStudy.id == before)
            if not principal.platform_admin:
                ref = ref.where(TuningStudy.org_id == principal.org_id)
            when = ref.scalar_subquery()
            query = query.where(
                or_(TuningStudy.created_at < when, and_(TuningStudy.created_at == when, TuningStudy.id < before))
            )
        with self.db.read() as s:
            studies = list(s.scalars(query))
            trials = read_trials(s, [x.id for x in studies])
            return [study_read(x, trials.get(x.id, [])) for x in studies]

    def trials(self, principal: Principal, study_id: str, order: str = "objective") -> list[TrialRead]:
        principal.require("studies:read")
        with self.db.read() as s:
            study = self.load(s, principal, study_id)
            items = read_trials(s, [study.id]).get(study.id, [])
            direction = StudySpec.model_validate(study.spec).objective.direction
        if order == "objective":
            items.sort(key=lambda t: _rank(t, direction))
        return items

    def verdict(self, principal: Principal, job_id: str) -> TrialVerdict:
        """The pruner's verdict on the trial that ``job_id`` runs (its own job token may ask: ``jobs:read``)."""
        principal.require("jobs:read")
        with self.db.read() as s:
            job = self.jobs.load(s, principal, job_id)
            trial = s.scalar(select(TuningTrial).where(TuningTrial.job_id == job.id))
            if trial is None:
                raise NotFound(f"job {job_id} is not a trial of a tuning study")
            return TrialVerdict(
                study_id=trial.study_id,
                number=trial.number,
                state=TrialState(trial.state),
                prune=trial.state == TrialState.PRUNED,
                judged_step=trial.last_step,
                pruned_step=trial.pruned_step,
            )

    def best(self, principal: Principal, study_id: str) -> TrialRead:
        read = self.get(principal, study_id)
        if read.best is None:
            raise NotFound(f"study {study_id} has no succeeded trial yet ({read.trials.total} trials so far)")
        return read.best

    def stop(self, principal: Principal, study_id: str) -> StudyRead:
        """Stop the study: no new trial, every running trial's job cancelled (idempotent)."""
        principal.require("studies:write")
        with self.db.transaction() as s:
            study = self.load(s, principal, study_id, lock=True)
            state = StudyState(study.state)
            if state is StudyState.RUNNING:
                running = s.execute(
                    select(TuningTrial, Job)
                    .outerjoin(Job, Job.id == TuningTrial.job_id)
                    .where(TuningTrial.study_id == study.id, TuningTrial.state == TrialState.RUNNING)
                ).all()
                for trial, job in running:
                    end_trial(s, trial, TrialState.CANCELLED, "stopped with the study", job)
                    add_event(s, study, StudyReason.TRIAL_CANCELLED, "stopped with the study", trial=trial.number)
                add_event(
                    s,
                    study,
                    StudyReason.STOPPED,
                    f"stopped by {principal.user_name}; {len(running)} running trials cancelled",
                    to=StudyState.STOPPED,
                )
            elif state is not StudyState.STOPPED:
                raise Conflict(f"study {study_id} already ended ({state}); nothing to stop")
        self.jobs.wake()
        self.wake()
        return self.get(principal, study_id)

    def events(self, principal: Principal, study_id: str) -> list[StudyEventRead]:
        principal.require("studies:read")
        with self.db.read() as s:
            self.load(s, principal, study_id)
            rows = s.scalars(select(TuningEvent).where(TuningEvent.study_id == study_id).order_by(TuningEvent.id))
            return [
                StudyEventRead(
                    id=e.id,
                    study_id=e.study_id,
                    time=e.time,
                    from_state=StudyState(e.from_state) if e.from_state else None,
                    to_state=StudyState(e.to_state) if e.to_state else None,
                    reason=e.reason,
                    trial=e.trial,
                    message=e.message,
                )
                for e in rows
            ]


def _in_trial(exc: KilnError) -> KilnError:
    """An error of the trial spec's own fields, named as the study's field (``trial.resources: …``); the others
    (a quota, a priority, the code bundle: not fields of the trial spec) as a job submit gives them."""
    if not isinstance(exc, InvalidInput) or exc.message.startswith("code_sha256:"):
        return exc
    details = exc.details
    if isinstance(details, dict) and isinstance(details.get("field"), str):
        details = {**details, "field": "spec.trial." + details["field"].removeprefix("spec.")}
    else:
        details = {"field": "spec.trial"}
    return InvalidInput(f"trial.{exc.message}", details=details)

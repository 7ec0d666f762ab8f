"""The ``studies`` task: drives every running tuning study, one server at a time (a leased task).

Each run, for each study that is running or has trials Optuna was not yet told the end of:

1. **Adopt** Optuna trials that are RUNNING but have no Kiln trial (a server died between Optuna's ``ask`` and
   the transaction that creates the trial's job): the trial gets its job now, with the parameters drawn then.
2. **Tell** Optuna the end of trials whose Kiln row has ended (``told`` False): the row is written first, so a
   crash in between is finished here.
3. **Observe** running trials: every new point of the objective metric (from the metrics store) is reported to
   Optuna and judged by the study's pruner (kiln.domain.pruning, over the histories Optuna keeps), one point at a
   time in order; a trial the pruner stops is PRUNED, with the reasons, and its job cancelled in one transaction,
   so its CPUs and GPUs go to the next trial at once. A trial whose job ended gets its final value (``last`` or ``best``
   of the series) or fails.
4. **Decide** the study: too many failures, its time budget, or all its trials done.
5. **Start** trials while fewer than ``parallelism`` run and fewer than ``planned_trials`` were made: Optuna's
   sampler draws the parameters (``ask``), then one transaction creates the trial row and its QUEUED job — placed
   by the scheduler and counted against the organisation's train quota like any job.

Every write is in the run's fenced transaction (``ctx.transaction()``: the task's token checked inside it), and
every write to Optuna's storage (which may be another database) comes right after ``ctx.fence()``, so a server
that stalled past its lease cannot add, end or report trials after another server took over; the trial rows are
what is counted, so no trial is made twice.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from kiln.db.session import Database
from kiln.db.tables import Job, MetricPoint, MetricSeries, TuningStudy, TuningTrial, utcnow
from kiln.domain import pruning
from kiln.domain.states import JobState
from kiln.domain.studies import PruneReport, StudyReason, StudySpec, StudyState, TrialState, trial_spec
from kiln.tasks.runner import Task, TaskContext
from kiln.usecases.jobs.jobs import JobService
from kiln.usecases.notifications import notification_events
from kiln.usecases.tuning.studies import add_event, end_trial

if TYPE_CHECKING:
    import optuna

    from kiln.usecases.tuning import tuning_engine

log = logging.getLogger(__name__)

INTERVAL = 0.25  # seconds between full runs (a trial's new objective points are judged at once: ``judge_soon``)
SETTLE_SECONDS = 10.0  # how long after its job succeeded a trial's objective may still arrive (metrics lag)


@dataclass
class _Study:
    row: TuningStudy
    spec: StudySpec
    trials: list[tuple[TuningTrial, Job | None]]


class StudyDriver:
    def __init__(
        self,
        db: Database,
        jobs: JobService,
        home: Path,
        ingest_metrics: Callable[[], object] | None = None,
    ) -> None:
        self.db = db
        self.jobs = jobs
        self.home = home
        self.ingest_metrics = ingest_metrics
        self._storage: optuna.storages.RDBStorage | None = None
        self._studies: dict[str, optuna.Study] = {}  # this process's Optuna studies (their samplers hold state)
        self._pruners: dict[str, tuning_engine.Pruner] = {}  # and their pruners (an auto setting, once fixed)
        self._task = Task("studies", self.run_once, INTERVAL, lease_scope="studies")
        self._pending: set[str] = set()  # jobs with new points, for the next run to judge first
        self._pending_lock = threading.Lock()
        self._next_full = 0.0  # monotonic time of the next full run

    def task(self) -> Task:
        return self._task

    def wake(self) -> None:
        self._next_full = 0.0
        self._task.wake.set()

    def judge_soon(self, job_ids: Iterable[str]) -> None:
        """Points of these jobs were just stored: the trials among them are judged now, before anything else
        and without waiting for the next full run (the pruner's verdict follows the report, not the interval)."""
        with self._pending_lock:
            self._pending.update(job_ids)
        self._task.wake.set()

    # ---- a run

    def run_once(self, ctx: TaskContext) -> float | None:
        with self._pending_lock:
            pending, self._pending = self._pending, set()
        if pending:
            self._judge(ctx, pending)  # LeaseLost, where another server took over, ends the run (the runner)
        now = time.monotonic()
        if ctx.woken and now < self._next_full:
            return self._next_full - now  # woken to judge only: the full run keeps its pace
        self._next_full = now + INTERVAL
        self._run_full(ctx)
        return None

    def _judge(self, ctx: TaskContext, job_ids: set[str]) -> None:
        """Report the new points of these jobs' running trials to the pruner (the part of ``_observe`` that
        cannot wait). A study this process has not loaded yet is left to the full run."""
        with self.db.read() as s:
            rows = [
                (t, j)
                for t, j in s.execute(
                    select(TuningTrial, Job)
                    .join(Job, Job.id == TuningTrial.job_id)
                    .where(TuningTrial.job_id.in_(sorted(job_ids)), TuningTrial.state == TrialState.RUNNING)
                )
            ]
            study_rows = {
                r.id: r for r in s.scalars(select(TuningStudy).where(TuningStudy.id.in_({t.study_id for t, _ in rows})))
            }
            s.expunge_all()
        for trial, job in rows:
            row = study_rows.get(trial.study_id)
            ostudy = self._studies.get(trial.study_id)
            if row is None or ostudy is None or StudyState(row.state) is not StudyState.RUNNING or _ended(job):
                continue
            if self._report(ctx, _Study(row, StudySpec.model_validate(row.spec), []), ostudy, trial, job):
                self._next_full = 0.0  # a trial was stopped: the full run that starts the next one comes now

    def _run_full(self, ctx: TaskContext) -> None:
        with self.db.read() as s:
            untold = select(TuningTrial.study_id).where(TuningTrial.told.is_(False))
            ids = list(
                s.scalars(
                    select(TuningStudy.id)
                    .where(or_(TuningStudy.state == StudyState.RUNNING, TuningStudy.id.in_(untold)))
                    .order_by(TuningStudy.created_at)
                )
            )
        for study_id in ids:
            if ctx.stopping.is_set():
                return
            self._drive(ctx, study_id)

    def _load(self, study_id: str) -> _Study:
        with self.db.read() as s:
            row = s.get(TuningStudy, study_id)
            assert row is not None
            trials: list[tuple[TuningTrial, Job | None]] = [
                (t, j)
                for t, j in s.execute(
                    select(TuningTrial, Job)
                    .outerjoin(Job, Job.id == TuningTrial.job_id)
                    .where(TuningTrial.study_id == study_id)
                    .order_by(TuningTrial.number)
                )
            ]
            s.expunge_all()
        return _Study(row, StudySpec.model_validate(row.spec), trials)

    def _optuna(self, ctx: TaskContext, study: _Study) -> optuna.Study:
        from kiln.usecases.tuning import tuning_engine

        cached = self._studies.get(study.row.id)
        if cached is not None:
            return cached
        ctx.fence()  # loading creates Optuna's tables and the study on first use
        if self._storage is None:
            self._storage = tuning_engine.open_storage(self.db.url, self.home)
        made = len(study.trials)
        ostudy = tuning_engine.load_study(self._storage, study.row.id, study.spec, made)
        self._studies[study.row.id] = ostudy
        return ostudy

    def _drive(self, ctx: TaskContext, study_id: str) -> None:
        study = self._load(study_id)
        ostudy = self._optuna(ctx, study)
        running = StudyState(study.row.state) is StudyState.RUNNING
        self._adopt(ctx, study, ostudy, running)
        self._tell_ended(ctx, study, ostudy)
        if not running:
            if all(t.told for t, _ in study.trials):
                self._studies.pop(study_id, None)
                self._pruners.pop(study_id, None)
            return
        study = self._load(study_id)
        self._observe(ctx, study, ostudy)
        study = self._load(study_id)
        if self._decide(ctx, study):
            self._tell_ended(ctx, self._load(study_id), ostudy)
            self._studies.pop(study_id, None)
            self._pruners.pop(study_id, None)
            return
        self._start_trials(ctx, study, ostudy)

    # ---- 1. adopt, 2. tell

    def _adopt(self, ctx: TaskContext, study: _Study, ostudy: optuna.Study, running: bool) -> None:
        from optuna.trial import TrialState as OptunaState

        known = {t.optuna_trial_id for t, _ in study.trials}
        orphans = [
            ft for ft in ostudy.get_trials(deepcopy=False, states=(OptunaState.RUNNING,)) if ft._trial_id not in known
        ]
        made = len(study.trials)
        wanted = set(study.spec.parameters)
        if orphans:
            ctx.fence()  # each is told FAIL, or becomes a trial (in a fenced transaction)
        for ft in orphans:
            # Optuna's ask stores the trial, then each parameter it draws: a crash in between leaves a trial with
            # some or none of them. Nothing was made of it (no job without all its parameters): it fails, and the
            # next pass asks anew (a job of it ran its command with "{x}" unreplaced).
            if set(ft.params) != wanted:
                ostudy.tell(ft.number, state=OptunaState.FAIL, skip_if_finished=True)
            elif running and made < study.row.planned_trials:
                self._create_trial(ctx, study, made, ft._trial_id, dict(ft.params), adopted=True)
                made += 1
            else:
                ostudy.tell(ft.number, state=OptunaState.FAIL, skip_if_finished=True)

    def _tell_ended(self, ctx: TaskContext, study: _Study, ostudy: optuna.Study) -> None:
        import optuna
        from optuna.trial import TrialState as OptunaState

        states = {
            TrialState.SUCCEEDED: OptunaState.COMPLETE,
            TrialState.PRUNED: OptunaState.PRUNED,
            TrialState.FAILED: OptunaState.FAIL,
            TrialState.CANCELLED: OptunaState.FAIL,
        }
        for trial, _ in study.trials:
            if trial.told or trial.state == TrialState.RUNNING:
                continue
            state = states[TrialState(trial.state)]
            value = trial.value if state is OptunaState.COMPLETE else None
            # Told by its Trial object: an int would be read as Optuna's trial *number*, not its id.
            otrial = optuna.trial.Trial(ostudy, trial.optuna_trial_id)
            ctx.fence()
            _tell(ostudy, otrial, value, state)
            with ctx.transaction() as s:
                row = s.get(TuningTrial, (trial.study_id, trial.number))
                if row is not None:
                    row.told = True

    # ---- 3. observe

    def _observe(self, ctx: TaskContext, study: _Study, ostudy: optuna.Study) -> None:
        ended = [t for t, j in study.trials if t.state == TrialState.RUNNING and (j is None or _ended(j))]
        if ended and self.ingest_metrics is not None:
            self.ingest_metrics()  # the points an ended job left in its spool file, before its value is read
        for trial, job in study.trials:
            if trial.state != TrialState.RUNNING:
                continue
            if job is None:
                self._end(ctx, study, trial, None, TrialState.FAILED, "its job was deleted")
                continue
            pruned = self._report(ctx, study, ostudy, trial, job)
            if not pruned and _ended(job):
                self._settle(ctx, study, trial, job)

    def _series(self, s: Session, job_id: str, metric: str) -> MetricSeries | None:
        return s.scalars(
            select(MetricSeries)
            .where(MetricSeries.job_id == job_id, MetricSeries.name == metric, MetricSeries.kind == "scalar")
            .order_by(MetricSeries.worker)
            .limit(1)
        ).first()

    def _report(self, ctx: TaskContext, study: _Study, ostudy: optuna.Study, trial: TuningTrial, job: Job) -> bool:
        """Feed the objective's new points to Optuna and the pruner; True when the pruner stopped the trial.

        Each point is judged as it is reported, whatever batch it came in (a batch spanning rung 5 is judged at
        step 5, not at its last step), and the points after the one that stopped the trial are not reported: a
        trial stopped at a rung has no step past it, so it does not count at the next rung."""
        from kiln.usecases.tuning import tuning_engine

        with self.db.read() as s:
            series = self._series(s, job.id, study.spec.objective.metric)
            if series is None:
                return False
            points = s.execute(
                select(MetricPoint.seq, MetricPoint.step, MetricPoint.value)
                .where(MetricPoint.series_id == series.id, MetricPoint.seq > trial.reported_seq)
                .order_by(MetricPoint.seq)
            ).all()
        if not points:
            return False
        step, value = trial.last_step, trial.last_value
        finite = [
            (p_seq, p_step if p_step is not None else p_seq, p_value)
            for p_seq, p_step, p_value in points
            if p_value is not None and math.isfinite(p_value)
        ]
        if finite:
            pruner = self._pruner(study) if not _ended(job) else None  # an ended job's last points: no verdict
            ctx.fence()  # each point reported is a write to Optuna's storage
            stopped = tuning_engine.report_points(
                ostudy, trial.optuna_trial_id, [(p[1], p[2]) for p in finite], pruner, trial.last_step
            )
            if stopped is not None:
                index, verdict = stopped
                self._prune(ctx, study, trial, job, finite[index], verdict)
                return True
            _, step, value = finite[-1]
        seq = points[-1][0]
        with ctx.transaction() as s:
            saved = s.get(TuningTrial, (trial.study_id, trial.number))
            if saved is not None and saved.state == TrialState.RUNNING:
                saved.reported_seq, saved.last_step, saved.last_value = seq, step, value
                trial.reported_seq, trial.last_step, trial.last_value = seq, step, value
        return False

    def _prune(
        self,
        ctx: TaskContext,
        study: _Study,
        trial: TuningTrial,
        job: Job,
        point: tuple[int, int, float],
        verdict: pruning.Verdict,
    ) -> None:
        """The trial is PRUNED at the verdict's rung and its job cancelled, in one transaction, with the reasons."""
        seq, step, value = point
        objective = study.spec.objective
        message = verdict.describe(objective.metric, objective.direction)
        with ctx.transaction() as s:
            row, live = _lock(s, trial, job.id)
            if row.state != TrialState.RUNNING:
                return
            row.reported_seq, row.last_step, row.last_value = seq, step, value
            row.pruned_step = verdict.rung
            row.prune_report = PruneReport.of(verdict).model_dump(mode="json")
            end_trial(s, row, TrialState.PRUNED, message, live)
            add_event(s, study.row, StudyReason.TRIAL_PRUNED, message, trial=trial.number)
        self.jobs.wake(job.id)  # stop its attempt now

    def _pruner(self, study: _Study) -> tuning_engine.Pruner:
        """The study's pruner, kept while this process drives it (an ``auto`` setting is fixed once)."""
        from kiln.usecases.tuning import tuning_engine

        cached = self._pruners.get(study.row.id)
        if cached is None:
            cached = self._pruners[study.row.id] = tuning_engine.pruner(study.spec)
        return cached

    def _settle(self, ctx: TaskContext, study: _Study, trial: TuningTrial, job: Job) -> None:
        """A trial whose job ended: its final value, or why it has none."""
        state = JobState(job.state)
        objective = study.spec.objective
        if state is JobState.SUCCEEDED:
            with self.db.read() as s:
                series = self._series(s, job.id, objective.metric)
            value = None
            if series is not None:
                if objective.aggregate == "best":
                    value = series.max_value if objective.direction == "maximize" else series.min_value
                else:
                    value = series.last_value
            if value is None or not math.isfinite(value):
                finished = job.finished_at or utcnow()
                if utcnow() - finished < timedelta(seconds=SETTLE_SECONDS):
                    return  # its last points may still be on their way
                why = f"its job succeeded but never reported the objective metric {objective.metric!r}"
                self._end(ctx, study, trial, job, TrialState.FAILED, why)
                return
            self._end(ctx, study, trial, job, TrialState.SUCCEEDED, f"{objective.metric}={value:g}", value=value)
        elif state is JobState.FAILED:
            why = f"its job failed ({job.reason}{': ' + job.message if job.message else ''})"
            self._end(ctx, study, trial, job, TrialState.FAILED, why)
        else:
            self._end(ctx, study, trial, job, TrialState.CANCELLED, "its job was cancelled")

    def _end(
        self,
        ctx: TaskContext,
        study: _Study,
        trial: TuningTrial,
        job: Job | None,
        state: TrialState,
        message: str,
        value: float | None = None,
    ) -> None:
        reasons = {
            TrialState.SUCCEEDED: StudyReason.TRIAL_SUCCEEDED,
            TrialState.FAILED: StudyReason.TRIAL_FAILED,
            TrialState.CANCELLED: StudyReason.TRIAL_CANCELLED,
        }
        with ctx.transaction() as s:
            row, live = _lock(s, trial, job.id if job is not None else None)
            if row.state != TrialState.RUNNING:
                return
            row.value = value
            end_trial(s, row, state, message, live)
            add_event(s, study.row, reasons[state], message, trial=trial.number)
            if state is TrialState.SUCCEEDED:
                notification_events.trial_succeeded(s, study.row, row, study.spec.objective.direction)
        trial.state = state

    # ---- 4. decide

    def _decide(self, ctx: TaskContext, study: _Study) -> bool:
        """End the study where it is over; True when it ended."""
        spec, row = study.spec, study.row
        trials = [t for t, _ in study.trials]
        failed = sum(t.state == TrialState.FAILED for t in trials)
        succeeded = sum(t.state == TrialState.SUCCEEDED for t in trials)
        running = sum(t.state == TrialState.RUNNING for t in trials)
        ending: tuple[StudyState, str, str] | None = None
        if spec.max_failed_trials is not None and failed > spec.max_failed_trials:
            last = next((t.message for t in reversed(trials) if t.state == TrialState.FAILED), "")
            ending = (
                StudyState.FAILED,
                StudyReason.TOO_MANY_FAILURES,
                f"{failed} trials failed, more than max_failed_trials ({spec.max_failed_trials}); the last: {last}",
            )
        elif spec.time_budget is not None and utcnow() - row.created_at >= timedelta(seconds=spec.time_budget):
            ending = (
                StudyState.SUCCEEDED if succeeded else StudyState.FAILED,
                StudyReason.TIME_BUDGET,
                f"the time budget of {spec.time_budget:g}s is spent after {len(trials)} trials "
                f"({succeeded} succeeded); {running} running trials stopped",
            )
        elif len(trials) >= row.planned_trials and not running:
            if succeeded:
                ending = (StudyState.SUCCEEDED, StudyReason.COMPLETED, f"{len(trials)} trials, {succeeded} succeeded")
            else:
                ending = (
                    StudyState.FAILED,
                    StudyReason.NO_RESULT,
                    f"none of {len(trials)} trials succeeded with a value of {spec.objective.metric!r}",
                )
        if ending is None:
            return False
        self._finish(ctx, study, *ending)
        return True

    def _fail_study(self, ctx: TaskContext, study: _Study, reason: str, message: str) -> None:
        self._finish(ctx, study, StudyState.FAILED, reason, message)

    def _finish(self, ctx: TaskContext, study: _Study, to: StudyState, reason: str, message: str) -> None:
        """The study ends: its running trials are cancelled, in the transaction of its last event."""
        with ctx.transaction() as s:
            fresh = s.get(TuningStudy, study.row.id, with_for_update=s.get_bind().dialect.name == "postgresql")
            if fresh is None or fresh.state != StudyState.RUNNING:
                return
            for trial, job in s.execute(
                select(TuningTrial, Job)
                .outerjoin(Job, Job.id == TuningTrial.job_id)
                .where(TuningTrial.study_id == fresh.id, TuningTrial.state == TrialState.RUNNING)
            ):
                end_trial(s, trial, TrialState.CANCELLED, f"stopped: {reason}", job)
                add_event(s, fresh, StudyReason.TRIAL_CANCELLED, f"stopped: {reason}", trial=trial.number)
            add_event(s, fresh, reason, message, to=to)
        study.row.state = to
        self.jobs.wake()
        log.info("study %s %s: %s", study.row.id, to, message)

    # ---- 5. start

    def _start_trials(self, ctx: TaskContext, study: _Study, ostudy: optuna.Study) -> None:
        from kiln.usecases.tuning import tuning_engine

        made = len(study.trials)
        running = sum(t.state == TrialState.RUNNING for t, _ in study.trials)
        space = tuning_engine.search_space(study.spec)
        while running < study.spec.parallelism and made < study.row.planned_trials and not ctx.stopping.is_set():
            ctx.fence()  # ask stores the trial in Optuna's storage (a trial the next holder would adopt)
            otrial = ostudy.ask(space)
            if not self._create_trial(ctx, study, made, otrial._trial_id, dict(otrial.params), adopted=False):
                return
            made += 1
            running += 1

    def _create_trial(
        self, ctx: TaskContext, study: _Study, number: int, optuna_id: int, params: dict[str, Any], adopted: bool
    ) -> bool:
        """Trial ``number`` and its job; False where the study ended instead (stopped, or the spec is invalid)."""
        row = study.row
        try:
            spec = trial_spec(study.spec, row.id, number, params)
        except ValidationError as exc:  # e.g. a command that the parameters make too long
            why = f"trial {number}'s job spec with {params} is invalid: {exc.errors()[0]['msg']}"
            self._fail_study(ctx, study, StudyReason.INVALID_TRIAL, why)
            return False
        shown = ", ".join(f"{k}={v}" for k, v in params.items())
        with ctx.transaction() as s:
            fresh = s.get(TuningStudy, row.id, with_for_update=s.get_bind().dialect.name == "postgresql")
            if fresh is None or fresh.state != StudyState.RUNNING:
                return False  # stopped meanwhile: the drawn trial is told FAIL as an orphan
            job = self.jobs.new_job(s, row.org_id, row.user_id, spec, row.code_sha256, f"trial {number} of {row.id}")
            s.flush()  # the job's row before the trial's, which refers to it
            s.add(
                TuningTrial(
                    study_id=row.id,
                    number=number,
                    optuna_trial_id=optuna_id,
                    job_id=job.id,
                    state=TrialState.RUNNING,
                    params=params,
                    reported_seq=-1,
                    message="",
                    told=False,
                    created_at=utcnow(),
                )
            )
            note = f"job {job.id}: {shown}" + (" (drawn before a restart)" if adopted else "")
            add_event(s, fresh, StudyReason.TRIAL_STARTED, note, trial=number)
        study.trials.append((TuningTrial(study_id=row.id, number=number, state=TrialState.RUNNING), None))
        self.jobs.wake()
        return True


def _ended(job: Job) -> bool:
    return JobState(job.state).terminal


def _lock(s: Session, trial: TuningTrial, job_id: str | None) -> tuple[TuningTrial, Job | None]:
    row = s.get(TuningTrial, (trial.study_id, trial.number), with_for_update=s.get_bind().dialect.name == "postgresql")
    assert row is not None
    return row, (s.get(Job, job_id) if job_id is not None else None)


def _tell(ostudy: Any, trial: Any, value: float | None, state: Any) -> None:
    """Tell Optuna a trial's end. The grid sampler, told the last point of its grid, calls ``study.stop()``,
    which raises outside ``study.optimize`` (Kiln asks and tells): Optuna has stored the trial's state by then (in
    its ``finally``), and Kiln ends a study itself when its grid is done, so that error is the end of the grid."""
    try:
        ostudy.tell(trial, value, state=state, skip_if_finished=True)
    except RuntimeError as exc:
        if "Study.stop" not in str(exc):
            raise

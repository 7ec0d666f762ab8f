"""What a run's row in a table says beyond MLflow's record of it (kiln.domain.run_table): its state in Kiln's words
(its job's state; PRUNED for a study's trial its pruner stopped) and, for a trial's run, its study's objective, so
that the table shows the objective first and a pruned trial its last value of it."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from kiln.db.tables import TuningStudy, TuningTrial
from kiln.domain.run_table import PRUNED


@dataclass(frozen=True)
class TrialMark:
    state: str | None  # PRUNED, else None (the job's state says the rest)
    objective: str
    direction: str
    last_step: int | None
    last_value: float | None  # the objective at last_step, as the pruner saw it


def trial_marks(s: Session, job_ids: list[str]) -> dict[str, TrialMark]:
    """The study trials among ``job_ids``' jobs, by job id (two reads: the trials, then their studies' specs)."""
    if not job_ids:
        return {}
    trials = s.execute(
        select(
            TuningTrial.job_id, TuningTrial.study_id, TuningTrial.state, TuningTrial.last_step, TuningTrial.last_value
        ).where(TuningTrial.job_id.in_(job_ids))
    ).all()
    if not trials:
        return {}
    objectives: dict[str, tuple[str, str]] = {}
    for study_id, spec in s.execute(
        select(TuningStudy.id, TuningStudy.spec).where(TuningStudy.id.in_({t.study_id for t in trials}))
    ):
        objective = (spec or {}).get("objective") or {}
        if objective.get("metric"):
            objectives[study_id] = (str(objective["metric"]), str(objective.get("direction") or "minimize"))
    marks: dict[str, TrialMark] = {}
    for job_id, study_id, state, last_step, last_value in trials:
        if job_id is None or study_id not in objectives:
            continue
        metric, direction = objectives[study_id]
        marks[job_id] = TrialMark(PRUNED if state == PRUNED else None, metric, direction, last_step, last_value)
    return marks

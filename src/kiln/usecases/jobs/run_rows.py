"""A run's rows as other use cases make and remove them: a new job's run (in the job's transaction), an
organisation's experiment by name (made on first use), and everything of a run when its job is deleted."""

from __future__ import annotations

import time
from datetime import datetime

from sqlalchemy import bindparam, delete, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kiln.db.tables import Experiment, Job, MetricChunk, MetricPoint, MetricSeries, Run, RunParam, RunTag, utcnow
from kiln.domain import tracking
from kiln.domain.ids import new_id
from kiln.domain.spec import JobSpec
from kiln.domain.tracking import ACTIVE


def millis(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp() * 1000)


# An organisation's experiment by name (built once: every submit looks one up).
_EXPERIMENT = select(Experiment.id).where(
    Experiment.org_id == bindparam("org_id"), Experiment.name == bindparam("name")
)


def experiment_id_for(s: Session, org_id: str, name: str | None) -> str:
    """The id of the organisation's experiment ``name`` (Default when None), made on first use."""
    name = name or tracking.DEFAULT_EXPERIMENT
    found = s.scalar(_EXPERIMENT, {"org_id": org_id, "name": name})
    if found is not None:
        return found
    now = utcnow()
    experiment = Experiment(id=new_id("exp"), org_id=org_id, name=name, lifecycle_stage=ACTIVE, tags={})
    experiment.created_at = experiment.updated_at = now
    try:
        with s.begin_nested():
            s.add(experiment)
            s.flush()
    except IntegrityError:  # another transaction made it first
        found = s.scalar(select(Experiment.id).where(Experiment.org_id == org_id, Experiment.name == name))
        if found is None:
            raise
        return found
    return experiment.id


def record_job_run(s: Session, job: Job, spec: JobSpec, experiment_id: str | None = None) -> None:
    """A new job's run: in its spec's experiment, with its params, its labels as tags, its code bundle's digest and
    (labels ``kiln run`` sets from a git checkout) its commit and whether the tree was dirty, in the caller's
    transaction (``experiment_id``: its experiment's, where the caller looked it up). The run's row is written by the
    caller's next flush where it has no params and no tags."""
    s.add(
        Run(
            id=job.id,
            org_id=job.org_id,
            experiment_id=experiment_id or experiment_id_for(s, job.org_id, spec.experiment),
            job_id=job.id,
            user_id=job.user_id,
            name=job.name or job.id,
            status="SCHEDULED",
            start_time=millis(job.created_at) or int(time.time() * 1000),
            lifecycle_stage=ACTIVE,
        )
    )
    params = [
        {"run_id": job.id, "key": k, "value": text, "number": tracking.param_number(text)}
        for k, v in spec.params.items()
        for text in [tracking.param_text(v)]
    ]
    tags = [{"run_id": job.id, "key": f"kiln.label.{k}", "value": v} for k, v in spec.labels.items()]
    known = {"git.commit": "mlflow.source.git.commit", "git.dirty": "kiln.source.git.dirty"}  # kiln run sets them
    tags += [{"run_id": job.id, "key": known[k], "value": v} for k, v in spec.labels.items() if k in known]
    if job.code_sha256:
        tags.append({"run_id": job.id, "key": "kiln.code_sha256", "value": job.code_sha256})
    if params or tags:
        s.flush()  # the run first, which they refer to (else the caller's one flush writes it)
    if params:
        s.execute(insert(RunParam), params)
    if tags:
        s.execute(insert(RunTag), tags)


def remove_run_rows(s: Session, run_id: str) -> None:
    """Delete a run's rows (its params, tags, metric series and the run), by name: the bulk engine's rows have
    no foreign keys to cascade on SQLite."""
    series = select(MetricSeries.id).where(MetricSeries.job_id == run_id).scalar_subquery()
    s.execute(delete(MetricPoint).where(MetricPoint.series_id.in_(series)))
    s.execute(delete(MetricChunk).where(MetricChunk.series_id.in_(series)))
    s.execute(delete(MetricSeries).where(MetricSeries.job_id == run_id))
    s.execute(delete(RunParam).where(RunParam.run_id == run_id))
    s.execute(delete(RunTag).where(RunTag.run_id == run_id))
    s.execute(delete(Run).where(Run.id == run_id))

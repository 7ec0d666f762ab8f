"""Migrations 20261205_0016 and 20261206_0017 on SQLite and PostgreSQL: every existing job becomes a run of its
organisation's Default experiment with its spec's params (and an ended job's run its end time), and metric series
are no longer tied to jobs (a run logged from outside Kiln has series and no job)."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select

from kiln.db import migrate
from kiln.db.session import Database
from kiln.db.tables import Experiment, Job, MetricSeries, Organization, Run, RunParam, User, utcnow
from kiln.domain.states import JobState


def test_existing_jobs_become_runs_and_series_belong_to_runs(database_url: str) -> None:
    db = Database(database_url)
    try:
        migrate.upgrade(db.engine, "20261204_0015")
        with db.transaction() as s:
            s.add(Organization(id="org-1", name="acme"))
            s.flush()
            s.add(User(id="usr-1", org_id="org-1", name="ann"))
            s.flush()
            ended = datetime(2026, 11, 30, 12, 0, 5, tzinfo=UTC)
            for job_id, params in (("job-a", {"lr": 0.01, "arch": "resnet", "bn": True}), ("job-b", {})):
                s.add(
                    Job(
                        id=job_id,
                        org_id="org-1",
                        user_id="usr-1",
                        name=f"train {job_id}",
                        spec={"command": "true", "params": params},
                        state=JobState.SUCCEEDED,
                        created_at=utcnow(),
                        updated_at=utcnow(),
                        finished_at=ended if job_id == "job-a" else None,  # 20261206_0017: the run's end
                    )
                )
        migrate.upgrade(db.engine)
        with db.read() as s:
            [experiment] = s.scalars(select(Experiment)).all()
            assert (experiment.org_id, experiment.name, experiment.lifecycle_stage) == ("org-1", "Default", "active")
            runs = {r.id: r for r in s.scalars(select(Run))}
            assert set(runs) == {"job-a", "job-b"}
            assert runs["job-a"].job_id == "job-a" and runs["job-a"].experiment_id == experiment.id
            assert runs["job-a"].name == "train job-a" and runs["job-a"].start_time is not None
            assert runs["job-a"].end_time == int(ended.timestamp() * 1000) and runs["job-b"].end_time is None
            params = {(p.run_id, p.key): (p.value, p.number) for p in s.scalars(select(RunParam))}
            assert params == {
                ("job-a", "lr"): ("0.01", 0.01),
                ("job-a", "arch"): ("resnet", None),
                ("job-a", "bn"): ("true", None),
            }
        with db.transaction() as s:  # a series of a run without a job: no foreign key refuses it now
            s.add(Run(id="run-x", org_id="org-1", experiment_id=experiment.id, user_id="usr-1", name="laptop"))
            s.flush()
            s.add(MetricSeries(job_id="run-x", worker="worker0", name="loss", kind="scalar", source="api"))
        with db.read() as s:
            assert s.scalar(select(MetricSeries.job_id)) == "run-x"
    finally:
        db.dispose()

"""Migrations 20261205_0016 and 20261206_0017 on SQLite and PostgreSQL: every existing job becomes a run of its
organisation's Default experiment with its spec's params (and an ended job's run its end time), and metric series
are no longer tied to jobs (a run logged from outside Kiln has series and no job)."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy import select

from kiln.db import migrate
from kiln.db.session import Database
from kiln.db.tables import Experiment, MetricSeries, Run, RunParam, utcnow
from kiln.domain.states import JobState


def _row(table: sa.Table, **values: object) -> dict[str, object]:
    """``values`` and a plain value for every other column the table requires (NOT NULL, no default)."""
    for column in table.columns:
        if column.name in values or column.nullable or column.server_default is not None:
            continue
        kind = column.type.python_type if not isinstance(column.type, sa.JSON) else dict
        values[column.name] = {bool: False, int: 0, float: 0.0, str: "", dict: {}}.get(kind, utcnow())
    return values


def test_existing_jobs_become_runs_and_series_belong_to_runs(database_url: str) -> None:
    db = Database(database_url)
    try:
        migrate.upgrade(db.engine, "20261204_0015")
        # Written as that revision had its tables (reflected): the ORM's jobs have columns added since.
        meta = sa.MetaData()
        with db.engine.begin() as conn:
            orgs, users, jobs = (sa.Table(n, meta, autoload_with=conn) for n in ("organizations", "users", "jobs"))
            conn.execute(orgs.insert().values(_row(orgs, id="org-1", name="acme")))
            conn.execute(users.insert().values(_row(users, id="usr-1", org_id="org-1", name="ann")))
            ended = datetime(2026, 11, 30, 12, 0, 5, tzinfo=UTC)
            for job_id, logged in (("job-a", {"lr": 0.01, "arch": "resnet", "bn": True}), ("job-b", {})):
                job: dict[str, object] = {
                    "id": job_id,
                    "org_id": "org-1",
                    "user_id": "usr-1",
                    "name": f"train {job_id}",
                }
                job |= {"spec": {"command": "true", "params": logged}, "state": str(JobState.SUCCEEDED)}
                job["finished_at"] = ended if job_id == "job-a" else None  # 20261206_0017: the run's end
                conn.execute(jobs.insert().values(_row(jobs, **job)))
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

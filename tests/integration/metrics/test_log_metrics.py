"""Server-side log extraction for jobs whose backend runs no shim (Kubernetes pods): the job's log in Kiln's log
store becomes points in the same spool files the ingester reads, per member and attempt, exactly once across a
server restart, and an ended job's log is read to its end before the ingester forgets the job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kiln.db import migrate
from kiln.db.session import Database
from kiln.db.tables import Job, utcnow
from kiln.domain.states import JobState
from kiln.metrics.spools import ServerSpools
from kiln.storage.logs import LogStore
from kiln.tasks.log_metrics import MARKER, LogMetrics
from kiln.tasks.metrics_ingest import MetricsIngester, MetricsStore
from tests.helpers import seed_jobs


@pytest.fixture
def world(database_url: str, tmp_path: Path) -> Any:
    db = Database(database_url)
    migrate.upgrade(db.engine)
    seed_jobs(db, "org-l", "usr-l", {})
    logs = LogStore(tmp_path / "logs")
    jobs_dir = tmp_path / "jobs"

    def job(job_id: str, metrics: dict[str, Any] | None = None, backend: str = "kubernetes") -> str:
        with db.transaction() as s:
            s.add(
                Job(
                    id=job_id,
                    org_id="org-l",
                    user_id="usr-l",
                    name=job_id,
                    spec={"command": ["x"], "metrics": metrics or {}},
                    state=JobState.RUNNING,
                    attempt=1,
                    backend=backend,
                )
            )
        return job_id

    def update(job_id: str, **values: Any) -> None:
        with db.transaction() as s:
            row = s.get(Job, job_id)
            assert row is not None
            for key, value in values.items():
                setattr(row, key, value)

    def spool(job_id: str, name: str) -> list[tuple[int | None, dict[str, Any]]]:
        path = jobs_dir / job_id / "metrics" / name
        if not path.exists():
            return []
        return [(line["s"], line["m"]) for line in map(json.loads, path.read_text().splitlines()) if "m" in line]

    class World:
        pass

    w = World()
    w.db, w.logs, w.jobs_dir, w.job, w.update, w.spool = db, logs, jobs_dir, job, update, spool  # type: ignore[attr-defined]
    w.extractor = lambda: LogMetrics(db, logs, ServerSpools(jobs_dir), ["kubernetes"])  # type: ignore[attr-defined]
    yield w
    db.dispose()


def test_members_get_their_own_points_and_other_backends_are_left_alone(world: Any) -> None:
    job = world.job("job-pod")
    local = world.job("job-local", backend="local")  # its shim extracts: the server must not do it twice
    world.logs.append(job, "O", ["step=1 loss=0.5", "nothing to see", "Epoch 2/3", "loss: 0.25 - acc: 0.5"])
    world.logs.append(job, "O@worker1", ["step=7 loss=0.7"])
    world.logs.append(job, "E@worker1", ["step=8 loss=0.8"])
    world.logs.append(job, "K", ["step=9 loss=9"])  # Kiln's own lines are no metrics
    world.logs.append(local, "O", ["step=1 loss=0.5"])
    extractor = world.extractor()
    assert extractor.run_once() > 0
    assert world.spool(job, "log-a1-worker0.jsonl") == [(1, {"loss": 0.5}), (2, {"loss": 0.25, "acc": 0.5})]
    assert world.spool(job, "log-a1-worker1.jsonl") == [(7, {"loss": 0.7}), (8, {"loss": 0.8})]
    assert not (world.jobs_dir / local).exists()


def test_a_restarted_server_goes_on_where_it_stood_without_repeating(world: Any) -> None:
    job = world.job("job-restart")
    world.logs.append(job, "O", [f"step={i} loss={i / 10}" for i in range(5)])
    with open(world.logs.path(job), "ab") as fh:  # a line still being written when the pass runs
        fh.write(world.logs.path(job).read_bytes().splitlines(keepends=True)[0][:40].replace(b"step=0", b"step=5"))
    first = world.extractor()
    first.run_once()
    first.stop()
    with open(world.logs.path(job), "ab") as fh:
        fh.write(b" loss=0.5\n")
    world.logs.append(job, "O", [f"step={i} loss={i / 10}" for i in range(6, 9)])
    second = world.extractor()
    second.run_once()
    steps = [s for s, _ in world.spool(job, "log-a1-worker0.jsonl")]
    assert steps == list(range(9))


def test_attempts_spool_apart_and_an_ended_job_is_read_to_its_end(world: Any) -> None:
    job = world.job("job-attempts", metrics={"builtin": False, "patterns": [{"regex": r"acc (?P<acc>[\d.]+)"}]})
    world.logs.append(job, "O", ["acc 0.1", "step=1 loss=1"])  # built-in recognition is off
    extractor = world.extractor()
    extractor.run_once()
    world.logs.append(job, "O", ["acc 0.15"])  # attempt 1's last line, read after the restart
    world.logs.append_system(job, "attempt 1 failed (Error); restarting")
    world.update(job, attempt=2, state=JobState.RUNNING)
    world.logs.append(job, "O", ["acc 0.2"])
    extractor.run_once()
    world.logs.append(job, "O", ["acc 0.3"])
    world.update(job, state=JobState.SUCCEEDED, finished_at=utcnow())
    ingester = MetricsIngester(world.db, MetricsStore(world.db), ServerSpools(world.jobs_dir))
    marker = world.jobs_dir / job / "metrics" / MARKER
    # The job has ended; its last line is not extracted yet: the marker, there since the extractor's first pass
    # over the job, keeps the ingester on it.
    assert marker.exists()
    ingester.ingest_now()
    assert job in ingester._draining
    extractor.run_once()
    assert not marker.exists()
    assert world.spool(job, "log-a1-worker0.jsonl") == [(None, {"acc": 0.1}), (None, {"acc": 0.15})]
    assert world.spool(job, "log-a2-worker0.jsonl") == [(None, {"acc": 0.2}), (None, {"acc": 0.3})]
    ingester.ingest_now()
    ingester.ingest_now()
    assert job not in ingester._draining
    with world.db.read() as s:
        (total,) = s.connection().exec_driver_sql(f"SELECT sum(count) FROM metric_series WHERE job_id = '{job}'").one()
    assert total == 4


def test_jobs_without_log_metrics_are_not_read(world: Any) -> None:
    job = world.job("job-off", metrics={"builtin": False})
    world.logs.append(job, "O", ["step=1 loss=0.5"])
    assert world.extractor().run_once() == 0
    assert not (world.jobs_dir / job / "metrics").exists()


def test_the_specs_include_and_exclude_choose_the_names_of_a_pods_log(world: Any) -> None:
    plain = world.job("job-names")
    chosen = world.job("job-chosen", metrics={"include": ["loss", "seed"], "exclude": ["val_*"]})
    line = "rank=1 world_size=2 seed=7 step=1 loss=0.5 val_loss=0.6 lr=0.1"
    for job in (plain, chosen):
        world.logs.append(job, "O@worker1", [line])
    world.extractor().run_once()
    assert world.spool(plain, "log-a1-worker1.jsonl") == [(1, {"loss": 0.5, "val_loss": 0.6, "lr": 0.1})]
    assert world.spool(chosen, "log-a1-worker1.jsonl") == [(1, {"seed": 7.0, "loss": 0.5})]

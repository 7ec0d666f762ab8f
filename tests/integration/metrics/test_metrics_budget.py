"""A job's metrics budget (``metrics.limits``), on SQLite and PostgreSQL: each limit enforced on what the ingester
reads from spool files and on HTTP appends, reported by one event per limit per job (also after a restart), the
job's existing series fed on past the series limit; a spool line that never ends is read once, not once a pass."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from kiln.db import migrate
from kiln.db.session import Database
from kiln.db.tables import JobEvent, MetricSeries
from kiln.domain.metric_limits import DEFAULTS, MetricLimits
from kiln.metrics.budget import LIMIT_REASON, MetricBudgets
from kiln.metrics.spools import ServerSpools
from kiln.tasks.metrics_ingest import MetricsIngester, MetricsStore, parse_lines
from tests.helpers import seed_jobs

JOBS = {
    "job-series": {"metrics": {"limits": {"series": 5}}},
    "job-drop": {"metrics": {"limits": {"points": 10}}},
    "job-sample": {"metrics": {"limits": {"points": 10, "on_limit": "sample", "sample_every": 5}}},
    "job-line": {"metrics": {"limits": {"line": 1024}}},  # as stored: bytes
    "job-spool": {"metrics": {"limits": {"spool": 3000}}},
    "job-http": {"metrics": {"limits": {"points": 7}}},
    "job-plain": {},
}


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    try:
        migrate.upgrade(database.engine)
        seed_jobs(database, "org-b", "usr-b", {job: {"spec": spec} for job, spec in JOBS.items()})
        yield database
    finally:
        database.dispose()


def _ingester(db: Database, jobs_dir: Path, **options: Any) -> MetricsIngester:
    return MetricsIngester(db, MetricsStore(db), ServerSpools(jobs_dir), **options)


def _line(step: int, metrics: dict[str, Any]) -> str:
    return json.dumps({"t": 1.7e9 + step, "s": step, "w": "worker0", "m": metrics, "src": "sdk"}) + "\n"


def _append(jobs_dir: Path, job_id: str, text: str | bytes, name: str = "worker0-sdk.jsonl") -> None:
    spool = jobs_dir / job_id / "metrics" / name
    spool.parent.mkdir(parents=True, exist_ok=True)
    with open(spool, "ab") as fh:
        fh.write(text.encode() if isinstance(text, str) else text)


def _series(db: Database, job_id: str) -> dict[str, int]:
    with db.read() as s:
        return dict(s.execute(select(MetricSeries.name, MetricSeries.count).where(MetricSeries.job_id == job_id)).all())


def _limit_events(db: Database, job_id: str) -> list[str]:
    with db.read() as s:
        return list(
            s.scalars(select(JobEvent.message).where(JobEvent.job_id == job_id, JobEvent.reason == LIMIT_REASON)).all()
        )


def test_past_the_series_limit_new_series_are_dropped_and_the_old_ones_fed(db: Database, tmp_path: Path) -> None:
    ingester = _ingester(db, tmp_path)
    _append(tmp_path, "job-series", "".join(_line(i, {f"m{k}": i for k in range(8)}) for i in range(3)))
    ingester.ingest_now()
    assert _series(db, "job-series") == {f"m{k}": 3 for k in range(5)}
    (message,) = _limit_events(db, "job-series")
    assert message == "series limit 5 reached: 5 series stored, new series dropped (metrics.limits.series)"
    # More points of old and new series, read by a restarted server (nothing of the job in memory): the old
    # series go on, the new are dropped, and the limit is not reported again.
    _append(tmp_path, "job-series", "".join(_line(i, {"m0": i, "n0": i, "n1": i}) for i in range(3, 6)))
    _ingester(db, tmp_path).ingest_now()
    assert _series(db, "job-series") == {"m0": 6, **{f"m{k}": 3 for k in range(1, 5)}}
    assert len(_limit_events(db, "job-series")) == 1
    assert _series(db, "job-plain") == {}


def test_past_the_points_limit_points_are_dropped_or_sampled(db: Database, tmp_path: Path) -> None:
    ingester = _ingester(db, tmp_path)
    for job in ("job-drop", "job-sample"):
        _append(tmp_path, job, "".join(_line(i, {"loss": i}) for i in range(30)))
    ingester.ingest_now()
    assert _series(db, "job-drop") == {"loss": 10}
    assert _limit_events(db, "job-drop") == [
        "points limit 10 reached: 10 points stored, further points dropped (metrics.limits.points)"
    ]
    # Sampled: the first 10, then every 5th of the 20 past the limit (steps 14, 19, 24, 29), and on from there.
    assert _series(db, "job-sample") == {"loss": 14}
    _append(tmp_path, "job-sample", "".join(_line(i, {"loss": i}) for i in range(30, 40)))
    ingester.ingest_now()
    assert _series(db, "job-sample") == {"loss": 16}
    with db.read() as s:
        steps = s.execute(select(MetricSeries.last_step).where(MetricSeries.job_id == "job-sample")).scalar_one()
    assert steps == 39
    (message,) = _limit_events(db, "job-sample")
    assert message == (
        "points limit 10 reached: 10 points stored, further points sampled, 1 in 5 kept (metrics.limits.points)"
    )


def test_http_appends_are_held_to_the_same_budget(db: Database) -> None:
    store = MetricsStore(db)
    lines = "".join(_line(i, {"acc": i}) for i in range(5))
    assert store.append([("job-http", parse_lines(lines), False)]) == 5
    assert store.append([("job-http", parse_lines(lines), False)]) == 2
    assert store.append([("job-http", parse_lines(lines), False)]) == 0
    assert _series(db, "job-http") == {"acc": 7}
    assert len(_limit_events(db, "job-http")) == 1
    # An id that is no job (an MLflow run's) has the operator's defaults and no events.
    small = MetricBudgets(db, defaults=MetricLimits(points=3))
    assert MetricsStore(db, small).append([("run-1", parse_lines(lines), False)]) == 3


def test_a_line_over_the_line_limit_is_skipped_and_reported(db: Database, tmp_path: Path) -> None:
    ingester = _ingester(db, tmp_path)
    long = _line(1, {"big": "x" * 5000})
    _append(tmp_path, "job-line", _line(0, {"loss": 1}) + long + _line(2, {"loss": 2}))
    ingester.ingest_now()
    assert _series(db, "job-line") == {"loss": 2}
    assert _limit_events(db, "job-line") == [
        "line limit 1024 bytes reached: a metrics spool line longer was skipped (metrics.limits.line)"
    ]
    with db.read() as s:
        spool_errors = s.scalars(
            select(JobEvent.message).where(JobEvent.job_id == "job-line", JobEvent.reason == "MetricsSpoolError")
        ).all()
    first = "a line over 1024 bytes (metrics.limits.line)"
    assert spool_errors == [f"worker0-sdk.jsonl: 1 malformed line(s) skipped (first: {first})"]


def test_a_line_that_never_ends_is_read_once_and_skipped_when_it_does(db: Database, tmp_path: Path) -> None:
    """The second attack of issue 43: megabytes without a newline. Each pass reads only the bytes that arrived
    since the last (counted by the ingester), not the line from its start again."""
    ingester = _ingester(db, tmp_path)
    _append(tmp_path, "job-plain", _line(0, {"loss": 1}))
    ingester.ingest_now()
    written = len(_line(0, {"loss": 1}))
    block = b"x" * (1024 * 1024)
    for _ in range(6):
        for _ in range(3):
            _append(tmp_path, "job-plain", block)
        written += 3 * len(block)
        for _ in range(3):  # passes with nothing new read nothing
            ingester.ingest_now()
        assert ingester.bytes_read == written
    _append(tmp_path, "job-plain", b"\n" + _line(1, {"loss": 2}).encode())
    ingester.ingest_now()
    assert _series(db, "job-plain") == {"loss": 2}
    # The line's end is found in a read that holds what follows it too: that is read again, as lines.
    tail = 1 + len(_line(1, {"loss": 2}))
    assert written + tail <= ingester.bytes_read <= written + 2 * tail
    assert len(_limit_events(db, "job-plain")) == 1


def test_past_the_spool_limit_the_jobs_files_are_no_longer_read(db: Database, tmp_path: Path) -> None:
    ingester = _ingester(db, tmp_path, max_bytes_per_file=1000)
    line = _line(0, {"loss": 1})
    _append(tmp_path, "job-spool", line * (10_000 // len(line)))
    ingester.ingest_now()
    stored = _series(db, "job-spool")["loss"]
    assert 3000 <= stored * len(line) < 3000 + 1000  # read to the limit, at most one slice past it
    (message,) = _limit_events(db, "job-spool")
    assert message.startswith("spool limit 3000 bytes reached: ") and message.endswith("(metrics.limits.spool)")
    read = ingester.bytes_read
    _append(tmp_path, "job-spool", line * 10)
    ingester.ingest_now()
    assert ingester.bytes_read == read and _series(db, "job-spool")["loss"] == stored


def test_the_defaults_are_what_the_docs_say() -> None:
    assert (DEFAULTS.series, DEFAULTS.points, DEFAULTS.line, DEFAULTS.on_limit) == (10_000, 10_000_000, 65536, "drop")


def test_a_pass_stops_between_batches_when_the_server_stops_and_the_next_resumes(db: Database, tmp_path: Path) -> None:
    """Shutdown does not wait for a backlog: the pass ends after the batch it is writing; what it read and did not
    write is read again (exactly once)."""
    ingester = _ingester(db, tmp_path)
    _append(tmp_path, "job-plain", "".join(_line(i, {"loss": i}) for i in range(20_000)))
    stopping = threading.Event()
    write = ingester.store.write

    def write_then_stop(*args: Any, **kwargs: Any) -> int:
        stopping.set()  # the server is asked to stop while the first batch is written
        return write(*args, **kwargs)

    ingester.store.write = write_then_stop  # type: ignore[method-assign]
    ingester._stopping = stopping
    ingester.ingest_now()
    first = _series(db, "job-plain")["loss"]
    assert 0 < first <= ingester.batch_points + 1000
    ingester.store.write = write  # type: ignore[method-assign]
    stopping.clear()
    ingester.ingest_now()
    assert _series(db, "job-plain") == {"loss": 20_000}

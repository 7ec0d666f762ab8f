"""Two readers of one spool never store a line twice: each cursor moves by compare-and-set, in the transaction that
stores the points read (kiln.metrics.store). Two ingesters, each with a database connection and caches of its
own (two servers on one machine), read the same spool files: one that read with a stale cursor stores nothing of
that batch and reads on from where the other left it; racing, they store every line once. And which server reads
a running job: the one holding its lease; anyone once that lease ran out."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from kiln.db import migrate
from kiln.db.session import Database
from kiln.db.tables import Job, utcnow
from kiln.metrics.spools import ServerSpools
from kiln.metrics.store import CursorMoved, CursorUpdate
from kiln.tasks.metrics_ingest import MetricsIngester, MetricsStore, parse_lines
from tests.helpers import seed_jobs

FILE = "sdk-a1-worker0.jsonl"


def _lines(steps: range) -> str:
    return "".join(
        json.dumps({"t": 1.7e9 + s, "s": s, "w": "worker0", "m": {"loss": 1 / (s + 1)}, "src": "sdk"}) + "\n"
        for s in steps
    )


def _steps(db: Database, job_id: str) -> list[int]:
    """The steps of the job's stored points, each as often as it was stored."""
    with db.read() as s:
        rows = (
            s.connection()
            .exec_driver_sql(
                "SELECT p.step FROM metric_points p JOIN metric_series m ON m.id = p.series_id "
                f"WHERE m.job_id = '{job_id}' ORDER BY p.step"
            )
            .all()
        )
    return [int(step) for (step,) in rows]


@pytest.fixture
def databases(database_url: str) -> Any:
    """Two connections to one database, as two servers have."""
    first = Database(database_url)
    migrate.upgrade(first.engine)
    second = Database(database_url)
    yield first, second
    first.dispose()
    second.dispose()


def test_a_reader_with_a_stale_cursor_stores_nothing_twice(databases: Any, tmp_path: Path) -> None:
    first, second = databases
    seed_jobs(first, "org-r", "usr-r", {"job-r": {}})
    spool = tmp_path / "job-r" / "metrics"
    spool.mkdir(parents=True)
    path = spool / FILE
    path.write_text(_lines(range(10)))
    a = MetricsIngester(first, MetricsStore(first), ServerSpools(tmp_path))
    b = MetricsIngester(second, MetricsStore(second), ServerSpools(tmp_path))
    assert b.ingest_now() == 10
    with path.open("a") as fh:
        fh.write(_lines(range(10, 20)))
    assert a.ingest_now() == 10  # a starts from the cursor b committed
    # b still has the cursor it committed itself: it reads the same ten lines, and its batch is refused whole.
    assert b.ingest_now() == 0
    assert _steps(first, "job-r") == list(range(20))
    with path.open("a") as fh:
        fh.write(_lines(range(20, 25)))
    assert b.ingest_now() == 5  # read on from where a left the cursor
    assert a.ingest_now() == 0
    assert _steps(first, "job-r") == list(range(25))


def test_a_files_first_cursor_is_made_once(databases: Any) -> None:
    """Two readers that both found no cursor for a file: the second's batch is refused, nothing of it stored."""
    first, second = databases
    seed_jobs(first, "org-f", "usr-f", {"job-f": {}})
    batch = parse_lines(_lines(range(3)).encode())
    MetricsStore(first).write([("job-f", batch, False)], [CursorUpdate("job-f", FILE, 100, 0, expected=None)])
    with pytest.raises(CursorMoved) as refused:
        MetricsStore(second).write([("job-f", batch, False)], [CursorUpdate("job-f", FILE, 100, 0, expected=None)])
    assert refused.value.moved == [("job-f", FILE)]
    with pytest.raises(CursorMoved):  # a cursor elsewhere than expected: refused too
        MetricsStore(second).write([("job-f", batch, False)], [CursorUpdate("job-f", FILE, 200, 0, expected=50)])
    MetricsStore(second).write([("job-f", batch, False)], [CursorUpdate("job-f", FILE, 200, 0, expected=100)])
    assert _steps(first, "job-f") == [0, 0, 1, 1, 2, 2]  # the two batches that found their cursor


def test_two_readers_racing_over_a_growing_spool_store_each_line_once(databases: Any, tmp_path: Path) -> None:
    first, second = databases
    seed_jobs(first, "org-x", "usr-x", {"job-x": {}})
    spool = tmp_path / "job-x" / "metrics"
    spool.mkdir(parents=True)
    total = 3000
    # Small slices and batches: many batches each, so that the two readers' batches overlap often.
    readers = [
        MetricsIngester(db, MetricsStore(db), ServerSpools(tmp_path), max_bytes_per_file=4096, batch_points=50)
        for db in (first, second)
    ]
    written = threading.Event()
    errors: list[BaseException] = []

    def read(ingester: MetricsIngester) -> None:
        try:
            while not written.is_set():
                ingester.ingest_now()
            ingester.ingest_now()  # what was written last
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(r,)) for r in readers]
    for thread in threads:
        thread.start()
    with (spool / FILE).open("a") as fh:
        for start in range(0, total, 100):
            fh.write(_lines(range(start, start + 100)))
            fh.flush()
    written.set()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert _steps(first, "job-x") == list(range(total))


def test_a_running_job_is_read_by_the_holder_of_its_lease(database_url: str, tmp_path: Path) -> None:
    """Held by another live server: left to it. Its lease ran out (that server died): read by this one."""
    db = Database(database_url)
    try:
        migrate.upgrade(db.engine)
        later = utcnow() + timedelta(minutes=5)
        jobs = {
            "job-mine": {"lease_owner": "me", "lease_expires_at": later},
            "job-theirs": {"lease_owner": "them", "lease_expires_at": later},
            "job-orphan": {"lease_owner": "dead", "lease_expires_at": utcnow() - timedelta(seconds=1)},
        }
        seed_jobs(db, "org-o", "usr-o", jobs)
        for job_id in jobs:
            (tmp_path / job_id / "metrics").mkdir(parents=True)
            (tmp_path / job_id / "metrics" / FILE).write_text(_lines(range(4)))
        me = MetricsIngester(db, MetricsStore(db), ServerSpools(tmp_path), owner="me")
        assert me.ingest_now() == 8
        assert [_steps(db, job_id) for job_id in jobs] == [list(range(4)), [], list(range(4))]
        with db.transaction() as s:  # the other server died too: its lease runs out
            row = s.get(Job, "job-theirs")
            assert row is not None
            row.lease_expires_at = utcnow() - timedelta(seconds=1)
        assert me.ingest_now() == 4
        assert _steps(db, "job-theirs") == list(range(4))
    finally:
        db.dispose()


def test_the_local_backend_finds_a_jobs_spool_in_the_home_of_the_server_that_launched_it(tmp_path: Path) -> None:
    """The attempt's handle names that home (another server's on this machine, for a job adopted from it)."""
    from kiln.backends.capabilities import MetricSpools
    from kiln.backends.local.executor import LocalBackend
    from kiln.backends.local.runtimes import RuntimeManager
    from kiln.domain.catalog import DEFAULT_CATALOG
    from kiln.settings import Settings
    from kiln.storage.logs import LogStore
    from kiln.storage.store import ObjectStore

    home = tmp_path / "b"
    settings = Settings(home=home, instance_id="server-b", cpus=0.5)
    backend = LocalBackend(
        settings, ObjectStore(str(home / "store")), LogStore(home / "logs"), RuntimeManager(DEFAULT_CATALOG, home)
    )
    try:
        assert isinstance(backend, MetricSpools)
        theirs = tmp_path / "a" / "jobs" / "job-s"
        handle = {"job_id": "job-s", "attempt": 1, "dir": str(theirs / "attempts" / "1")}
        assert backend.metric_spool("job-s", handle) == theirs / "metrics"
        assert backend.metric_spool("job-s", None) == settings.jobs_dir / "job-s" / "metrics"  # none launched yet
        (theirs / "metrics").mkdir(parents=True)
        (theirs / "metrics" / FILE).write_text(_lines(range(2)))
        backend.remove_metric_spool("job-s", handle)
        backend.remove_metric_spool("job-s", handle)  # idempotent
        assert not (theirs / "metrics").exists()
    finally:
        backend.close()

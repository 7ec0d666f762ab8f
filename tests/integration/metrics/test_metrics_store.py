"""The metrics store end to end, on SQLite and PostgreSQL: spool files written by hand into a real job's metrics
directory on a real server, read back through the SDK; the HTTP path with job tokens; the migration."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import inspect

from kiln.db import migrate
from kiln.db.session import Database
from kiln.errors import NotFound
from kiln.sdk.client import Client
from tests.helpers import seed_jobs
from tests.tenancy_helpers import job_spec

SLEEPER = [sys.executable, "-c", "import time; time.sleep(300)"]


def _wait(predicate: Any, timeout: float = 60, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _running(client: Client, command: Any = None) -> str:
    job = client.submit(job_spec(command or SLEEPER))
    _wait(lambda: client.get_job(job.id).state == "RUNNING", 30, "RUNNING")
    return job.id


def _spool(home: Path, job_id: str, name: str) -> Path:
    directory = home / "jobs" / job_id / "metrics"
    directory.mkdir(parents=True, exist_ok=True)
    return directory / name


def _line(step: int | None, metrics: dict[str, Any], t: float | None = None, worker: str = "worker0") -> str:
    t = 1.7e9 + (step or 0) if t is None else t
    return json.dumps({"t": t, "s": step, "w": worker, "m": metrics, "src": "sdk"}) + "\n"


def _count(client: Client, job_id: str, name: str) -> int:
    return sum(s.count for s in client.metrics_summary(job_id) if s.name == name)


def test_spool_files_are_ingested_queried_and_downsampled(make_server, database_url: str) -> None:  # type: ignore[no-untyped-def]
    server = make_server(database_url=database_url)
    client = server.client()
    job_id = _running(client)
    spool = _spool(server.home, job_id, "worker0-sdk.jsonl")
    lines = [_line(i, {"loss": 1.0 / (i + 1) + (9.0 if i == 1234 else 0.0), "acc": i / 2000}) for i in range(2000)]
    lines.append(_line(2000, {"phase": "eval", "loss": "nan"}))
    spool.write_text("".join(lines) + _line(2001, {"loss": 0.25})[:-10])  # a partial last line
    bad = _spool(server.home, job_id, "worker0-log.jsonl")
    bad.write_text("oops\n{]\n" + _line(1, {"": 1}) + _line(5, {"from_log": 5.0}))

    # Both files: an ingestion pass may look at the directory between the two writes (seen in make test).
    _wait(
        lambda: _count(client, job_id, "loss") == 2001 and _count(client, job_id, "from_log") == 1,
        what="2001 loss points and the log file's one good line",
    )
    (loss,) = client.metrics(job_id, names=["loss"])
    assert loss.kind == "scalar" and loss.axis == "step" and loss.count == 2001
    assert loss.points[0] == [0, 1.7e9, 1.0]
    assert loss.points[-1][0] == 2000 and loss.points[-1][2] == "nan"  # non-finite: a string, never NaN in JSON
    (phase,) = client.metrics(job_id, names=["phase"])
    assert phase.kind == "text" and phase.points == [[2000, 1.7e9 + 2000, "eval"]]
    assert [s.count for s in client.metrics(job_id, names=["from_log"])] == [1]

    # The partial line is read once its newline has arrived.
    with open(spool, "a") as fh:
        fh.write(_line(2001, {"loss": 0.25})[-10:])
    _wait(lambda: _count(client, job_id, "loss") == 2002, what="the completed line")

    # Malformed lines: skipped, counted, ONE event for the file.
    errors = [e for e in client.events(job_id) if e.reason == "MetricsSpoolError"]
    assert len(errors) == 1 and "worker0-log.jsonl: 3 malformed line(s)" in errors[0].message, errors
    with open(bad, "a") as fh:
        fh.write("more garbage\n" + _line(6, {"from_log": 6.0}))
    _wait(lambda: _count(client, job_id, "from_log") == 2, what="the next good line")
    assert len([e for e in client.events(job_id) if e.reason == "MetricsSpoolError"]) == 1

    # Downsampling keeps the shape: first, last, the spike and the minimum; never more points than asked.
    (small,) = client.metrics(job_id, names=["acc"], downsample=100)
    assert len(small.points) <= 100 and small.count == 2000
    assert small.points[0][0] == 0 and small.points[-1][0] == 1999
    (spiky,) = client.metrics(job_id, names=["loss"], downsample=50, step_min=1000, step_max=1999)
    steps = [p[0] for p in spiky.points]
    assert len(steps) <= 50 and steps[0] == 1000 and steps[-1] == 1999 and 1234 in steps
    assert spiky.count == 1000

    # Summary, CSV.
    summary = {s.name: s for s in client.metrics_summary(job_id)}
    assert summary["acc"].count == 2000 and summary["acc"].last_step == 1999 and summary["acc"].max == 1999 / 2000
    assert summary["phase"].last_value == "eval" and summary["loss"].last_value == 0.25
    csv = client.export_metrics_csv(job_id, names=["acc"]).splitlines()
    assert csv[0] == "job_id,worker,name,step,time,value" and len(csv) == 2001
    assert csv[1].startswith(f"{job_id},worker0,acc,0,")

    # Compare: two jobs; one the caller cannot see (here: does not exist) fails the whole request.
    other = _running(client)
    _spool(server.home, other, "worker0-sdk.jsonl").write_text("".join(_line(i, {"acc": i / 10}) for i in range(10)))
    _wait(lambda: _count(client, other, "acc") == 10, what="the second job's points")
    both = client.compare_metrics([job_id, other], names=["acc"], downsample=20)
    assert [len(both[job_id][0].points) <= 20, both[other][0].count] == [True, 10]
    with pytest.raises(NotFound):
        client.compare_metrics([job_id, "job-doesnotexist"], names=["acc"])
    csv = client.export_metrics_csv([job_id, other], names=["acc"]).splitlines()
    assert len(csv) == 1 + 2000 + 10
    for job in (job_id, other):
        client.cancel(job)


def test_exactly_once_across_a_server_crash(make_server, database_url: str) -> None:  # type: ignore[no-untyped-def]
    server = make_server(database_url=database_url)
    client = server.client()
    job_id = _running(client)
    n = 150_000
    spool = _spool(server.home, job_id, "worker0-sdk.jsonl")
    spool.write_text("".join(_line(i, {"x": float(i)}) for i in range(n)))
    _wait(lambda: 0 < _count(client, job_id, "x") < n, 60, "ingestion under way")
    server.kill()  # mid-ingestion, no shutdown hooks
    server.start()
    client = server.client()
    _wait(lambda: _count(client, job_id, "x") == n, 120, f"{n} points after the restart")
    time.sleep(1.5)  # a few more passes: nothing is ingested twice
    (x,) = client.metrics(job_id, names=["x"], downsample=1000)
    assert x.count == n and _count(client, job_id, "x") == n
    (window,) = client.metrics(job_id, names=["x"], step_min=70_000, step_max=70_999)
    assert [p[0] for p in window.points] == list(range(70_000, 71_000))
    assert [p[2] for p in window.points] == [float(i) for i in range(70_000, 71_000)]
    server.stop()
    server.start()  # and the metrics are still there after a clean restart
    assert _count(server.client(), job_id, "x") == n
    server.client().cancel(job_id)


POSTER = """
import json, os, sys, time, httpx
url = os.environ["KILN_ENDPOINT"] + "/api/v1/jobs/{job}/metrics"
lines = "".join(json.dumps({"t": time.time(), "s": i, "m": {"posted": i * 1.0}}) + "\\n" for i in range(50))
lines += json.dumps({"t": time.time(), "event": "Hello", "message": "from the job"}) + "\\n"
headers = {"Authorization": "Bearer " + os.environ["KILN_JOB_TOKEN"], "Content-Type": "application/x-ndjson"}
mine = httpx.post(url.format(job=os.environ["KILN_JOB_ID"]), content=lines, headers=headers)
other = httpx.post(url.format(job=sys.argv[1]), content=lines, headers=headers)
print("mine", mine.status_code, mine.text, "other", other.status_code, flush=True)
"""


def test_http_ingestion_with_job_tokens(make_server, database_url: str) -> None:  # type: ignore[no-untyped-def]
    server = make_server(database_url=database_url)
    client = server.client()
    victim = _running(client)
    poster = client.submit(job_spec([sys.executable, "-c", POSTER, victim]))
    assert client.wait(poster.id, timeout=60).state == "SUCCEEDED"
    log = b"".join(client.read_logs(poster.id)[0].splitlines(keepends=True)).decode()
    assert "mine 200" in log and '"points":50' in log and "other 404" in log, log
    (posted,) = client.metrics(poster.id, names=["posted"])
    assert posted.count == 50 and posted.points[-1][2] == 49.0
    assert any(e.reason == "Hello" and e.message == "from the job" for e in client.events(poster.id))
    assert client.metrics(victim, names=["posted"]) == []
    # No credentials at all: 401. A member may send too (signed); a body over 8 MiB: 413.
    url = f"{server.url}/api/v1/jobs/{victim}/metrics"
    assert httpx.post(url, content=b'{"t": 1, "m": {"a": 1}}\n').status_code == 401
    assert client.send_metrics(victim, _line(1, {"imported": 1.0})).points == 1
    with pytest.raises(Exception) as too_big:
        client.send_metrics(victim, b"x" * (8 * 1024 * 1024 + 1))
    assert getattr(too_big.value, "status", None) == 413 or "413" in str(too_big.value) or "over" in str(too_big.value)
    client.cancel(victim)


def test_migration_upgrades_from_empty_and_from_0003(database_url: str) -> None:
    db = Database(database_url)
    try:
        migrate.upgrade(db.engine, "20261130_0003")
        assert "metric_points" not in inspect(db.engine).get_table_names()
        migrate.upgrade(db.engine)
        tables = set(inspect(db.engine).get_table_names())
        assert {"metric_series", "metric_points", "metric_chunks", "metric_cursors"} <= tables
        assert migrate.is_up_to_date(db.engine)
        indexes = {i["name"] for i in inspect(db.engine).get_indexes("metric_points")}
        assert "ix_metric_points_series_step" in indexes
    finally:
        db.dispose()


def _brute_force_chunks(points: list[tuple[Any, ...]], axis: str) -> dict[int, list[Any]]:
    """M4 per chunk by a scan over one series' points in seq order, the way the store defines it: first by x (the
    earliest of equal ones), last by x (the latest), lowest and highest value (the earliest of equal ones)."""
    chunks: dict[int, list[Any]] = {}
    for seq, step, t, v, _text in points:
        x = step if axis == "step" else t
        if v is None or x is None:
            continue
        p = (float(x), t, v)
        agg = chunks.get(seq // 128)
        if agg is None:
            chunks[seq // 128] = [1, p, p, p, p]
            continue
        agg[0] += 1
        agg[1] = p if p[0] < agg[1][0] else agg[1]
        agg[2] = p if p[0] >= agg[2][0] else agg[2]
        agg[3] = p if p[2] < agg[3][2] else agg[3]
        agg[4] = p if p[2] > agg[4][2] else agg[4]
    return chunks


def test_series_totals_and_chunk_summaries_equal_a_brute_force_scan(database_url: str) -> None:
    """Random batches (ties in x and in value, text and non-finite values, points without a step in a step
    series, batches that end mid-chunk, two files of one job in one transaction) through MetricsStore.write:
    every chunk summary and every series' totals are what a point-by-point scan of the stored points gives."""
    import random

    from kiln.tasks.metrics_ingest import MetricsStore, parse_lines

    db = Database(database_url)
    try:
        migrate.upgrade(db.engine)
        seed_jobs(db, "org-p", "usr-p", {"job-p": {}})
        store = MetricsStore(db)
        rnd = random.Random(7)
        step = 0
        for _batch in range(12):
            parts = []
            for _file in range(rnd.randint(1, 2)):
                lines = []
                for _ in range(rnd.randint(1, 400)):
                    step += rnd.choice([0, 1, 1, 1, -3])  # repeated and decreasing steps: ties and disorder in x
                    metrics: dict[str, Any] = {
                        "loss": rnd.choice([0.5, 0.25, 1.0, rnd.random()]),  # ties in value
                        "acc": rnd.choice([rnd.random(), rnd.random(), "nan", float("inf"), "eval"]),
                        f"m{rnd.randint(0, 3)}": rnd.randint(-2, 2),
                    }
                    s_ = None if rnd.random() < 0.1 else step  # a step series with some points without a step
                    t = 1.7e9 + rnd.choice([step, step, step + 0.5])
                    lines.append(_line(s_, metrics, t=t, worker=rnd.choice(["worker0", "worker1"])))
                    lines.append(json.dumps({"t": t, "m": {"clock": rnd.random()}, "w": "worker0"}) + "\n")
                parts.append(("job-p", parse_lines("".join(lines)), False))
            store.write(parts)
        with db.read() as s:
            conn = s.connection()
            series = conn.exec_driver_sql(
                "SELECT id, name, axis, count, first_step, last_step, last_time, last_value, last_text, min_value, "
                "max_value FROM metric_series WHERE job_id = 'job-p'"
            ).all()
            assert len(series) >= 8
            for sid, name, axis, count, first_step, last_step, last_time, last_value, last_text, low, high in series:
                points = conn.exec_driver_sql(
                    f"SELECT seq, step, time, value, text FROM metric_points WHERE series_id = {sid} ORDER BY seq"
                ).all()
                assert [p[0] for p in points] == list(range(count)), name
                finite = [p[3] for p in points if p[3] is not None]
                steps = [p[1] for p in points if p[1] is not None]
                assert (low, high) == ((min(finite), max(finite)) if finite else (None, None)), name
                assert (first_step, last_step) == ((steps[0], steps[-1]) if steps else (None, None)), name
                assert (last_time, last_value, last_text) == tuple(points[-1][2:]), name
                want = _brute_force_chunks([tuple(p) for p in points], axis)
                got = {
                    r[0]: [r[1], *(tuple(r[2 + 3 * k : 5 + 3 * k]) for k in range(4))]
                    for r in conn.exec_driver_sql(
                        "SELECT chunk, count, first_x, first_t, first_v, last_x, last_t, last_v, min_x, min_t, "
                        f"min_v, max_x, max_t, max_v FROM metric_chunks WHERE series_id = {sid}"
                    )
                }
                assert got == want, name
    finally:
        db.dispose()


def test_a_draining_marker_keeps_an_ended_job_read(database_url: str, tmp_path: Path) -> None:
    """A shim still extracting a flooded log after its exit record leaves ``draining-*``: the ingester goes on
    reading the ended job's spool files until the marker goes, and only then forgets the job."""
    from kiln.db.tables import utcnow
    from kiln.domain.states import JobState
    from kiln.metrics.spools import ServerSpools
    from kiln.tasks.metrics_ingest import MetricsIngester, MetricsStore

    db = Database(database_url)
    try:
        migrate.upgrade(db.engine)
        ended = {"state": JobState.SUCCEEDED, "finished_at": utcnow()}
        seed_jobs(db, "org-d", "usr-d", {"job-marked": ended, "job-plain": ended})
        ingester = MetricsIngester(db, MetricsStore(db), ServerSpools(tmp_path))
        files = {}
        for job_id in ("job-marked", "job-plain"):
            (tmp_path / job_id / "metrics").mkdir(parents=True)
            files[job_id] = tmp_path / job_id / "metrics" / "log-a1-worker0.jsonl"
            files[job_id].write_text("".join(_line(i, {"x": float(i)}) for i in range(10)))
        marker = tmp_path / "job-marked" / "metrics" / "draining-a1-worker0"
        marker.write_text("123")
        assert ingester.ingest_now() == 20
        for job_id in ("job-marked", "job-plain"):  # the drain goes on after the exit record
            with files[job_id].open("a") as fh:
                fh.write("".join(_line(i, {"x": float(i)}) for i in range(10, 15)))
        assert ingester.ingest_now() == 5  # only the marked job is still read
        marker.unlink()
        assert ingester.ingest_now() == 0
        assert "job-marked" not in ingester._draining
        with db.read() as s:
            counts = dict(
                s.connection()
                .exec_driver_sql(
                    "SELECT job_id, sum(count) FROM metric_series WHERE job_id LIKE 'job-%%' GROUP BY job_id"
                )
                .all()
            )
        assert counts == {"job-marked": 15, "job-plain": 10}
    finally:
        db.dispose()


def test_only_the_bulk_writer_skips_foreign_key_checks_and_only_on_sqlite(database_url: str) -> None:
    """Metrics ingestion writes through ``bulk_transaction``: on SQLite without per-row foreign key checks (the
    writer guarantees its references), everywhere else exactly like ``transaction``."""
    from sqlalchemy.exc import IntegrityError

    db = Database(database_url)
    try:
        migrate.upgrade(db.engine)
        orphan = "INSERT INTO metric_points (series_id, seq, step, time) VALUES (999999, 1, 1, 1.0)"
        with pytest.raises(IntegrityError), db.transaction() as s:
            s.connection().exec_driver_sql(orphan)
        if db.engine.dialect.name == "sqlite":
            with db.bulk_transaction() as s:
                s.connection().exec_driver_sql(orphan)
            with db.transaction() as s:  # the ordinary connections still check
                s.connection().exec_driver_sql("DELETE FROM metric_points WHERE series_id = 999999")
        else:
            with pytest.raises(IntegrityError), db.bulk_transaction() as s:
                s.connection().exec_driver_sql(orphan)
    finally:
        db.dispose()


def test_appends_that_wait_for_the_writer_are_committed_together(database_url: str) -> None:
    """``MetricsStore.append`` (the HTTP routes): callers that arrive while another batch is written wait, and
    are then written in one transaction; each gets its own count back, every point is stored once with its
    series' seq in order, and a failure of that transaction is raised to every caller of the group."""
    import threading

    from kiln.tasks.metrics_ingest import MetricsStore, parse_lines

    db = Database(database_url)
    try:
        migrate.upgrade(db.engine)
        seed_jobs(db, "org-g", "usr-g", {"job-g1": {}, "job-g2": {}})
        store = MetricsStore(db)
        transactions = 0
        bulk = db.bulk_transaction

        def counted() -> Any:
            nonlocal transactions
            transactions += 1
            return bulk()

        db.bulk_transaction = counted  # type: ignore[method-assign]
        results: dict[int, Any] = {}

        def caller(n: int) -> None:
            job = "job-g1" if n % 2 else "job-g2"
            lines = "".join(_line(100 * n + i, {"loss": float(n), f"only{n}": 1.0}) for i in range(n + 1))
            try:
                results[n] = store.append([(job, parse_lines(lines), False)])
            except Exception as exc:  # the test looks at it
                results[n] = exc

        store._lock.acquire()  # a writer is busy: the callers queue up behind it
        threads = [threading.Thread(target=caller, args=(n,)) for n in range(1, 9)]
        for t in threads:
            t.start()
        _wait(lambda: len(store._queue) == 8, 10, "eight queued callers")
        store._lock.release()
        for t in threads:
            t.join(10)
        assert results == {n: 2 * (n + 1) for n in range(1, 9)}  # each caller's own points
        assert transactions == 1  # one group, one transaction
        with db.read() as s:
            rows = (
                s.connection()
                .exec_driver_sql(
                    "SELECT s.job_id, s.name, s.count, count(p.seq), min(p.seq), max(p.seq) FROM metric_series s "
                    "JOIN metric_points p ON p.series_id = s.id WHERE s.job_id LIKE 'job-g%%' "
                    "GROUP BY s.job_id, s.name, s.count"
                )
                .all()
            )
        by_name = {(job, name): (count, n, low, high) for job, name, count, n, low, high in rows}
        odd, even = [n for n in range(1, 9) if n % 2], [n for n in range(1, 9) if not n % 2]
        assert by_name[("job-g1", "loss")] == (sum(n + 1 for n in odd),) * 2 + (0, sum(n + 1 for n in odd) - 1)
        assert by_name[("job-g2", "loss")] == (sum(n + 1 for n in even),) * 2 + (0, sum(n + 1 for n in even) - 1)
        assert by_name[("job-g1", "only3")] == (4, 4, 0, 3)

        # The group's transaction fails (the database, forced here): every caller of the group gets the error.
        def failing() -> Any:
            raise RuntimeError("database gone")

        db.bulk_transaction = failing  # type: ignore[method-assign]
        results.clear()
        store._lock.acquire()
        threads = [threading.Thread(target=caller, args=(n,)) for n in (1, 2, 3)]
        for t in threads:
            t.start()
        _wait(lambda: len(store._queue) == 3, 10, "three queued callers")
        store._lock.release()
        for t in threads:
            t.join(10)
        assert all(isinstance(results[n], RuntimeError) for n in (1, 2, 3)), results
        assert store._queue == []
    finally:
        db.dispose()

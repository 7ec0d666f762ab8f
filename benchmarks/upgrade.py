"""Upgrade time of a big home from the previous release to head (issue 44): what the server runs at its start.

A home at the schema of a release (tests/upgrade/releases.toml: ``--from`` 4fe6d21, the previous release, at
20261211_0022 by default; ``--from 8fc4612`` crosses 20261205_0016's metric_series rebuild) is filled with
``--jobs`` jobs (their events, runs and run params where the release has them) and ``--points`` metric points in
series of uneven length with their M4 chunk summaries, written straight into the tables as the release's
migrations made them (reflected from the database, every NOT NULL column filled). Then ``kiln.db.migrate.upgrade``
to head is timed, on SQLite and on PostgreSQL (when it answers at $KILN_TEST_PG_URL), with the steps the server
logs meanwhile (the copy kept before migrating, each revision, the reference check).

Baselines, measured in the same run on the same database, scale with the data: SQLite, ``VACUUM INTO`` a new
file (every row read and written once); PostgreSQL, a full scan of metric_points (``count(*)``, ``sum(value)``).
The target is absolute: the upgrade under 60 s. On SQLite it also times ``kiln server``'s start to /readyz on a
copy of the old home (migrating it), and a second start of the same home (already migrated).

Generating the SQLite home takes minutes at the full size: it is built once per (release, jobs, points) and kept
under .cache/upgrade-bench/ (each run migrates a copy). PostgreSQL's is built in each run (points and chunks made
by the server itself from generate_series, the other rows sent with COPY)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shutil
import sqlite3
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.report import finish, parse_args, print_table

from kiln.db import migrate
from kiln.db.session import Database

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN = os.environ.get("KILN_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
CACHE = REPO / ".cache" / "upgrade-bench"
GENERATOR = 1  # bump when the home made here changes: the cached SQLite files are named after it
METRIC_JOB_EVERY = 5  # one job in five logs metrics (the others: data preparation, evaluation, notebooks' jobs)
SERIES = ("loss", "val_loss", "accuracy", "lr", "grad_norm")  # per job that logs metrics
CHUNK = 128  # points per M4 chunk summary (kiln.metrics.summaries.CHUNK)
ORGS, USERS_PER_ORG = 10, 5
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
STATES = ["SUCCEEDED"] * 16 + ["FAILED"] * 3 + ["CANCELLED"]  # every job has ended: a server start adopts none
TARGET_S = 60.0


def release_revision(commit: str) -> str:
    with open(REPO / "tests" / "upgrade" / "releases.toml", "rb") as f:
        for release in tomllib.load(f)["release"]:
            if str(release["commit"]).startswith(commit) or commit.startswith(str(release["commit"])):
                return str(release["migration"])
    raise SystemExit(f"--from {commit}: not a release in tests/upgrade/releases.toml")


# -- the home ---------------------------------------------------------------------------------------------------


def _filler(table: sa.Table) -> dict[str, Any]:
    """A plain value for every column of ``table`` that needs one (NOT NULL, no server default, no autoincrement)."""
    out: dict[str, Any] = {}
    for column in table.columns:
        if column.nullable or column.server_default is not None:
            continue
        if column.primary_key and isinstance(column.type, sa.Integer) and len(table.primary_key.columns) == 1:
            continue
        kind = dict if isinstance(column.type, sa.JSON) else column.type.python_type
        out[column.name] = {bool: False, int: 0, float: 0.0, str: "", dict: {}}.get(kind, EPOCH)
    return out


def load(conn: sa.Connection, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    """``rows`` into ``table``, the columns they leave out that need a value filled: PostgreSQL through COPY,
    SQLite through one executemany."""
    if not rows:
        return
    base = _filler(table)
    full = [{**base, **row} for row in rows]
    names = list(full[0])
    if conn.dialect.name != "postgresql":
        conn.execute(table.insert(), full)
        return
    raw = conn.connection.driver_connection
    assert raw is not None
    columns = ", ".join(f'"{n}"' for n in names)
    with raw.cursor() as cur, cur.copy(f'COPY "{table.name}" ({columns}) FROM STDIN') as copy:
        for row in full:
            copy.write_row([json.dumps(v) if isinstance(v, dict | list) else v for v in (row[n] for n in names)])


def series_lengths(series: int, points: int) -> list[int]:
    """``points`` spread over ``series`` unevenly (a quarter to 1.75 times the mean), in total exactly ``points``."""
    weights = [0.25 + 1.5 * ((i * 7919) % 1000) / 999 for i in range(series)]
    total = sum(weights)
    lengths = [int(points * w / total) for w in weights]
    for i in range(points - sum(lengths)):
        lengths[i % series] += 1
    return lengths


TIME = "(1767225600.0 + s.id * 60 + ({n}) * 2.0)"  # a point every 2 s from the series' start
VALUE = "(1.0 / (1 + ({n}) * 0.01))"  # a falling loss: max at a chunk's first point, min at its last


def fill(url: str, revision: str, jobs: int, points: int) -> dict[str, int]:
    """A database at ``revision`` holding ``jobs`` jobs and ``points`` metric points (see the module's text)."""
    db = Database(url)
    try:
        migrate.upgrade(db.engine, revision)
        meta = sa.MetaData()
        meta.reflect(db.engine)
        t = meta.tables
        pg = db.engine.dialect.name == "postgresql"
        with db.engine.begin() as conn:
            if pg:  # no per-row foreign key triggers while loading (the rows are made consistent)
                conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
            else:
                conn.exec_driver_sql("PRAGMA defer_foreign_keys = ON")
            return _fill_rows(conn, t, jobs, points, pg)
    finally:
        db.dispose()


def _fill_rows(conn: sa.Connection, t: Any, jobs: int, points: int, pg: bool) -> dict[str, int]:
    orgs = [{"id": f"org-{o:04d}", "name": f"org{o}", "created_at": EPOCH} for o in range(ORGS)]
    users = [
        {
            "id": f"usr-{o:04d}{u}",
            "org_id": f"org-{o:04d}",
            "name": f"user{o}-{u}",
            "role": "member",
            "created_at": EPOCH,
        }
        for o in range(ORGS)
        for u in range(USERS_PER_ORG)
    ]
    load(conn, t["organizations"], orgs)
    load(conn, t["users"], users)
    job_rows, events, runs, params = [], [], [], []
    has_runs = "runs" in t
    for i in range(jobs):
        org, created = i % ORGS, EPOCH + timedelta(seconds=300 * i)
        user = f"usr-{org:04d}{(i // ORGS) % USERS_PER_ORG}"
        state, ended = STATES[i % len(STATES)], created + timedelta(seconds=60 + i % 3600)
        lr, epochs = 10 ** -(1 + i % 4), 1 + i % 20
        spec = {
            "name": f"train-{i}",
            "command": ["python", "train.py", "--lr", str(lr), "--epochs", str(epochs)],
            "resources": {"cpus": 1 + i % 4, "memory": "4Gi", "gpus": 0},
            "env": {"SEED": str(i)},
            "params": {"lr": lr, "epochs": epochs},
        }
        jid = f"job-{i:012d}"
        job_rows.append(
            {
                **{"id": jid, "org_id": f"org-{org:04d}", "user_id": user, "name": f"train-{i}", "spec": spec},
                **{"state": state, "attempt": 1, "exit_code": 0 if state == "SUCCEEDED" else 1, "backend": "local"},
                **{"cpus": float(1 + i % 4), "created_at": created, "updated_at": ended, "started_at": created},
                **{"running_at": created + timedelta(seconds=2), "finished_at": ended},
            }
        )
        for k, (a, b) in enumerate(
            [(None, "QUEUED"), ("QUEUED", "STARTING"), ("STARTING", "RUNNING"), ("RUNNING", state)]
        ):
            at = created + timedelta(seconds=k)
            events.append({"job_id": jid, "time": at, "from_state": a, "to_state": b, "reason": b, "message": ""})
        if has_runs:
            ms = int(created.timestamp() * 1000)
            runs.append(
                {
                    **{"id": jid, "org_id": f"org-{org:04d}", "experiment_id": f"exp-{org:04d}", "job_id": jid},
                    **{"user_id": user, "name": f"train-{i}", "status": "FINISHED", "start_time": ms},
                    **{"end_time": ms + 60_000, "lifecycle_stage": "active", "created_at": created},
                }
            )
            params += [
                {"run_id": jid, "key": "lr", "value": str(lr), "number": lr},
                {"run_id": jid, "key": "epochs", "value": str(epochs), "number": float(epochs)},
            ]
    load(conn, t["jobs"], job_rows)
    load(conn, t["job_events"], [{"id": n + 1, **e} for n, e in enumerate(events)])
    if has_runs:
        experiments = [
            {"id": f"exp-{o:04d}", "org_id": f"org-{o:04d}", "name": "Default", "lifecycle_stage": "active"}
            for o in range(ORGS)
        ]
        load(conn, t["experiments"], [{**e, "tags": {}, "created_at": EPOCH, "updated_at": EPOCH} for e in experiments])
        load(conn, t["runs"], runs)
        load(conn, t["run_params"], params)
    metric_jobs = [r for n, r in enumerate(job_rows) if n % METRIC_JOB_EVERY == 0]
    lengths = series_lengths(len(metric_jobs) * len(SERIES), points)
    series = []
    for n, length in enumerate(lengths):
        job, sid = metric_jobs[n // len(SERIES)], n + 1
        last_t, last_v = 1767225600.0 + sid * 60 + (length - 1) * 2.0, 1.0 / (1 + (length - 1) * 0.01)
        series.append(
            {
                **{"id": sid, "job_id": job["id"], "worker": "worker0", "name": SERIES[n % len(SERIES)]},
                **{"kind": "scalar", "source": "sdk", "axis": "step", "count": length, "first_step": 0},
                **{"last_step": length - 1, "last_time": last_t, "last_value": last_v, "min_value": last_v},
                **{"max_value": 1.0, "created_at": job["created_at"]},
            }
        )
    load(conn, t["metric_series"], series)
    cursors = [
        {"job_id": j["id"], "file": "metrics.jsonl", "offset": 4096, "errors": 0, "reported": False}
        for j in metric_jobs
    ]
    load(conn, t["metric_cursors"], [{**c, "updated_at": EPOCH} for c in cursors])
    _points_and_chunks(conn, max(lengths), pg)
    if pg:  # sequences of the tables given explicit ids, as the server's own inserts would have moved them
        for table in ("job_events", "metric_series"):
            conn.exec_driver_sql(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))"
            )
    return {"jobs": len(job_rows), "job_events": len(events), "metric_series": len(series), "metric_points": points}


def _points_and_chunks(conn: sa.Connection, longest: int, pg: bool) -> None:
    """Every series' points and chunk summaries, made by the database itself (10M rows: Python would take minutes)."""
    if pg:
        numbers = "generate_series(0, s.count - 1) AS g(n)"
        chunk_numbers = f"generate_series(0, (s.count - 1) / {CHUNK}) AS g(n)"
        least = "LEAST"
    else:
        conn.exec_driver_sql("CREATE TEMP TABLE bench_numbers (n INTEGER PRIMARY KEY)")
        conn.exec_driver_sql(
            "INSERT INTO bench_numbers WITH RECURSIVE c(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM c WHERE n < ?) "
            "SELECT n FROM c",
            (longest,),
        )
        numbers = "bench_numbers AS g ON g.n < s.count"
        chunk_numbers = f"bench_numbers AS g ON g.n * {CHUNK} < s.count"
        least = "min"
    join = "JOIN LATERAL" if pg else "CROSS JOIN"  # SQLite: series the outer loop, rows in key order
    conn.exec_driver_sql(
        "INSERT INTO metric_points (series_id, seq, step, time, value) "
        f"SELECT s.id, g.n, g.n, {TIME.format(n='g.n')}, {VALUE.format(n='g.n')} "
        f"FROM metric_series AS s {join} {numbers}" + (" ON true" if pg else "")
    )
    first, last = f"g.n * {CHUNK}", f"({least}(s.count, (g.n + 1) * {CHUNK}) - 1)"
    cols = [f"{first}", TIME.format(n=first), VALUE.format(n=first)]
    ends = [f"{last}", TIME.format(n=last), VALUE.format(n=last)]
    conn.exec_driver_sql(
        "INSERT INTO metric_chunks (series_id, chunk, count, first_x, first_t, first_v, last_x, last_t, last_v, "
        "min_x, min_t, min_v, max_x, max_t, max_v) "
        f"SELECT s.id, g.n, {last} - {first} + 1, {', '.join(cols)}, {', '.join(ends)}, {', '.join(ends)}, "
        f"{', '.join(cols)} FROM metric_series AS s {join} {chunk_numbers}" + (" ON true" if pg else "")
    )
    if not pg:
        conn.exec_driver_sql("DROP TABLE bench_numbers")


def cached_sqlite(revision: str, jobs: int, points: int) -> tuple[Path, float | None]:
    """The SQLite home's database for these sizes, built once (its build time; None when it was cached)."""
    path = CACHE / f"g{GENERATOR}-{revision}-{jobs}j-{points}p.db"
    if path.is_file():
        return path, None
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    for stale in CACHE.glob(path.name + ".partial*"):
        stale.unlink()
    started = time.perf_counter()
    fill(f"sqlite:///{partial}", revision, jobs, points)
    with sqlite3.connect(partial) as conn:  # one file, no -wal beside it: copied as it is
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("PRAGMA journal_mode=DELETE")
    os.replace(partial, path)
    for left in CACHE.glob(partial.name + "*"):  # the lock file kiln.db.session keeps beside a database
        left.unlink()
    return path, time.perf_counter() - started


# -- measuring --------------------------------------------------------------------------------------------------


class Steps(logging.Handler):
    """What kiln.db.migrate logs while it runs, kept with the time since the upgrade began."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.started = time.perf_counter()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"  {time.perf_counter() - self.started:7.2f} s  {record.getMessage()}")


@contextmanager
def steps() -> Iterator[Steps]:
    handler = Steps()
    logger = logging.getLogger("kiln.db")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def timed_upgrade(url: str, name: str) -> tuple[float, list[str]]:
    db = Database(url)
    try:
        with steps() as seen:
            started = time.perf_counter()
            migrate.upgrade(db.engine)
            took = time.perf_counter() - started
        assert migrate.is_up_to_date(db.engine)
    finally:
        db.dispose()
    print(f"{name}: upgraded to head in {took:.2f} s; the migration's log:")
    print("\n".join(seen.lines))
    return took, seen.lines


def count_points(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.exec_driver_sql("SELECT count(*) FROM metric_points").scalar() or 0)
    finally:
        engine.dispose()


def row(
    metric: str, value: float, baseline: float | None, target: str = "< 60 s", check: bool = True
) -> dict[str, Any]:
    return {
        "metric": metric,
        "value": value,
        "baseline": baseline or 0,
        "ratio": value / baseline if baseline else None,
        "target": target if check else "-",
        "pass": value < TARGET_S if check else None,
        "unit": "s",
    }


def measure_sqlite(
    args: argparse.Namespace, revision: str, root: Path, results: dict[str, Any]
) -> list[dict[str, Any]]:
    cached, built = cached_sqlite(revision, args.jobs, args.points)
    rows = [
        row(
            f"sqlite: build the home ({'now' if built else 'cached'}, {cached.stat().st_size >> 20} MiB)",
            built or 0,
            None,
            check=False,
        )
    ]
    home = root / "sqlite-home"
    home.mkdir()
    database = home / "kiln.db"
    shutil.copyfile(cached, database)
    started = time.perf_counter()
    with sqlite3.connect(database) as conn:
        conn.execute(f"VACUUM INTO '{root / 'vacuum.db'}'")
    vacuum = time.perf_counter() - started
    (root / "vacuum.db").unlink()
    took, lines = timed_upgrade(f"sqlite:///{database}", "sqlite")
    kept = count_points(f"sqlite:///{database}")
    results["sqlite"] = {"upgrade_s": took, "vacuum_into_s": vacuum, "log": lines, "points_after": kept}
    assert kept == args.points, f"sqlite: {kept} metric points after the upgrade, {args.points} before"
    rows.append(row(f"sqlite: migrate.upgrade {revision} -> head", took, vacuum))
    if not args.no_server:
        rows += server_starts(cached, root, results)
    return rows


def server_starts(cached: Path, root: Path, results: dict[str, Any]) -> list[dict[str, Any]]:
    """``kiln server`` to /readyz on a copy of the old home (it migrates first), then again on the migrated home."""
    from tests.kilnserver import KilnServer

    home = root / "server-home"
    home.mkdir()
    shutil.copyfile(cached, home / "kiln.db")
    times = []
    for _ in range(2):
        server = KilnServer(home)
        started = time.perf_counter()
        try:
            server.start(timeout=600)
            times.append(time.perf_counter() - started)
        finally:
            server.stop()
        if len(times) == 1:  # what the server said of its migration, in its own log
            said = [line for line in server.log().splitlines() if "kiln.db.migrate" in line or "migrat" in line]
            print("kiln server's log of its migration:\n" + "\n".join(f"  {line}" for line in said))
    results["server_start_s"] = times
    return [
        row("sqlite: kiln server start to /readyz, migrating", times[0], None),
        row("sqlite: kiln server start to /readyz, migrated", times[1], None, check=False),
    ]


def measure_postgresql(args: argparse.Namespace, revision: str, results: dict[str, Any]) -> list[dict[str, Any]]:
    try:
        import psycopg

        admin = psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3)
    except Exception as exc:  # PostgreSQL is optional here: say why its rows are missing
        return [row(f"postgresql: not measured ({type(exc).__name__})", 0, None, check=False)]
    name = f"kiln_bench_upgrade_{secrets.token_hex(4)}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = f"{PG_ADMIN.rsplit('/', 1)[0].replace('postgresql://', 'postgresql+psycopg://', 1)}/{name}"
        started = time.perf_counter()
        fill(url, revision, args.jobs, args.points)
        built = time.perf_counter() - started
        engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql("VACUUM ANALYZE")  # as autovacuum would have by now on a home this old
                started = time.perf_counter()
                conn.exec_driver_sql("SELECT count(*), sum(value) FROM metric_points").one()
                scan = time.perf_counter() - started
                size = int(conn.exec_driver_sql("SELECT pg_database_size(current_database())").scalar() or 0)
        finally:
            engine.dispose()
        took, lines = timed_upgrade(url, "postgresql")
        kept = count_points(url)
        results["postgresql"] = {
            "build_s": built,
            "upgrade_s": took,
            "scan_s": scan,
            "log": lines,
            "points_after": kept,
        }
        assert kept == args.points, f"postgresql: {kept} metric points after the upgrade, {args.points} before"
        return [
            row(f"postgresql: build the home (now, {size >> 20} MiB)", built, None, check=False),
            row(f"postgresql: migrate.upgrade {revision} -> head", took, scan),
        ]
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="release", default="4fe6d21", help="the release upgraded from (default 4fe6d21)")
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs in the home (default 100,000)")
    parser.add_argument("--points", type=int, default=10_000_000, help="metric points in it (default 10,000,000)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["sqlite", "postgresql"])
    parser.add_argument("--no-server", action="store_true", help="do not time kiln server's start (SQLite)")
    parser.add_argument("--json", type=Path, default=None)
    args = parse_args(parser, {"jobs": 1000, "points": 10_000, "skip": ["postgresql"]})
    revision = release_revision(args.release)
    started = time.monotonic()
    results: dict[str, Any] = {"from": args.release, "revision": revision, "jobs": args.jobs, "points": args.points}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kiln-bench-upgrade-") as tmp:
        if "sqlite" not in args.skip:
            rows += measure_sqlite(args, revision, Path(tmp), results)
        if "postgresql" not in args.skip:
            rows += measure_postgresql(args, revision, results)
    print_table(rows, metric_width=60)
    finish(results, rows, started, args.json)


if __name__ == "__main__":
    main()

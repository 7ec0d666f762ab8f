"""Usage reports over a million metered attempts, and what metering costs a submit.

    .venv/bin/python benchmarks/usage.py [--rows 1000000] [--jobs 30] [--skip report-sqlite report-pg metering]

1. report (SQLite, then PostgreSQL on 127.0.0.1:5432 where it answers): ``--rows`` usage records seeded (5
   organisations, 200 users, 30 days, holds of 1 to 120 minutes, a tenth with GPUs, a price change mid-window)
   and settled into usage_hours as the leased task ``usage`` does, then a real ``kiln server`` on that database
   answers ``GET /api/v1/usage?by=user`` (the platform admin, every organisation; what ``kiln usage --by user``
   asks) and by day split by user (the console's chart). Baseline in the same run: the plainest full scan of the
   same rows (``SELECT count(*), sum(cpus * (end_ts - start_ts))``).
   Target: by user answers in ≤ 1 s on both databases. ``kiln usage --by user`` as a process is shown too (its
   Python start-up included).
2. metering: two servers side by side, one with KILN_METERING=0; ``--jobs`` jobs each submitted once the previous
   one is RUNNING, alternating between them; submit → RUNNING p50 with metering on over off. Target ≤ 1.02.

The machine is shared and noisy: figures are ratios against baselines of the same run; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from report import finish, parse_args, pct, print_table  # noqa: E402
from sqlalchemy import create_engine, func, select  # noqa: E402
from submit_latency import spec, wait_running  # noqa: E402
from tests.kilnserver import KilnServer  # noqa: E402

from kiln.db import migrate  # noqa: E402
from kiln.db.session import Database  # noqa: E402
from kiln.db.tables import Organization, Price, UsageRecord, User, utcnow  # noqa: E402
from kiln.usecases.usage.usage import UsageService  # noqa: E402

PG_ADMIN = os.environ.get("KILN_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
DAY = 86400.0


def seed(url: str, rows: int) -> float:
    """``rows`` usage records over the last 30 days in a fresh database at ``url``; seconds it took."""
    started = time.monotonic()
    db = Database(url)
    try:
        migrate.upgrade(db.engine)
        rng = random.Random(7)
        now = time.time()
        orgs = [f"org-bench{i:02d}" for i in range(5)]
        users = [(f"usr-bench{i:03d}", orgs[i % len(orgs)]) for i in range(200)]
        with db.transaction() as s:
            for org in orgs:
                s.add(Organization(id=org, name=org.removeprefix("org-")))
            s.flush()
            for user_id, org in users:
                s.add(User(id=user_id, org_id=org, name=user_id.removeprefix("usr-"), role="admin"))
            s.flush()
            for at, cpu in ((now - 40 * DAY, 0.05), (now - 12 * DAY, 0.08)):
                s.add(Price(effective_ts=at, resource="cpu", rate=cpu, created_by=users[0][0]))
                s.add(Price(effective_ts=at, resource="gpu", gpu_type="*", rate=3.0, created_by=users[0][0]))
                s.add(Price(effective_ts=at, resource="memory_gib", rate=0.01, created_by=users[0][0]))
        batch: list[dict[str, Any]] = []
        for i in range(rows):
            user_id, org = users[rng.randrange(len(users))]
            start = now - rng.random() * 30 * DAY
            gpus = 1 if rng.random() < 0.1 else 0
            batch.append(
                {
                    "org_id": org,
                    "user_id": user_id,
                    "job_id": f"job-bench{i:09d}",
                    "attempt": 1,
                    "category": "train",
                    "cpus": float(rng.choice((1, 2, 4, 8))),
                    "memory": rng.choice((2, 8, 32)) * 1024**3,
                    "gpus": gpus,
                    "gpu_type": "H200" if gpus else "",
                    "start_ts": start,
                    "end_ts": min(now, start + rng.uniform(60, 7200)) if i % 1000 else None,
                    "used_cpu_seconds": rng.uniform(0, 3600),
                    "peak_memory": rng.randrange(1, 8) * 1024**3,
                }
            )
            if len(batch) == 20_000:
                with db.bulk_transaction() as s:
                    s.execute(UsageRecord.__table__.insert(), batch)
                batch = []
        if batch:
            with db.bulk_transaction() as s:
                s.execute(UsageRecord.__table__.insert(), batch)
        # What the leased task `usage` does as holds settle: add them into usage_hours (here all at once).
        rolled_from = time.monotonic()
        usage = UsageService(db)
        while True:
            with db.transaction() as s:
                if not usage.roll(s, batch=50_000):
                    break
        print(f"  settled holds added into usage_hours in {time.monotonic() - rolled_from:.1f} s", flush=True)
        if db.dialect == "postgresql":
            with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql("VACUUM ANALYZE usage_records")
                conn.exec_driver_sql("VACUUM ANALYZE usage_hours")
        else:
            with db.engine.begin() as conn:
                conn.exec_driver_sql("ANALYZE")
    finally:
        db.dispose()
    return time.monotonic() - started


def baseline_scan(url: str, repeat: int) -> list[float]:
    db = Database(url)
    times = []
    try:
        for _ in range(repeat):
            t0 = time.perf_counter()
            with db.read() as s:
                u = UsageRecord
                s.execute(select(func.count(), func.sum(u.cpus * (u.end_ts - u.start_ts)))).one()
            times.append(time.perf_counter() - t0)
    finally:
        db.dispose()
    return times


def timed(call: Any, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return times


def measure_reports(name: str, url: str, rows: int, repeat: int, results: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory(prefix="kiln-bench-usage-") as tmp:
        server = KilnServer(Path(tmp) / "home", database_url=url).start()  # its first start makes the admin
        server.stop()  # not running while the holds are added (its task `usage` would add them too)
        try:
            print(f"\n{name}: seeding {rows:,} usage records ...", flush=True)
            print(f"  seeded in {seed(url, rows):.1f} s", flush=True)
            server.start()
            base = baseline_scan(url, repeat)
            client = server.client()
            report = client.usage(by="user")
            assert len(report.rows) == 200, f"{len(report.rows)} users in the report"
            by_user = timed(lambda: client.usage(by="user"), repeat)
            by_day = timed(lambda: client.usage(by="day", split="user"), max(1, repeat // 2))
            env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
            env.update(server.credentials())
            env.update(KILN_CONFIG=str(Path(tmp) / "cfg"), KILN_ENDPOINT=server.url)
            argv = [sys.executable, "-m", "kiln", "usage", "--by", "user", "-o", "json"]

            def cli() -> None:
                subprocess.run(argv, env=env, check=True, capture_output=True, timeout=120)

            by_cli = timed(cli, max(1, repeat // 2))
        finally:
            server.stop()
    figures = {
        "baseline": statistics.median(base),
        "by_user": statistics.median(by_user),
        "by_day_user": statistics.median(by_day),
        "cli": statistics.median(by_cli),
        "rows": rows,
    }
    results[name] = figures
    print(
        f"  full scan {figures['baseline'] * 1000:.0f} ms; by user {figures['by_user'] * 1000:.0f} ms "
        f"(p90 {pct(by_user, 90) * 1000:.0f}); by day x user {figures['by_day_user'] * 1000:.0f} ms; "
        f"`kiln usage --by user` {figures['cli'] * 1000:.0f} ms"
    )


def fresh_pg_url() -> str | None:
    admin = create_engine(PG_ADMIN.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("DROP DATABASE IF EXISTS kiln_bench_usage")
            conn.exec_driver_sql("CREATE DATABASE kiln_bench_usage")
    except Exception as exc:
        print(f"PostgreSQL not reachable at {PG_ADMIN}: {exc}", file=sys.stderr)
        return None
    finally:
        admin.dispose()
    return PG_ADMIN.replace("postgresql://", "postgresql+psycopg://", 1).rsplit("/", 1)[0] + "/kiln_bench_usage"


def measure_metering(jobs: int, results: dict[str, Any]) -> None:
    print(f"\nmetering: {jobs} jobs on each of two servers (metering on, off), alternating", flush=True)
    latencies: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="kiln-bench-metering-") as tmp:
        servers = {
            "on": KilnServer(Path(tmp) / "on", cpus="64", reconcile_interval="0.5"),
            "off": KilnServer(Path(tmp) / "off", cpus="64", reconcile_interval="0.5", metering="false"),
        }
        try:
            clients = {name: server.start().client() for name, server in servers.items()}
            for client in clients.values():
                wait_running(client, client.submit(spec(1)).id)  # warm-up
            for i in range(jobs * 2):
                name = ("on", "off")[i % 2] if (i // 2) % 2 == 0 else ("off", "on")[i % 2]
                client = clients[name]
                t0 = time.time()
                job = client.submit(spec(2))
                if wait_running(client, job.id) == "RUNNING":
                    running = next(e.time for e in client.events(job.id) if e.to_state == "RUNNING")
                    latencies[name].append(running.timestamp() - t0)
                client.cancel(job.id)
        finally:
            for server in servers.values():
                server.stop()
    if not latencies["on"] or not latencies["off"]:  # a machine too loaded for any job to reach RUNNING in time
        print("  metering: no job reached RUNNING on one of the servers; no figure", file=sys.stderr)
        return
    on, off = statistics.median(latencies["on"]), statistics.median(latencies["off"])
    results["metering"] = {"on_p50": on, "off_p50": off, "n": len(latencies["on"])}
    print(f"  submit → RUNNING p50: on {on * 1000:.1f} ms, off {off * 1000:.1f} ms ({on / off:.3f}x)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="usage records to seed")
    parser.add_argument("--repeat", type=int, default=6, help="timed reports of each kind")
    parser.add_argument("--jobs", type=int, default=30, help="jobs per server for the metering comparison")
    parser.add_argument("--skip", nargs="*", default=[], choices=["report-sqlite", "report-pg", "metering"])
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parse_args(parser, {"rows": 2_000, "repeat": 2, "jobs": 2})
    started = time.monotonic()
    results: dict[str, Any] = {"created": utcnow().isoformat()}
    with tempfile.TemporaryDirectory(prefix="kiln-bench-usage-db-") as tmp:
        if "report-sqlite" not in args.skip:
            measure_reports("sqlite", f"sqlite:///{tmp}/usage.db", args.rows, args.repeat, results)
    if "report-pg" not in args.skip:
        url = fresh_pg_url()
        if url is not None:
            measure_reports("postgresql", url, args.rows, args.repeat, results)
    if "metering" not in args.skip:
        measure_metering(args.jobs, results)

    rows = []
    for name in ("sqlite", "postgresql"):
        if name in results:
            r = results[name]
            rows.append(
                {
                    "metric": f"usage by user, {r['rows']:,} attempts ({name})",
                    "value": r["by_user"],
                    "baseline": r["baseline"],
                    "ratio": r["by_user"] / r["baseline"],
                    "target": "≤ 1 s",
                    "pass": r["by_user"] <= 1.0,
                    "unit": "ms",
                }
            )
            rows.append(
                {
                    "metric": f"usage by day x user ({name})",
                    "value": r["by_day_user"],
                    "baseline": r["baseline"],
                    "ratio": r["by_day_user"] / r["baseline"],
                    "target": "(info)",
                    "pass": None,
                    "unit": "ms",
                }
            )
    if "metering" in results:
        m = results["metering"]
        rows.append(
            {
                "metric": "submit→RUNNING p50, metering on / off",
                "value": m["on_p50"],
                "baseline": m["off_p50"],
                "ratio": m["on_p50"] / m["off_p50"],
                "target": "≤ 1.02x",
                "pass": m["on_p50"] / m["off_p50"] <= 1.02,
                "unit": "ms",
            }
        )
    print_table(rows)
    finish(results, rows, started, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

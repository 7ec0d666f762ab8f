"""Metrics store: ingestion throughput and the downsampled query of a long series.

``ingest``      spool files of 4 jobs (8 workers x 10 metrics per line, steps in order) written up front, then
                ``MetricsIngester.ingest_now()`` on SQLite (a temp dir) or PostgreSQL (``--postgres URL``):
                points/s = points stored / wall time of the pass (parse + insert + chunk summaries + cursors).
``downsample``  one series of 1,000,000 points (ingested the same way), queried with downsample=1000 through
                ``MetricsService.query``: the wall time of the query, and that first/last/min/max survived.

    .venv/bin/python benchmarks/metrics_store.py [--points 1000000] [--postgres URL] [--json PATH]

Nothing is asserted: the figures are printed (first/last/min/max kept is checked and shown PASS/FAIL).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "benchmarks"))

from report import finish, fresh_database, parse_args, print_table  # noqa: E402
from tests.helpers import seed_jobs  # noqa: E402

from kiln.db import migrate  # noqa: E402
from kiln.db.session import Database  # noqa: E402
from kiln.db.tables import Job  # noqa: E402
from kiln.metrics.spools import ServerSpools  # noqa: E402
from kiln.tasks.metrics_ingest import MetricsIngester, MetricsStore  # noqa: E402
from kiln.usecases.access.identity import Principal  # noqa: E402
from kiln.usecases.tracking.metrics import MetricsService, SeriesQuery  # noqa: E402


def setup(url: str, jobs: list[str]) -> Database:
    db = Database(url)
    migrate.upgrade(db.engine)
    seed_jobs(db, "org-b", "usr-b", {job_id: {} for job_id in jobs})
    return db


def write_spool(jobs_dir: Path, job_id: str, lines: list[str], name: str = "worker0-sdk.jsonl") -> None:
    d = jobs_dir / job_id / "metrics"
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text("".join(lines))


def ingest(url: str, home: Path, steps: int) -> dict[str, float]:
    jobs = [f"job-b{i}" for i in range(4)]
    db = setup(url, jobs)
    total = 0
    for job_id in jobs:
        for w in range(8):
            lines = [
                json.dumps({"t": 1.7e9 + s, "s": s, "w": f"worker{w}", "m": {f"m{k}": s * 0.1 + k for k in range(10)}})
                + "\n"
                for s in range(steps)
            ]
            write_spool(home, job_id, lines, f"worker{w}-sdk.jsonl")
            total += steps * 10
    ingester = MetricsIngester(db, MetricsStore(db), ServerSpools(home))
    started = time.perf_counter()
    stored = ingester.ingest_now()
    elapsed = time.perf_counter() - started
    db.dispose()
    assert stored == total, (stored, total)
    return {"points": stored, "seconds": round(elapsed, 3), "points_per_s": round(stored / elapsed)}


def downsample(url: str, home: Path, n: int) -> dict[str, object]:
    db = setup(url, ["job-long"])
    spike = n * 7 // 9  # one outlier (777,777 of 1,000,000) that a downsample must keep
    lines = [
        json.dumps({"t": 1.7e9 + i * 0.01, "s": i, "m": {"loss": math.sin(i / 20000) + (5.0 if i == spike else 0)}})
        + "\n"
        for i in range(n)
    ]
    write_spool(home, "job-long", lines)
    store = MetricsStore(db)
    t0 = time.perf_counter()
    MetricsIngester(db, store, ServerSpools(home)).ingest_now()
    ingest_s = time.perf_counter() - t0
    service = MetricsService(db, _Jobs(), store)  # type: ignore[arg-type]
    admin = Principal(
        user_id="usr-b", user_name="b", org_id="org-b", org_name="bench", key_id="k", role="admin", platform_admin=True
    )
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        (series,) = service.query(admin, "job-long", SeriesQuery(names=["loss"], downsample=1000))
        times.append(time.perf_counter() - t0)
    values = [p[2] for p in series.points]
    steps = [p[0] for p in series.points]
    db.dispose()
    return {
        "points": n,
        "ingest_points_per_s": round(n / ingest_s),
        "query_seconds_best": round(min(times), 3),
        "query_seconds": [round(t, 3) for t in times],
        "returned": len(series.points),
        "first_last_kept": steps[0] == 0 and steps[-1] == n - 1,
        "spike_kept": spike in steps and max(values) > 5.0,
    }


class _Jobs:
    """JobService.load stand-in for a platform admin (tenancy is not what is measured here)."""

    def load(self, s, principal, job_id, **_):  # type: ignore[no-untyped-def]
        return s.get(Job, job_id)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=2500, help="lines per worker file in the ingest benchmark")
    parser.add_argument("--postgres", default=None)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parse_args(parser, {"points": 10_000, "steps": 50})
    started = time.monotonic()
    database = "PostgreSQL" if args.postgres else "SQLite"
    with tempfile.TemporaryDirectory() as tmp, fresh_database(args.postgres, Path(tmp) / "ingest.db") as url:
        ingested = ingest(url, Path(tmp) / "jobs-a", args.steps)
        print("ingest", ingested, flush=True)
    with tempfile.TemporaryDirectory() as tmp, fresh_database(args.postgres, Path(tmp) / "long.db") as url:
        queried = downsample(url, Path(tmp) / "jobs-b", args.points)
        print("downsample", queried, flush=True)
    kept = bool(queried["first_last_kept"] and queried["spike_kept"])
    series = f"ingest, one {args.points:,}-point series"
    rows = [
        _row(f"ingest, 4 jobs x 8 workers, {database}", ingested["points_per_s"], "info", None, "points/s"),
        _row(series, queried["ingest_points_per_s"], "info", None, "points/s"),
        _row("downsample=1000 query, best of 3", queried["query_seconds_best"], "info", None, "s"),
        _row("first, last and the spike kept", queried["returned"], "all kept", kept, "points"),
    ]
    print_table(rows, metric_width=48, digits={"points/s": 0, "s": 3, "points": 0})
    finish({"ingest": ingested, "downsample": queried, "database": database}, rows, started, args.json)


def _row(metric: str, value: object, target: str, ok: bool | None, unit: str) -> dict[str, object]:
    return {
        "metric": metric,
        "value": value,
        "baseline": None,
        "ratio": None,
        "target": target,
        "pass": ok,
        "unit": unit,
    }


if __name__ == "__main__":
    main()

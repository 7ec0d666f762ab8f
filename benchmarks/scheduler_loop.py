"""Sections of scheduler_decisions.py that need a database or a server.

``loop``     the whole scheduling pass of the reconcile loop (``Reconciler._schedule``) against a real database
             (SQLite in a temp dir, and PostgreSQL when ``--postgres URL`` is given): read 10,000 queued jobs
             from 100 organisations, the running allocations, quotas and weights; decide; write every waiting
             job's reason (the first pass writes them all, later passes only what changed); start the few that
             fit. The backend here is a recording stand-in that starts nothing (the number measured is the
             scheduler's, not process starts; those are benchmarks/submit_latency.py's). decisions/s = queued
             jobs / pass time. Baseline, same run and database: reading the same 10,000 rows alone (the
             cheapest possible pass).
``handoff``  a real ``kiln server`` with 1 CPU and a chain of 1-CPU jobs (``sleep 0.3``): the time from one job's
             exit (the shim's exit record) to the next queued job's command running (its shim's running_at),
             beside starting a bare ``python -c pass`` in the same run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable


def _row(metric: str, value: float, baseline: float | None, target: str, ok: bool | None, unit: str) -> dict:
    return {
        "metric": metric,
        "value": value,
        "baseline": baseline,
        "ratio": value / baseline if baseline else None,
        "target": target,
        "pass": ok,
        "unit": unit,
    }


class RecordingBackend:
    """Starts nothing: records what the loop asked to start. Only for timing the scheduling pass."""

    name = "local"

    def __init__(self, cpus: float, gpus: int) -> None:
        from kiln.backends.base import Inventory

        self._inv = Inventory(cpus=cpus, memory=1024**4, gpus=tuple(range(gpus)), name="bench")
        self.started: list[str] = []

    def inventory(self) -> Any:
        return self._inv

    def nodes(self) -> list[Any]:
        return [self._inv]

    def handle_for(self, job_id: str, attempt: int) -> dict[str, Any]:
        return {"job_id": job_id, "attempt": attempt}

    def start(self, launch: Any) -> dict[str, Any]:
        self.started.append(launch.job_id)
        return self.handle_for(launch.job_id, launch.attempt)


def _fill(db: Any, n_jobs: int, n_orgs: int, seed: int) -> None:
    """n_jobs QUEUED jobs from n_orgs organisations (one user each), a third of them with quotas."""
    from kiln.db.tables import Job, Organization, Quota, User

    rng = random.Random(seed)
    now = datetime.now(UTC) - timedelta(hours=1)
    with db.transaction() as s:
        conn = s.connection()
        conn.execute(
            Organization.__table__.insert(),  # type: ignore[attr-defined]
            [{"id": f"org-{i:05d}", "name": f"org{i}", "created_at": now} for i in range(n_orgs)],
        )
        conn.execute(
            User.__table__.insert(),  # type: ignore[attr-defined]
            [
                {
                    "id": f"usr-{i:05d}",
                    "org_id": f"org-{i:05d}",
                    "name": f"user{i}",
                    "role": "member",
                    "created_at": now,
                }
                for i in range(n_orgs)
            ],
        )
        conn.execute(
            Quota.__table__.insert(),  # type: ignore[attr-defined]
            [
                {"org_id": f"org-{i:05d}", "category": "train", "gpus": 4, "count": 10, "updated_at": now}
                for i in range(0, n_orgs, 3)
            ],
        )
        rows = []
        for i in range(n_jobs):
            org = rng.randrange(n_orgs)
            gpus = rng.choice((0, 0, 0, 1, 2))
            workers = 2 if rng.random() < 0.05 else 1
            spec = {
                "command": "true",
                "resources": {"cpus": 1.0, "memory": None, "gpus": gpus, "gpu_type": None},
                "priority": rng.choice(("low", "normal", "normal", "high")),
                "node_selector": {},
                "timeout": None,
            }
            rows.append(
                {
                    "id": f"job-{i:016d}",
                    "org_id": f"org-{org:05d}",
                    "user_id": f"usr-{org:05d}",
                    "name": "bench",
                    "spec": spec,
                    "state": "QUEUED",
                    "reason": "Submitted",
                    "message": "",
                    "cpus": 1.0 * workers,
                    "gpus": gpus * workers,
                    "workers": workers,
                    "priority": {"low": 0, "normal": 1, "high": 2}[spec["priority"]],
                    "category": "train",
                    "backend": "local",
                    "created_at": now + timedelta(milliseconds=i),
                    "updated_at": now,
                }
            )
        conn.execute(Job.__table__.insert(), rows)  # type: ignore[attr-defined]


def _one_database(url: str | None, label: str, args: argparse.Namespace, rows: list[dict[str, Any]]) -> dict[str, Any]:
    from sqlalchemy import select

    from kiln.db import migrate
    from kiln.db.session import Database
    from kiln.db.tables import Job
    from kiln.scheduler.loop import Reconciler
    from kiln.settings import Settings
    from kiln.storage.logs import LogStore

    with tempfile.TemporaryDirectory(prefix="kiln-bench-loop-") as tmp:
        home = Path(tmp)
        settings = Settings(home=home, database_url=url, bootstrap=False)
        db = Database(settings.resolved_database_url)
        migrate.upgrade(db.engine)
        try:
            _fill(db, args.jobs, args.orgs, args.seed)
            backend = RecordingBackend(cpus=32, gpus=8)
            loop = Reconciler(db, backend, LogStore(home / "logs"), settings)  # type: ignore[arg-type]
            passes = []
            for _ in range(max(3, args.reps)):
                t0 = time.perf_counter()
                while loop._schedule():  # a pass starts at most 50 ms worth; the loop goes again at once
                    pass
                passes.append(time.perf_counter() - t0)
            read = []
            for _ in range(max(3, args.reps)):
                t0 = time.perf_counter()
                with db.read() as s:
                    list(s.scalars(select(Job).where(Job.state == "QUEUED")))
                read.append(time.perf_counter() - t0)
        finally:
            db.engine.dispose()
    first, steady = passes[0], statistics.median(passes[1:])
    base = statistics.median(read)
    out = {
        "first_pass_s": first,
        "steady_pass_s": steady,
        "read_only_s": base,
        "started": len(backend.started),
        "passes_s": passes,
    }
    print(
        f"{label:10s} first pass {first * 1000:8.1f} ms (writes every reason), steady pass {steady * 1000:8.1f} ms, "
        f"reading the rows alone {base * 1000:7.1f} ms; {len(backend.started)} started"
    )
    n = args.jobs
    rows.append(_row(f"loop pass jobs/s, {label}, first", n / first, n / base, "≥ 1,000/s", n / first >= 1000, "/s"))
    rows.append(_row(f"loop pass jobs/s, {label}, steady", n / steady, n / base, "≥ 1,000/s", n / steady >= 1000, "/s"))
    return out


def section_loop(args: argparse.Namespace, results: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    out = {"sqlite": _one_database(None, "sqlite", args, rows)}
    if args.postgres:
        out["postgresql"] = _one_database(_fresh_pg(args.postgres), "postgresql", args, rows)
    results["loop"] = out


def _fresh_pg(base_url: str) -> str:
    """A new, empty database next to ``base_url``'s (dropped at exit)."""
    import atexit

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    url = make_url(base_url)
    name = f"kiln_bench_{int(time.time())}"
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    atexit.register(drop)
    return url.set(database=name).render_as_string(hide_password=False)


def section_handoff(args: argparse.Namespace, results: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    sys.path.insert(0, str(REPO))
    from tests.kilnserver import KilnServer

    n = args.handoffs
    bare = []
    for i in range(n + 3):
        t0 = time.perf_counter()
        subprocess.run([PY, "-c", "pass"], check=True)
        if i >= 3:
            bare.append(time.perf_counter() - t0)
    with tempfile.TemporaryDirectory(prefix="kiln-bench-handoff-") as tmp:
        server = KilnServer(Path(tmp) / "home", cpus="1", reconcile_interval="0.5").start()
        try:
            client = server.client()
            spec = {"command": ["sleep", "0.3"], "runtime": {"python": PY}, "resources": {"cpus": 1}}
            ids = [client.submit(spec).id for _ in range(n + 1)]
            for job_id in ids:
                client.wait(job_id, timeout=120)
            gaps = []
            for before, after in itertools.pairwise(ids):
                exited = json.loads((server.home / "jobs" / before / "attempts" / "1" / "exit.json").read_text())
                status = json.loads((server.home / "jobs" / after / "attempts" / "1" / "status.json").read_text())
                gaps.append(float(status["running_at"]) - float(exited["finished_at"]))
        finally:
            server.stop()
    p50, base = statistics.median(gaps), statistics.median(bare)
    print(
        f"handoff    exit → next RUNNING: p50 {p50 * 1000:.1f} ms, max {max(gaps) * 1000:.1f} ms over {len(gaps)} "
        f"handoffs; bare `python -c pass` p50 {base * 1000:.1f} ms"
    )
    results["handoff"] = {"gaps_s": gaps, "bare_s": bare}
    rows.append(_row("exit → next job RUNNING, p50", p50, base, "(info)", None, "ms"))

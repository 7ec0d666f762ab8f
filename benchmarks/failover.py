"""Several Kiln servers on one PostgreSQL (issue 27): how soon a job's scheduling moves to another server when the
server holding it is killed, and API throughput with 1, 2 and 3 servers.

    .venv/bin/python benchmarks/failover.py [--servers 3] [--kills 20] [--lease-seconds 5] [--json PATH]

Every server is a real ``kiln server`` (``tests.kilnserver.KilnServer``) with its own ``KILN_HOME``, one new
PostgreSQL database (dropped at exit), one store (``KILN_STORAGE_URL``), one ``KILN_SERVER_KEY`` and its own
``KILN_INSTANCE_ID`` (``bench-0``, ``bench-1``, ...: the owner its leases are recorded under).

Sections (``--skip`` any):

``throughput``  a signed ``GET /api/v1/jobs?limit=20`` (the load generator of ``api_throughput.py``: keep-alive
                connections, closed loop, pre-signed requests) with the same C connections spread round robin over
                1, 2, ... N servers; servers are started one more at a time. Baseline: the 1-server figure of the
                same run. On a 2-CPU machine more servers cannot add CPU: the load generator, PostgreSQL and the
                servers share the same two, so this shows what sharing costs rather than how it scales.

``failover``    There is no single scheduling leader in Kiln: each open job is leased by one server
                (``jobs.lease_owner`` / ``lease_expires_at``, ``kiln.scheduler.loop``; ``KILN_LEASE_SECONDS`` is the
                TTL, renewed by the holder's full sweep once less than half of it is left), and only that server
                decides for it until the lease runs out; then the first server whose pass sees it expired places it
                and takes the lease. Per round: with one long job ``sleep`` RUNNING and the organisation's ``train``
                quota at ``count 1``, a job ``true`` is submitted and waits (``quota: count 1 of 1 in use``); once a
                server holds its lease, a random part of one renewal period later (so that the kill falls anywhere
                in the holder's renewal cycle) the holder is killed with SIGKILL, and a survivor raises the quota to
                2, so the job's placement is due at once and only the dead holder's lease stands in its way.
                Failover = the job's STARTING event time (``job_events.time``, stamped by the new holder in the
                transaction that places the job and takes its lease: the server's own record of its first decision,
                not the client's polling) minus the client's clock just before the kill (one machine, one clock).
                Also: the dead holder's lease left at the kill, and the delay after it expired (what the platform
                adds to the TTL: the survivors' loop). The killed server is restarted before the next round.
                Target: max failover <= TTL + one reconcile interval.

Nothing is asserted: the figures are printed with PASS/FAIL against their targets (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from api_throughput import JOBS_PATH, JOBS_QUERY, print_phase, run_phase, seed_jobs  # noqa: E402
from report import finish, parse_args, print_table, summary  # noqa: E402

PY = sys.executable
PG_URL = os.environ.get("KILN_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def row(metric: str, value: float, baseline: float | None, target: str, ok: bool | None, unit: str) -> dict:
    return {
        "metric": metric,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "ratio": (value / baseline) if baseline else None,
        "target": target,
        "pass": ok,
    }


# -- the cluster --------------------------------------------------------------------------------------


class Cluster:
    """N servers on one fresh PostgreSQL database; started one at a time (the first migrates the database)."""

    def __init__(self, tmp: Path, pg_url: str, args: argparse.Namespace) -> None:
        from cryptography.fernet import Fernet
        from sqlalchemy import create_engine
        from sqlalchemy.engine import make_url

        base = make_url(pg_url if "+" in pg_url.split(":", 1)[0] else pg_url.replace("://", "+psycopg://", 1))
        self.name = f"kiln_bench_failover_{secrets.token_hex(4)}"
        self._admin = create_engine(base.set(database="postgres"), isolation_level="AUTOCOMMIT")
        with self._admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{self.name}"')
        self.url = base.set(database=self.name).render_as_string(hide_password=False)
        self.engine = create_engine(self.url)
        self.tmp = tmp
        self.shared = {
            "server_key": Fernet.generate_key().decode(),
            "storage_url": str(tmp / "store"),
            "lease_seconds": str(args.lease_seconds),
            "reconcile_interval": str(args.reconcile_interval),
            "rate_limit_per_second": "0",
            "cpus": "64",
        }
        self.servers: list[Any] = []

    def add(self) -> Any:
        from tests.kilnserver import KilnServer

        i = len(self.servers)
        server = KilnServer(self.tmp / f"home-{i}", self.url, instance_id=f"bench-{i}", **self.shared)
        self.servers.append(server)
        t0 = time.monotonic()
        server.start()
        print(f"  server bench-{i} up in {time.monotonic() - t0:.1f}s at {server.url}")
        return server

    def grow(self, n: int) -> None:
        """Up to n servers; those after the first are started in parallel."""
        if not self.servers and n:
            self.add()
        todo = n - len(self.servers)
        threads = [threading.Thread(target=self.add) for _ in range(todo)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if len(self.servers) < n:
            raise RuntimeError("a server did not start (see above)")

    def creds(self) -> dict[str, str]:
        return dict(self.servers[0].credentials())

    def client(self, server: Any) -> Any:
        from kiln.sdk.client import Client

        creds = self.creds()
        return Client(server.url, creds["KILN_ACCESS_KEY"], creds["KILN_SECRET_KEY"])

    def alive(self) -> list[Any]:
        return [s for s in self.servers if s.proc is not None and s.proc.poll() is None]

    def close(self) -> None:
        for server in self.servers:
            try:
                server.stop()
            except Exception as exc:  # the others must still stop
                print(f"  stopping {server.home.name}: {exc}", file=sys.stderr)
        self.engine.dispose()
        with self._admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        self._admin.dispose()


# -- throughput ---------------------------------------------------------------------------------------


def section_throughput(cluster: Cluster, args: argparse.Namespace, results: dict, rows: list[dict]) -> None:
    print(f"\nthroughput: GET {JOBS_PATH}?{JOBS_QUERY}, {args.concurrency} connections spread over the servers")
    cluster.grow(1)
    client = cluster.client(cluster.servers[0])
    seed_jobs(client, args.jobs)
    client.close()
    creds = cluster.creds()
    phases: dict[int, dict[str, Any]] = {}
    for n in range(1, args.servers + 1):
        cluster.grow(n)
        servers = cluster.servers[:n]
        spec = {
            "access_key": creds["KILN_ACCESS_KEY"],
            "secret_key": creds["KILN_SECRET_KEY"],
            "port": servers[0].port,
            "ports": [s.port for s in servers],
            "server_pid": servers[0].proc.pid,
            "server_pids": [s.proc.pid for s in servers],
            "path": JOBS_PATH,
            "query": JOBS_QUERY,
            "concurrency": args.concurrency,
            "warmup": args.warmup,
            "duration": args.duration,
            "sign": True,
            "pool": int(args.pool_rps * (args.warmup + args.duration)),
        }
        r = run_phase(cluster.tmp, f"servers-{n}", f"{n} server(s), c={args.concurrency}", spec)
        print_phase(r)
        each = ", ".join(f"{x:.0f}%" for x in r["server_cpu_percent_each"])
        print(f"    CPU per server: {each}; load average {os.getloadavg()[0]:.1f}")
        phases[n] = r
    results["throughput"] = phases
    base = phases[1]["rps"]
    rows.append(row(f"GET /jobs throughput, 1 server, c={args.concurrency}", base, None, "(baseline)", None, "req/s"))
    for n in range(2, args.servers + 1):
        metric = f"GET /jobs throughput, {n} servers, c={args.concurrency}"
        rows.append(row(metric, phases[n]["rps"], base, f"(info, {os.cpu_count()} CPUs)", None, "req/s"))
    for n, r in phases.items():
        lat, base_lat = r["latency"]["p50"], phases[1]["latency"]["p50"]
        rows.append(row(f"GET /jobs latency p50, {n} server(s)", lat, base_lat, "(info)", None, "ms"))


# -- failover -----------------------------------------------------------------------------------------


def job_lease(cluster: Cluster, job_id: str) -> tuple[str | None, datetime | None, str, str | None]:
    """(lease owner, lease expiry, state, message) of a job, read from the database."""
    from sqlalchemy import select

    from kiln.db.tables import Job

    with cluster.engine.connect() as conn:
        r = conn.execute(
            select(Job.lease_owner, Job.lease_expires_at, Job.state, Job.message).where(Job.id == job_id)
        ).one()
    return r[0], r[1], r[2], r[3]


def starting_time(cluster: Cluster, job_id: str) -> datetime | None:
    """When the job's first STARTING event was written (by the server that placed it)."""
    from sqlalchemy import select

    from kiln.db.tables import JobEvent

    query = select(JobEvent.time).where(JobEvent.job_id == job_id, JobEvent.to_state == "STARTING")
    with cluster.engine.connect() as conn:
        return conn.execute(query.order_by(JobEvent.id).limit(1)).scalar_one_or_none()


def poll(what: Callable[[], Any], timeout: float, every: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"not after {timeout:.0f}s")


def one_round(cluster: Cluster, args: argparse.Namespace, rng: random.Random, k: int, org: str) -> dict[str, Any]:
    ttl = args.lease_seconds
    via = cluster.alive()[k % len(cluster.alive())]
    client = cluster.client(via)
    try:
        client.set_quota(org, "train", count=1)
        job = client.submit({"command": ["true"], "runtime": {"python": PY}, "resources": {"cpus": 0.1}})

        def held() -> str | None:
            owner, _, state, message = job_lease(cluster, job.id)
            return owner if owner and state == "QUEUED" and (message or "").startswith("quota") else None

        poll(held, timeout=ttl + 30)
        time.sleep(rng.uniform(0, ttl / 2))  # anywhere in the holder's renewal cycle
        owner, _, state, _ = job_lease(cluster, job.id)
        if state != "QUEUED":
            raise RuntimeError(f"job {job.id} is {state} before the kill")
        victim = next(s for s in cluster.servers if s.env.get("KILN_INSTANCE_ID") == owner)
        killed_at = time.time()
        victim.kill()
        after_owner, expires, _, _ = job_lease(cluster, job.id)
        survivor = next(s for s in cluster.alive())
        other = cluster.client(survivor)
        other.set_quota(org, "train", count=2)  # the job's placement is due now
        due_at = time.time()
        if expires is not None and due_at > expires.timestamp():
            print(f"  warning: the quota was raised {due_at - expires.timestamp():.2f}s after the lease ran out")
        decided = poll(lambda: starting_time(cluster, job.id), timeout=ttl * 2 + 60)
        new_owner, _, _, _ = job_lease(cluster, job.id)
        poll(lambda: str(other.get_job(job.id).state) in TERMINAL, timeout=120, every=0.1)
        other.close()
    finally:
        client.close()
    failover = decided.timestamp() - killed_at
    left = expires.timestamp() - killed_at if expires else float("nan")
    after = decided.timestamp() - expires.timestamp() if expires else float("nan")
    print(
        f"  kill {k + 1:2d}: {owner} killed with {left:5.2f}s of lease left; {new_owner} placed the job "
        f"{failover:5.2f}s after the kill ({after * 1000:+4.0f} ms after the lease ran out)"
        + ("" if after_owner == owner else f"  (lease moved to {after_owner} at the kill)")
    )
    result = {"job": job.id, "killed": owner, "new_holder": new_owner, "failover_s": failover}
    result |= {"lease_left_s": left, "after_expiry_s": after, "restart_s": None}
    if k + 1 < args.kills:
        t0 = time.monotonic()
        victim.start()
        result["restart_s"] = time.monotonic() - t0
    return result


def section_failover(cluster: Cluster, args: argparse.Namespace, results: dict, rows: list[dict]) -> None:
    ttl, interval = args.lease_seconds, args.reconcile_interval
    print(
        f"\nfailover: {args.servers} servers, {args.kills} kills, lease TTL {ttl:g}s "
        f"(KILN_LEASE_SECONDS), reconcile interval {interval:g}s"
    )
    cluster.grow(args.servers)
    client = cluster.client(cluster.servers[0])
    org = client.whoami().org_id
    blocker = client.submit(
        {"command": ["sleep", "3600"], "runtime": {"python": PY}, "resources": {"cpus": 0.1}, "timeout": 3600}
    )
    poll(lambda: str(client.get_job(blocker.id).state) == "RUNNING", timeout=60, every=0.1)
    client.close()
    rng = random.Random(args.seed)
    rounds = []
    try:
        for k in range(args.kills):
            rounds.append(one_round(cluster, args, rng, k, org))
    finally:
        live = cluster.alive()
        if live:
            c = cluster.client(live[0])
            try:
                c.cancel(blocker.id)
            except Exception as exc:
                print(f"  cancelling the blocker: {exc}", file=sys.stderr)
            c.close()
    fail = [r["failover_s"] for r in rounds]
    after = [r["after_expiry_s"] for r in rounds]
    left = [r["lease_left_s"] for r in rounds]
    restarts = [r["restart_s"] for r in rounds if r["restart_s"] is not None]
    results["failover"] = {
        "rounds": rounds,
        "failover_s": summary(fail),
        "after_expiry_s": summary(after),
        "lease_left_s": summary(left),
        "restart_s": summary(restarts),
        "lease_seconds": ttl,
        "reconcile_interval": interval,
    }
    s_fail, s_after = summary(fail), summary(after)
    target = ttl + interval
    rows.append(row(f"failover p50 ({len(fail)} kills), against the TTL", s_fail["p50"], ttl, "(info)", None, "ms"))
    rows.append(
        row(
            "failover max, against the TTL",
            s_fail["max"],
            ttl,
            f"≤ TTL+{interval:g}s",
            s_fail["max"] <= target,
            "ms",
        )
    )
    rows.append(row("lease left at the kill, p50", summary(left)["p50"], ttl, "(info)", None, "ms"))
    rows.append(
        row("placed after the lease ran out, p50", s_after["p50"], interval, "(info)", None, "ms"),
    )
    rows.append(
        row(
            "placed after the lease ran out, max",
            s_after["max"],
            interval,
            f"≤ {interval:g}s",
            s_after["max"] <= interval,
            "ms",
        )
    )


SECTIONS = {"throughput": section_throughput, "failover": section_failover}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=3, help="servers on the database (default 3)")
    parser.add_argument("--kills", type=int, default=20, help="failover rounds (default 20)")
    parser.add_argument("--lease-seconds", type=float, default=5.0, help="KILN_LEASE_SECONDS, the TTL (default 5)")
    parser.add_argument(
        "--reconcile-interval", type=float, default=0.5, help="KILN_RECONCILE_INTERVAL (default 0.5, production)"
    )
    parser.add_argument("--concurrency", type=int, default=12, help="connections of the throughput load (12)")
    parser.add_argument("--duration", type=float, default=10.0, help="timed seconds per throughput phase (10)")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds before each phase (2)")
    parser.add_argument("--jobs", type=int, default=25, help="finished jobs in the database (default 25)")
    parser.add_argument("--pool-rps", type=float, default=5000, help="signed requests prepared per phase second")
    parser.add_argument("--postgres", default=PG_URL, help=f"a new database is made next to this one's ({PG_URL})")
    parser.add_argument("--seed", type=int, default=0, help="when in the renewal cycle each kill falls")
    parser.add_argument("--skip", nargs="*", default=[], choices=sorted(SECTIONS), help="sections to leave out")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parse_args(
        parser,
        {
            "servers": 2,
            "kills": 1,
            "lease_seconds": 2.0,
            "duration": 0.5,
            "warmup": 0.2,
            "concurrency": 2,
            "jobs": 2,
            "pool_rps": 400,
        },
    )
    started = time.monotonic()
    results: dict[str, Any] = {"python": PY, "cpus_on_machine": os.cpu_count(), "args": vars(args)}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kiln-bench-failover-") as tmp_s:
        cluster = Cluster(Path(tmp_s), args.postgres, args)
        print(f"database {cluster.name} (dropped at exit); {args.servers} servers at most")
        try:
            for name, section in SECTIONS.items():
                if name not in args.skip:
                    section(cluster, args, results, rows)
        finally:
            cluster.close()
    print_table(rows, metric_width=48, digits={"req/s": 0, "ms": 0})
    print(
        "failover: from the client's clock before SIGKILL of the job's lease holder to the job's STARTING event "
        "written by the\nnew holder (server time, same machine); baseline = the lease TTL. Throughput: baseline = "
        f"1 server, same run; on {os.cpu_count()} CPUs\nthe servers, PostgreSQL and the load generator share the "
        "same CPUs, so more servers cannot add throughput here."
    )
    finish(results, rows, started, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

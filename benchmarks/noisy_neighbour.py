"""A noisy neighbour: organisation A's latency while organisation B attacks the work Kiln does for its jobs.

    .venv/bin/python benchmarks/noisy_neighbour.py [--db sqlite postgresql] [--seconds 30] [--json PATH]

For each database (one fresh ``kiln server`` each, started through ``tests.kilnserver.KilnServer``), organisation
A's member measures, first on the quiet server and then while each of organisation B's attacks runs in turn:

- ``GET /api/v1/jobs``: one request after another for the phase's length (A has a few jobs of its own to list);
- submit → RUNNING: a job submitted every ``--submit-every`` seconds; latency = the job's RUNNING event time minus
  the client's clock just before the POST (the same machine's clock).

B's attacks (issue 43), each one job (or, for the proxy, requests from anyone who reaches the API port):

1. ``metrics-flood``: a job writes ``--flood-lines`` lines to ``$KILN_METRICS_DIR/flood.jsonl``, each 50 metrics
   whose names cycle over 250,000 series, then sleeps;
2. ``sparse-outputs``: a job with ``disk: 100M`` makes 20 sparse files of 95 MiB apparent size in its outputs;
3. ``proxy-body``: three concurrent unauthenticated POSTs of ``--body-mb`` MB to ``/notebooks/nb-x/api/contents``;
4. ``unterminated-line``: a job writes 65 x 1 MiB of ``x`` with no newline into 8 metric spool files, then sleeps;
5. ``tensorboard``: a job writes an event file whose Summaries hold 60,000 values per record, then sleeps.

Judged per database: A's ``GET /jobs`` p99 during each attack within 2x of quiet, A's submit → RUNNING p99 within
2x of quiet, no 5xx answered to A, and no background task's pass failed (the tasks' error counts in ``/readyz``,
before and after). Nothing is asserted: the machine is shared and noisy; the figures are ratios against the quiet
phase of the same run. The server's RSS and CPU per phase are printed too.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from report import finish, parse_args, print_table, summary  # noqa: E402
from tests.kilnserver import KilnServer  # noqa: E402
from tests.tenancy_helpers import Api, Tenant, close_all, create_tenant, job_spec  # noqa: E402

PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}

FLOOD = r"""
import json, os, time
path = os.path.join(os.environ["KILN_METRICS_DIR"], "flood.jsonl")
lines, series = int(os.environ["FLOOD_LINES"]), 250_000
with open(path, "w") as fh:
    for i in range(lines):
        m = {f"m{(i * 50 + k) % series}": float(k) for k in range(50)}
        fh.write(json.dumps({"t": time.time(), "s": i, "w": "worker0", "m": m, "src": "sdk"}) + "\n")
time.sleep(3600)
"""

SPARSE = r"""
import os
out = os.environ["KILN_OUTPUT_DIR"]
for i in range(20):
    with open(os.path.join(out, f"sparse{i}.bin"), "wb") as f:
        f.write(b"1")
        f.truncate(95 * 2**20)
"""

UNTERMINATED = r"""
import os, time
block = b"x" * 2**20
for n in range(8):
    with open(os.path.join(os.environ["KILN_METRICS_DIR"], f"long{n}.jsonl"), "wb") as fh:
        for _ in range(int(os.environ["LONG_MB"])):
            fh.write(block)
time.sleep(3600)
"""

TENSORBOARD = r"""
import os, struct, time, zlib
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter
directory = os.environ["KILN_TENSORBOARD_DIR"]
os.makedirs(directory, exist_ok=True)
with open(os.path.join(directory, "events.out.tfevents.1.crafted"), "wb") as fh:
    writer = RecordWriter(fh)
    writer.write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
    for step in range(int(os.environ["TB_RECORDS"])):
        values = [summary_pb2.Summary.Value(tag=f"v{k}", simple_value=float(k)) for k in range(60_000)]
        event = event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=values))
        writer.write(event.SerializeToString())
    writer.flush()
time.sleep(3600)
"""


def row(metric: str, value: float, baseline: float | None, target: str, ok: bool | None, unit: str) -> dict:
    ratio = value / baseline if baseline else None
    return {
        "metric": metric,
        "value": value,
        "baseline": baseline,
        "ratio": ratio,
        "target": target,
        "pass": ok,
        "unit": unit,
    }


class Probe:
    """A's requests for one phase: GET /jobs in a loop, and a job submitted every ``submit_every`` seconds."""

    def __init__(self, api: Api, submit_every: float) -> None:
        self.api = api
        self.submit_every = submit_every
        self.lists: list[float] = []
        self.submits: list[tuple[str, float]] = []  # (job id, client clock before the POST)
        self.status: dict[int, int] = {}
        self.errors: list[str] = []

    def run(self, seconds: float) -> None:
        stop = time.monotonic() + seconds
        submitter = threading.Thread(target=self._submit_loop, args=(stop,), daemon=True)
        submitter.start()
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            try:
                response = self.api.get("/jobs", params={"limit": 20})
                self.status[response.status_code] = self.status.get(response.status_code, 0) + 1
            except httpx.HTTPError as exc:
                self.errors.append(f"GET /jobs: {type(exc).__name__}")
            self.lists.append(time.perf_counter() - t0)
        submitter.join()

    def _submit_loop(self, stop: float) -> None:
        while time.monotonic() < stop:
            at = time.time()
            try:
                response = self.api.post("/jobs", {"spec": job_spec(["sleep", "0.2"], resources={"cpus": 0.1})})
                self.status[response.status_code] = self.status.get(response.status_code, 0) + 1
                if response.status_code < 300:
                    self.submits.append((response.json()["id"], at))
            except httpx.HTTPError as exc:
                self.errors.append(f"POST /jobs: {type(exc).__name__}")
            time.sleep(max(0.0, self.submit_every - (time.time() - at)))

    def running_latencies(self, timeout: float = 60) -> list[float]:
        """Submit → RUNNING of this phase's jobs (those that never ran within ``timeout`` count as ``timeout``)."""
        out: list[float] = []
        deadline = time.monotonic() + timeout
        for job_id, at in self.submits:
            while True:
                ran = None
                try:
                    for event in self.api.events(job_id):
                        if event.get("to_state") == "RUNNING":
                            ran = datetime.fromisoformat(event["time"]).timestamp()
                            break
                    state = self.api.ok("GET", f"/jobs/{job_id}")["state"]
                except (AssertionError, httpx.HTTPError):
                    state = None
                if ran is not None:
                    out.append(ran - at)
                    break
                if state in TERMINAL or time.monotonic() > deadline:
                    out.append(timeout)
                    break
                time.sleep(0.1)
        return out

    @property
    def five_xx(self) -> int:
        return sum(n for code, n in self.status.items() if code >= 500) + len(self.errors)


def task_errors(admin: Api) -> dict[str, int]:
    body = admin.get("/readyz").json()
    return {task["name"]: int(task["errors"]) for task in body.get("tasks", [])}


class Attack:
    """One of B's attacks: started, left running for the phase, stopped."""

    def __init__(self, name: str, b: Api, server: KilnServer, args: argparse.Namespace) -> None:
        self.name, self.b, self.server, self.args = name, b, server, args
        self.job_id: str | None = None
        self.threads: list[threading.Thread] = []
        self.proxy_status: list[int | str] = []

    def start(self) -> None:
        a = self.args
        if self.name == "metrics-flood":
            self._job(FLOOD, env={"FLOOD_LINES": str(a.flood_lines)})
        elif self.name == "sparse-outputs":
            self._job(SPARSE, resources={"disk": "100M"})
        elif self.name == "unterminated-line":
            self._job(UNTERMINATED, env={"LONG_MB": str(a.long_mb)})
        elif self.name == "tensorboard":
            self._job(TENSORBOARD, env={"TB_RECORDS": str(a.tb_records)})
        elif self.name == "proxy-body":
            for _ in range(3):
                thread = threading.Thread(target=self._big_body, daemon=True)
                thread.start()
                self.threads.append(thread)

    def _job(self, script: str, env: dict[str, str] | None = None, resources: dict[str, Any] | None = None) -> None:
        spec = job_spec([sys.executable, "-c", script], env=env or {}, resources={"cpus": 0.5, **(resources or {})})
        self.job_id = self.b.ok("POST", "/jobs", json_body={"spec": spec})["id"]

    def _big_body(self) -> None:
        chunk = b"\0" * 2**20

        def body() -> Any:
            for _ in range(self.args.body_mb):
                yield chunk

        try:
            with httpx.Client(timeout=120) as http:
                response = http.post(f"{self.server.url}/notebooks/nb-x/api/contents", content=body())
                self.proxy_status.append(response.status_code)
        except httpx.HTTPError as exc:  # the server may close the connection once it has answered
            self.proxy_status.append(type(exc).__name__)

    def stop(self) -> str:
        for thread in self.threads:
            thread.join(timeout=120)
        if self.job_id is None:
            return f"proxy answers {self.proxy_status}"
        job = self.b.ok("GET", f"/jobs/{self.job_id}")
        if job["state"] not in TERMINAL:
            try:
                self.b.request("POST", f"/jobs/{self.job_id}/cancel")
            except httpx.HTTPError as exc:  # a server the attack stalled: say so in the phase's line
                return f"job {job['state']}; cancel failed: {type(exc).__name__}"
        reasons = sorted({e.get("reason") or "" for e in self.b.events(self.job_id)} - {""})
        return f"job {job['state']}; events {', '.join(reasons)}"


ATTACKS = ["metrics-flood", "sparse-outputs", "proxy-body", "unterminated-line", "tensorboard"]


def server_usage(server: KilnServer) -> tuple[float, int]:
    """The server process's CPU seconds so far and its RSS now."""
    proc = psutil.Process(server.proc.pid)  # type: ignore[union-attr]
    times = proc.cpu_times()
    return times.user + times.system, proc.memory_info().rss


def measure(db: str, url: str | None, tmp: Path, args: argparse.Namespace, rows: list[dict], results: dict) -> None:
    print(f"\n== {db}")
    server = KilnServer(tmp / db, database_url=url, cpus="64").start()
    admin = Api.admin(server)
    tenants: list[Tenant] = []
    try:
        a, b = create_tenant(admin, "org-a", ("member",)), create_tenant(admin, "org-b", ("member",))
        tenants += [a, b]
        for _ in range(5):  # something for A to list
            a["member"].api.submit(["true"])
        phases: dict[str, dict[str, Any]] = {}
        # Quiet first and again last: A's own jobs pile up over the run (each phase submits more), so the quiet
        # figure taken on the larger of the two weighs that on both sides of the ratio, and the ratio measures B.
        for phase in ["quiet", *args.attacks, "quiet-after"]:
            attack = None if phase.startswith("quiet") else Attack(phase, b["member"].api, server, args)
            errors_before = task_errors(admin)
            cpu_before, _ = server_usage(server)
            if attack is not None:
                attack.start()
            probe = Probe(a["member"].api, args.submit_every)
            probe.run(args.seconds)
            cpu_after, rss = server_usage(server)
            what = attack.stop() if attack is not None else ""
            running = probe.running_latencies()
            errors_after = task_errors(admin)
            failed = {n: errors_after.get(n, 0) - c for n, c in errors_before.items() if errors_after.get(n, 0) > c}
            phases[phase] = {
                "list": summary(probe.lists),
                "running": summary(running),
                "five_xx": probe.five_xx,
                "status": probe.status,
                "client_errors": probe.errors[:5],
                "task_failures": failed,
                "server_cpu_s": cpu_after - cpu_before,
                "server_rss_mb": rss / 2**20,
                "attack": what,
            }
            lists, ran = phases[phase]["list"], phases[phase]["running"]
            print(
                f"  {phase:18s} GET /jobs p50 {lists.get('p50', 0) * 1000:7.1f} ms"
                f" p99 {lists.get('p99', 0) * 1000:7.1f} ms (n={lists['n']});"
                f" submit→RUNNING p50 {ran.get('p50', 0) * 1000:7.1f} ms"
                f" p99 {ran.get('p99', 0) * 1000:7.1f} ms (n={ran['n']}); 5xx {probe.five_xx}; task failures"
                f" {failed or 0}; server CPU {cpu_after - cpu_before:.1f} s, RSS {rss / 2**20:.0f} MB; {what}"
            )
        results[db] = phases
        first, last = phases["quiet"], phases["quiet-after"]
        quiet = {key: max((first, last), key=lambda p: p[key].get("p99", 0))[key] for key in ("list", "running")}
        for phase in args.attacks:
            got = phases[phase]
            list_p99, quiet_list = got["list"]["p99"], quiet["list"]["p99"]
            rows.append(
                row(
                    f"{db} {phase}: GET /jobs p99",
                    list_p99,
                    quiet_list,
                    "<= 2x quiet",
                    list_p99 <= 2 * quiet_list,
                    "ms",
                )
            )
            if got["running"]["n"] and quiet["running"]["n"]:
                run_p99, quiet_run = got["running"]["p99"], quiet["running"]["p99"]
                rows.append(
                    row(
                        f"{db} {phase}: submit→RUNNING p99",
                        run_p99,
                        quiet_run,
                        "<= 2x quiet",
                        run_p99 <= 2 * quiet_run,
                        "ms",
                    )
                )
            rows.append(row(f"{db} {phase}: 5xx to A", got["five_xx"], None, "0", got["five_xx"] == 0, "n"))
            failures = sum(got["task_failures"].values())
            rows.append(row(f"{db} {phase}: task passes failed", failures, None, "0", failures == 0, "n"))
    finally:
        close_all(*tenants)
        admin.close()
        server.stop()


def pg_database(tmp: Path) -> tuple[str, Any]:
    """A fresh PostgreSQL database for this run, and a function that drops it."""
    from sqlalchemy import create_engine, text

    name = f"kiln_noisy_{os.getpid()}"
    engine = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
        conn.execute(text(f"CREATE DATABASE {name}"))

    def drop() -> None:
        with engine.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        engine.dispose()

    return PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}", drop


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", nargs="+", choices=["sqlite", "postgresql"], default=["sqlite", "postgresql"])
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each phase")
    parser.add_argument("--submit-every", type=float, default=0.5, help="A submits a job this often")
    parser.add_argument("--attacks", nargs="+", choices=ATTACKS, default=ATTACKS)
    parser.add_argument("--flood-lines", type=int, default=20_000)
    parser.add_argument("--long-mb", type=int, default=65, help="MiB of unterminated line per spool file")
    parser.add_argument("--body-mb", type=int, default=250, help="MB of each unauthenticated proxy body")
    parser.add_argument("--tb-records", type=int, default=200, help="records of 60,000 values in the event file")
    parser.add_argument("--json", type=Path)
    args = parse_args(
        parser,
        {"db": ["sqlite"], "seconds": 2.0, "flood_lines": 200, "long_mb": 2, "body_mb": 4, "tb_records": 2},
    )
    started = time.monotonic()
    rows: list[dict] = []
    results: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if k != "json"}}
    with tempfile.TemporaryDirectory(prefix="kiln-noisy-") as tmp:
        for db in args.db:
            drop = None
            url = None
            if db == "postgresql":
                url, drop = pg_database(Path(tmp))
            try:
                measure(db, url, Path(tmp), args, rows, results)
            finally:
                if drop is not None:
                    drop()
    print_table(rows, metric_width=52, digits={"ms": 1, "n": 0})
    finish(results, rows, started, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

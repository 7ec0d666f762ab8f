"""Burst throughput: 100 trivial jobs submitted at once, against spawning the same processes 2 at a time.

    .venv/bin/python benchmarks/burst.py [--jobs 100] [--threads 8] [--samples 20] [--skip SECTION ...] [--json PATH]

What it measures (fresh ``kiln server`` processes in a temp dir, started through ``tests.kilnserver.KilnServer``
with the production defaults, ``KILN_RECONCILE_INTERVAL=0.5``):

1. baseline   the same N ``python -c pass`` processes spawned 2 at a time (the machine's 2 CPUs), spawn to
              exit: processes per second.
2. burst      N jobs ``python -c pass`` (``resources.cpus=1``; this server says it has N CPUs, so the scheduler
              places them all at once, each unthrottled: a job's CPUs are a hard quota, and one at 0.01 CPU takes
              3 s of wall time for the interpreter's 30 ms of start-up)
              submitted through the SDK from T threads at once; throughput = N / (last job's ``finished_at`` -
              client clock just before the first submit). Target ≥ 20 jobs/s. Where the time goes is read from the
              jobs' records (created_at / started_at / running_at / finished_at).
3. sandbox    submit→RUNNING of single jobs (one at a time, each cancelled once RUNNING), on two servers started
              with ``KILN_SANDBOX=bwrap`` and ``KILN_SANDBOX=none``, samples interleaved; target p50 ratio ≤ 1.2x.
4. download   ``--download-mib`` MiB from an HTTP server on loopback read by a job (``network: isolated``, egress
              allowed to that port only) and by the same interpreter outside any sandbox, ``--download-rounds``
              times each, interleaved; target: in a job ≥ 0.8x outside (medians).

The machine is shared and noisy: figures are ratios against a baseline of the same run, nothing is asserted.
Every job is cancelled and every server stopped at the end; left-over shims of this run are killed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cpu_use import ServerCpu, describe  # noqa: E402
from report import finish, parse_args, print_table, summary  # noqa: E402
from tests.kilnserver import KilnServer  # noqa: E402

from kiln.errors import Conflict  # noqa: E402

PY = sys.executable  # a resolved interpreter: `python3` on PATH may be a slow pyenv shim
PY_ROOTS = f"{sys.prefix}:{sys.base_prefix}"  # where it lives: the server must allow it as runtime.python
SHIM_MARK = "kiln/injob/shim.py"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
TARGET_JOBS_PER_S = 30.0
TARGET_BASELINE_SHARE = 0.5  # of the machine's bare spawn rate
TARGET_SANDBOX_RATIO = 1.2
TARGET_CPU_PER_JOB_S = 0.060


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:8.1f} ms"


def trivial(cpus: float, network: str = "isolated") -> dict[str, Any]:
    return {
        "command": ["python", "-c", "pass"],
        "runtime": {"python": PY},
        "resources": {"cpus": cpus},
        "network": network,
    }


def sleeper(cpus: float) -> dict[str, Any]:
    return {"command": ["sleep", "60"], "runtime": {"python": PY}, "resources": {"cpus": cpus}}


def epoch(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


# -- baseline -----------------------------------------------------------------------------------------


def spawn_baseline(n: int, parallel: int) -> float:
    """Wall time of n ``python -c pass`` processes, ``parallel`` at a time (after 3 warm-ups)."""
    argv = [PY, "-c", "pass"]
    for _ in range(3):
        subprocess.run(argv, check=True)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(lambda _: subprocess.run(argv, check=True), range(n)))
    return time.perf_counter() - t0


# -- burst --------------------------------------------------------------------------------------------


def wait_all_ended(client: Any, job_ids: set[str], timeout: float) -> dict[str, Any]:
    """Poll the job list (one request, answered from the server's list cache when nothing changed) until every
    job ended; returns the last record of each."""
    deadline = time.monotonic() + timeout
    seen: dict[str, Any] = {}
    while time.monotonic() < deadline:
        for job in client.list_jobs(limit=500):
            if job.id in job_ids:
                seen[job.id] = job
        if len(seen) == len(job_ids) and all(str(j.state) in TERMINAL for j in seen.values()):
            break
        time.sleep(0.25)
    return seen


def run_burst(server: KilnServer, n: int, threads: int, cpus: float, network: str) -> dict[str, Any]:
    clients = [server.client() for _ in range(threads)]
    for c in clients:
        c.whoami()  # connections up before the clock starts
    ids: list[str] = []
    ids_lock = threading.Lock()
    barrier = threading.Barrier(threads + 1)

    def submitter(index: int) -> None:
        client = clients[index]
        share = n // threads + (1 if index < n % threads else 0)
        barrier.wait()
        for _ in range(share):
            job_id = client.submit(trivial(cpus, network)).id
            with ids_lock:
                ids.append(job_id)

    workers = [threading.Thread(target=submitter, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    t0 = time.time()
    barrier.wait()
    for w in workers:
        w.join()
    t_submitted = time.time()
    records = wait_all_ended(clients[0], set(ids), timeout=300)
    for c in clients[1:]:
        c.close()
    client = clients[0]
    states: dict[str, int] = {}
    for job in records.values():
        states[str(job.state)] = states.get(str(job.state), 0) + 1
    finished = [epoch(j.finished_at) for j in records.values() if str(j.state) == "SUCCEEDED"]
    t_end = max((f for f in finished if f is not None), default=None)
    stages: dict[str, list[float]] = {"submit (client → created_at)": [], "queued (created → STARTING)": []}
    stages |= {"starting (STARTING → RUNNING)": [], "running (RUNNING → ended)": [], "total (client → ended)": []}
    milestones: dict[str, list[float]] = {"created": [], "STARTING": [], "RUNNING": [], "ended": []}
    for job in records.values():
        created, started = epoch(job.created_at), epoch(job.started_at)
        running, ended = epoch(job.running_at), epoch(job.finished_at)
        for key, value in (("created", created), ("STARTING", started), ("RUNNING", running), ("ended", ended)):
            if value is not None:
                milestones[key].append(value - t0)
        if created is not None:
            stages["submit (client → created_at)"].append(created - t0)
        if created is not None and started is not None:
            stages["queued (created → STARTING)"].append(started - created)
        if started is not None and running is not None:
            stages["starting (STARTING → RUNNING)"].append(running - started)
        if running is not None and ended is not None:
            stages["running (RUNNING → ended)"].append(ended - running)
        if ended is not None:
            stages["total (client → ended)"].append(ended - t0)
    return {
        "client": client,
        "ids": ids,
        "states": states,
        "submit_wall_s": t_submitted - t0,
        "wall_s": (t_end - t0) if t_end is not None else None,
        "t0": t0,
        "succeeded": len(finished),
        "stages": {k: summary(v) for k, v in stages.items()},
        "milestones": {k: sorted(v) for k, v in milestones.items()},
    }


def print_burst(result: dict[str, Any], n: int) -> None:
    print(f"  states: {result['states']}; submits took {result['submit_wall_s']:.2f}s")
    print("  per job (p50 / p90 / max):")
    for name, s in result["stages"].items():
        if s.get("n"):
            print(f"    {name:34s} {ms(s['p50'])} {ms(s['p90'])} {ms(s['max'])}")
    print("  seconds after the first submit by which 25 / 50 / 75 / 100 % of the jobs were:")
    for name, times in result["milestones"].items():
        if not times:
            continue
        marks = [times[min(len(times) - 1, max(0, round(q * n) - 1))] for q in (0.25, 0.5, 0.75, 1.0)]
        print(f"    {name:10s} " + "  ".join(f"{m:6.2f}s" for m in marks) + f"   (n={len(times)})")


# -- sandbox ------------------------------------------------------------------------------------------


def wait_running(client: Any, job_id: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        state = str(client.get_job(job_id).state)
        if state == "RUNNING" or state in TERMINAL or time.monotonic() > deadline:
            return state
        time.sleep(0.02)


def running_event_time(client: Any, job_id: str) -> float | None:
    for event in client.events(job_id):
        if event.to_state and str(event.to_state) == "RUNNING":
            return event.time.timestamp()
    return None


def cancel_quietly(client: Any, job_id: str) -> None:
    try:
        client.cancel(job_id)
    except Conflict:
        pass  # already ended


def run_sandbox(servers: dict[str, KilnServer], samples: int) -> dict[str, dict[str, Any]]:
    """Interleaved: one sample on each server in turn, so both see the same machine load."""
    clients = {name: server.client() for name, server in servers.items()}
    latencies: dict[str, list[float]] = {name: [] for name in servers}
    failed: dict[str, list[str]] = {name: [] for name in servers}
    try:
        for client in clients.values():  # warm-up: first request, runtime, launcher
            job_id = client.submit(sleeper(0.01)).id
            wait_running(client, job_id)
            cancel_quietly(client, job_id)
        for _ in range(samples):
            for name, client in clients.items():
                t0 = time.time()
                job_id = client.submit(sleeper(0.01)).id
                state = wait_running(client, job_id)
                at = running_event_time(client, job_id) if state == "RUNNING" else None
                if at is None:
                    failed[name].append(f"{job_id} {state}")
                else:
                    latencies[name].append(at - t0)
                cancel_quietly(client, job_id)
    finally:
        for client in clients.values():
            client.close()
    return {name: {"latency": summary(latencies[name]), "failed": failed[name]} for name in servers}


# -- clean-up -----------------------------------------------------------------------------------------


def cancel_open(server: KilnServer) -> None:
    try:
        with server.client() as client:
            for job in client.list_jobs(limit=500):
                if str(job.state) not in TERMINAL:
                    cancel_quietly(client, job.id)
    except Exception as exc:  # clean-up must go on
        print(f"clean-up: cancelling failed: {exc}", file=sys.stderr)


def kill_leftover_shims(home: Path) -> int:
    """Shims outlive the server by design; kill the ones this run started (and their sessions)."""
    killed = 0
    for pid_file in home.glob("jobs/*/attempts/*/shim.pid"):
        try:
            proc = psutil.Process(int(json.loads(pid_file.read_text())["pid"]))
            if SHIM_MARK in " ".join(proc.cmdline()) and proc.status() != psutil.STATUS_ZOMBIE:
                os.killpg(proc.pid, signal.SIGKILL)  # the shim leads its own session
                killed += 1
        except (psutil.Error, ValueError, OSError, KeyError):
            continue
    return killed


def stop_all(servers: list[KilnServer]) -> None:
    for server in servers:
        cancel_open(server)
    for server in servers:
        server.stop()
        leftovers = kill_leftover_shims(server.home)
        if leftovers:
            print(f"clean-up: killed {leftovers} left-over shim(s) of {server.home}", file=sys.stderr)


# -- report -------------------------------------------------------------------------------------------


def row(
    metric: str, value: float, baseline: float | None, ratio: float | None, target: str, ok: bool | None, unit: str
) -> dict[str, Any]:
    return {
        "metric": metric,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "ratio": ratio,
        "target": target,
        "pass": ok,
    }


def section_burst(args: argparse.Namespace, tmp: Path, results: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    n = args.jobs
    print(f"baseline: {n} x `{PY} -c pass`, {args.parallel} at a time")
    base_wall = spawn_baseline(n, args.parallel)
    base_rate = n / base_wall
    results["baseline"] = {"wall_s": base_wall, "per_s": base_rate}
    print(f"  {base_wall:.2f}s: {base_rate:.1f} processes/s")

    # as many CPUs as the burst asks for: every job is placed at once, as on a machine that large
    server = KilnServer(tmp / "burst", reconcile_interval=args.reconcile_interval, cpus=f"{n * args.cpus:g}")
    server.start()
    print(
        f"\nburst: {n} jobs `python -c pass` (cpus={args.cpus:g}, network: {args.network}) from {args.threads} "
        "SDK threads at once"
    )
    assert server.proc is not None
    cpu = ServerCpu(server.proc.pid)
    try:
        with server.client() as warm:  # first job: runtime resolution, the shim launcher
            warm.wait(warm.submit(trivial(args.cpus, args.network)).id, timeout=60)
        time.sleep(1.5)  # the launcher reaps its ended shims once a second: the warm-up's counted before
        before = cpu.snapshot()
        burst = run_burst(server, n, args.threads, args.cpus, args.network)
        time.sleep(1.5)  # and the burst's after
        burst["cpu_per_job_s"] = ServerCpu.per_job(before, cpu.snapshot(), n)
        burst.pop("client").close()
        print_burst(burst, n)
        print("  " + describe(burst["cpu_per_job_s"]))
    finally:
        stop_all([server])
        cpu.close()
    pool = [
        line.split("job network pool at stop: ", 1)[1] for line in server.log().splitlines() if "pool at stop" in line
    ]
    if pool:  # how many attempts found a namespace ready, made ahead or handed back by an earlier job
        print(f"  network namespaces: {pool[-1]}")
        burst["network_pool"] = pool[-1]
    wall = burst["wall_s"]
    rate = burst["succeeded"] / wall if wall else 0.0
    burst["per_s"] = rate
    results["burst"] = burst
    print(f"  {burst['succeeded']}/{n} succeeded; first submit → last SUCCEEDED {wall or 0:.2f}s: {rate:.1f} jobs/s")
    ok = rate >= TARGET_JOBS_PER_S and rate >= TARGET_BASELINE_SHARE * base_rate and burst["succeeded"] == n
    target = f"≥ {TARGET_JOBS_PER_S:g}/s, {TARGET_BASELINE_SHARE:g}x"
    rows.append(
        row(f"burst: {n} jobs, submit → all SUCCEEDED", rate, base_rate, rate / base_rate, target, ok, "jobs/s")
    )
    for key, label in (
        ("platform", "platform (cgroup)"),
        ("tree", "server+launcher tree"),
        ("server", "server process"),
    ):
        used = burst["cpu_per_job_s"].get(key)
        if used is not None:
            ok_cpu = used <= TARGET_CPU_PER_JOB_S if key == "tree" else None
            target_cpu = f"≤ {TARGET_CPU_PER_JOB_S * 1000:g} ms" if key == "tree" else "(info)"
            rows.append(row(f"burst: CPU per job, {label}", used * 1000, None, None, target_cpu, ok_cpu, "ms/job"))


def section_sandbox(args: argparse.Namespace, tmp: Path, results: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    interval = args.reconcile_interval
    servers = {
        mode: KilnServer(
            tmp / f"sandbox-{mode}", reconcile_interval=interval, sandbox=mode, allowed_python_roots=PY_ROOTS
        )
        for mode in ("bwrap", "none")
    }
    print(f"\nsandbox: submit→RUNNING, {args.samples} single jobs each, KILN_SANDBOX=bwrap and none interleaved")
    try:
        for server in servers.values():
            server.start()
        sandbox = run_sandbox(servers, args.samples)
    finally:
        stop_all(list(servers.values()))
    results["sandbox"] = sandbox
    for mode, figures in sandbox.items():
        s = figures["latency"]
        if s.get("n"):
            print(f"  KILN_SANDBOX={mode:5s} p50 {ms(s['p50'])}  p90 {ms(s['p90'])}  max {ms(s['max'])}  (n={s['n']})")
        if figures["failed"]:
            print(f"  KILN_SANDBOX={mode}: {len(figures['failed'])} never RUNNING: {figures['failed'][:3]}")
    bw, none = sandbox["bwrap"]["latency"], sandbox["none"]["latency"]
    if bw.get("n") and none.get("n"):
        ratio = bw["p50"] / none["p50"]
        target = f"≤ {TARGET_SANDBOX_RATIO:g}x none"
        rows.append(row("submit→RUNNING p50, KILN_SANDBOX=none", none["p50"], None, None, "(info)", None, "ms"))
        rows.append(
            row(
                "submit→RUNNING p50, KILN_SANDBOX=bwrap",
                bw["p50"],
                none["p50"],
                ratio,
                target,
                ratio <= TARGET_SANDBOX_RATIO,
                "ms",
            )
        )


# A download by a job from a local HTTP server the operator allows (KILN_JOB_EGRESS), through the job's network
# namespace and pasta's forwarded port, against the same download by the same script outside any sandbox.
DOWNLOAD = r"""
import sys, time, urllib.request
t0 = time.perf_counter()
total = 0
with urllib.request.urlopen(sys.argv[1], timeout=60) as answer:
    while chunk := answer.read(1 << 20):
        total += len(chunk)
print(f"DOWNLOADED {total} {time.perf_counter() - t0:.4f}", flush=True)
"""


def _blob_server(size: int) -> Any:
    import http.server

    block = b"\0" * (1 << 20)

    class Blob(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            left = size
            while left > 0:
                self.wfile.write(block[: min(left, len(block))])
                left -= len(block)

        def log_message(self, *_args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Blob)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _downloaded(line: str, size: int) -> float:
    _, total, seconds = line.split()
    if int(total) != size:
        raise RuntimeError(f"downloaded {total} bytes of {size}")
    return size / float(seconds)


def section_download(args: argparse.Namespace, tmp: Path, results: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    size = args.download_mib << 20
    blob = _blob_server(size)
    url = f"http://127.0.0.1:{blob.server_address[1]}/blob"
    server = KilnServer(
        tmp / "download",
        reconcile_interval=args.reconcile_interval,
        allowed_python_roots=PY_ROOTS,
        job_egress=f"allow 127.0.0.1:{blob.server_address[1]}",
    )
    print(f"\ndownload: {args.download_mib} MiB from a local HTTP server, in a job (network: isolated) vs outside")
    inside: list[float] = []
    outside: list[float] = []
    try:
        server.start()
        with server.client() as client:
            for _ in range(args.download_rounds):
                out = subprocess.run([PY, "-c", DOWNLOAD, url], capture_output=True, text=True, timeout=300)
                outside.append(_downloaded(out.stdout.strip().splitlines()[-1], size))
                job = client.submit({"command": [PY, "-c", DOWNLOAD, url], "runtime": {"python": PY}})
                done = client.wait(job.id, timeout=300)
                lines = [line.text for line in client.stream_logs(job.id, follow=False)]
                found = [line for line in lines if "DOWNLOADED" in line]
                if str(done.state) != "SUCCEEDED" or not found:
                    raise RuntimeError(f"download job {job.id} {done.state}: {done.message} {lines[-3:]}")
                inside.append(_downloaded(found[-1][found[-1].index("DOWNLOADED") :], size))
    finally:
        stop_all([server])
        blob.shutdown()
    a, b = statistics.median(inside), statistics.median(outside)
    results["download"] = {"inside_Bps": inside, "outside_Bps": outside}
    print(f"  in a job {a / 2**20:.0f} MiB/s, outside {b / 2**20:.0f} MiB/s (medians of {len(inside)})")
    rows.append(row("download outside any sandbox", b / 2**20, None, None, "(info)", None, "MiB/s"))
    rows.append(
        row(
            "download in a job via pasta (network: isolated)",
            a / 2**20,
            b / 2**20,
            a / b,
            "≥ 0.8x",
            a / b >= 0.8,
            "MiB/s",
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100, help="jobs in the burst (and baseline processes)")
    parser.add_argument("--threads", type=int, default=8, help="SDK threads submitting the burst")
    parser.add_argument("--cpus", type=float, default=1.0, help="resources.cpus of each job (default: 1)")
    parser.add_argument(
        "--network",
        default="isolated",
        choices=["isolated", "none"],
        help="the jobs' network (default: isolated)",
    )
    parser.add_argument("--parallel", type=int, default=2, help="baseline processes at a time (default: 2)")
    parser.add_argument("--samples", type=int, default=20, help="submit→RUNNING samples per sandbox setting")
    parser.add_argument("--reconcile-interval", default="0.5", help="KILN_RECONCILE_INTERVAL (default: 0.5)")
    parser.add_argument("--download-mib", type=int, default=1024, help="size of the download (default: 1 GiB)")
    parser.add_argument("--download-rounds", type=int, default=3, help="downloads inside and outside each")
    parser.add_argument("--skip", nargs="*", default=[], choices=["burst", "sandbox", "download"])
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parse_args(parser, {"jobs": 4, "threads": 2, "samples": 2, "download_mib": 4, "download_rounds": 1})
    started = time.monotonic()
    results: dict[str, Any] = {"python": PY, "jobs": args.jobs, "threads": args.threads, "cpus": os.cpu_count()}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kiln-burst-") as tmp:
        if "burst" not in args.skip:
            section_burst(args, Path(tmp), results, rows)
        if "sandbox" not in args.skip:
            section_sandbox(args, Path(tmp), results, rows)
        if "download" not in args.skip:
            section_download(args, Path(tmp), results, rows)
    print_table(rows, metric_width=44)
    print(
        f"burst baseline = the same processes spawned {args.parallel} at a time by this script; "
        "ratio = Kiln / baseline.\n"
        "sandbox ratio = p50 with KILN_SANDBOX=bwrap / p50 with KILN_SANDBOX=none (samples interleaved)."
    )
    finish(results, rows, started, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

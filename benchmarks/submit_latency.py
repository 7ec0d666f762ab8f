"""Submit→RUNNING latency and shim memory of the local executor, against a process-spawn baseline.

    .venv/bin/python benchmarks/submit_latency.py [--jobs 50] [--rss-jobs 20] [--json PATH]

What it measures (one fresh ``kiln server`` in a temp dir, started through ``tests.kilnserver.KilnServer``):

1. baseline   wall time of ``subprocess.run([sys.executable, "-c", "pass"])`` (spawn to exit), N times.
2. isolated   N jobs ``sleep 5``, each submitted only after the previous one is RUNNING (no queueing):
              latency = time of the job's →RUNNING event - client clock just before the submit POST.
              The targets apply to this one: p50 <= 3x baseline p50, p99 <= 10x baseline p99.
3. burst      N jobs submitted back to back, then the same latency read from the events: behaviour under load.
4. shim RSS   with M jobs ``sleep 30`` RUNNING, the RSS (and USS/PSS) of each job's shim process; target ≤ 30 MB.

Per-stage breakdowns (from the job events, the shim's pid file, the job log and status.json) show where the
time goes. The machine is shared and noisy: figures are ratios against the baseline of the same run, nothing
is asserted. Jobs are cancelled and the server stopped at the end; left-over shims of this run are killed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
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
SHIM_MARK = "kiln/injob/shim.py"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
MB = 1024 * 1024


# -- statistics ---------------------------------------------------------------------------------------


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:8.1f} ms"


# -- baseline -----------------------------------------------------------------------------------------


def spawn_baseline(n: int, warmup: int = 3) -> list[float]:
    argv = [PY, "-c", "pass"]
    for _ in range(warmup):
        subprocess.run(argv, check=True)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True)
        times.append(time.perf_counter() - t0)
    return times


# -- jobs ---------------------------------------------------------------------------------------------


NETWORK = ["isolated"]  # the jobs' network (--network)


def spec(seconds: int) -> dict[str, Any]:
    return {
        "command": ["sleep", str(seconds)],
        "runtime": {"python": PY},
        "resources": {"cpus": 1},
        "network": NETWORK[0],
    }


def epoch(value: datetime) -> float:
    return value.timestamp()


def wait_states(client: Any, job_ids: list[str], want: set[str], timeout: float, poll: float = 0.05) -> dict[str, str]:
    """Poll until every job is in ``want`` (or terminal); returns the last states seen."""
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    pending = list(job_ids)
    while pending and time.monotonic() < deadline:
        still = []
        for job_id in pending:
            state = str(client.get_job(job_id).state)
            states[job_id] = state
            if state not in want and state not in TERMINAL:
                still.append(job_id)
        pending = still
        if pending:
            time.sleep(poll)
    return states


def wait_running(client: Any, job_id: str, timeout: float = 30.0, poll: float = 0.02) -> str:
    deadline = time.monotonic() + timeout
    while True:
        state = str(client.get_job(job_id).state)
        if state == "RUNNING" or state in TERMINAL or time.monotonic() > deadline:
            return state
        time.sleep(poll)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


def mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime_ns / 1e9
    except OSError:
        return None


def shim_started_logged(home: Path, job_id: str) -> float | None:
    """Time of the shim's first log line ("attempt N starting"): the shim is up and has read its config."""
    try:
        for line in (home / "logs" / f"{job_id}.log").read_text(errors="replace").splitlines():
            stamp, stream, text = [*line.split(" ", 2), "", ""][:3]
            if stream == "K" and "starting" in text:
                return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except OSError:
        pass
    return None


def job_timeline(client: Any, home: Path, job_id: str, t_submit: float) -> dict[str, float | None]:
    """Absolute times of the stages one job went through (None where unknown)."""
    times: dict[str, float | None] = {"client_before_post": t_submit}
    for event in client.events(job_id):
        to = str(event.to_state) if event.to_state else None
        if to in ("QUEUED", "STARTING", "RUNNING") and f"ev_{to}" not in times:
            times[f"ev_{to}"] = epoch(event.time)
    attempt = home / "jobs" / job_id / "attempts" / "1"
    # File mtimes (ns resolution), not psutil's create_time: that one is derived from the integer boot time
    # in /proc/stat and can be off by up to a second.
    times["shim_json_written"] = mtime(attempt / "shim.json")
    times["shim_pid_written"] = mtime(attempt / "shim.pid")
    times["shim_first_log"] = shim_started_logged(home, job_id)
    status = read_json(attempt / "status.json") or {}
    times["child_started"] = status.get("running_at")
    return times


STAGES = [
    ("client → QUEUED event", "client_before_post", "ev_QUEUED", "HTTP + signature check + insert"),
    ("QUEUED → STARTING event", "ev_QUEUED", "ev_STARTING", "reconciler wake-up, claim, placement"),
    ("STARTING → shim.json", "ev_STARTING", "shim_json_written", "commit, resolve runtime, mkdirs, config"),
    ("shim.json → shim.pid", "shim_json_written", "shim_pid_written", "launcher forks the shim, its claim"),
    ("shim.pid → shim's first log line", "shim_pid_written", "shim_first_log", "shim's config, signals, log"),
    ("shim log → child running", "shim_first_log", "child_started", "scratch, groups, netns, bwrap, join"),
    ("child running → RUNNING event", "child_started", "ev_RUNNING", "notify, reconcile pass, commit"),
    ("TOTAL client → RUNNING event", "client_before_post", "ev_RUNNING", ""),
]


def stage_stats(timelines: list[dict[str, float | None]]) -> dict[str, dict[str, float]]:
    out = {}
    for name, start, end, _ in STAGES:
        deltas = [t[end] - t[start] for t in timelines if t.get(start) and t.get(end)]  # type: ignore[operator]
        out[name] = summary(deltas)
    return out


def print_stages(title: str, stats: dict[str, dict[str, float]]) -> None:
    print(f"\n{title}: where the time goes (per job; p50 / p90 / max)")
    for name, _, _, what in STAGES:
        s = stats[name]
        if not s.get("n"):
            print(f"  {name:32s} (no data)")
            continue
        print(f"  {name:32s} {ms(s['p50'])} {ms(s['p90'])} {ms(s['max'])}   {what}")


def latencies_of(timelines: list[dict[str, float | None]]) -> list[float]:
    """Submit→RUNNING: the RUNNING event's time minus the client's clock just before the POST."""
    out = []
    for t in timelines:
        running, submitted = t.get("ev_RUNNING"), t.get("client_before_post")
        if running is not None and submitted is not None:
            out.append(running - submitted)
    return out


def run_isolated(client: Any, home: Path, n: int) -> tuple[list[float], list[dict[str, float | None]], list[str]]:
    ids, submits = [], []
    for _ in range(n):
        t0 = time.time()
        job = client.submit(spec(5))
        ids.append(job.id)
        submits.append(t0)
        state = wait_running(client, job.id)
        if state != "RUNNING":
            print(f"  warning: job {job.id} ended up {state}, not RUNNING", file=sys.stderr)
    timelines = [job_timeline(client, home, j, t) for j, t in zip(ids, submits, strict=True)]
    return latencies_of(timelines), timelines, ids


def run_burst(client: Any, home: Path, n: int) -> tuple[list[float], list[dict[str, float | None]], list[str]]:
    ids, submits = [], []
    for _ in range(n):
        t0 = time.time()
        ids.append(client.submit(spec(5)).id)
        submits.append(t0)
    wait_states(client, ids, {"RUNNING"}, timeout=60)
    timelines = [job_timeline(client, home, j, t) for j, t in zip(ids, submits, strict=True)]
    return latencies_of(timelines), timelines, ids


def cancel_all(client: Any, job_ids: list[str], timeout: float = 30) -> None:
    for job_id in job_ids:
        try:
            client.cancel(job_id)
        except Conflict:
            pass  # already ended
    wait_states(client, job_ids, TERMINAL, timeout=timeout, poll=0.1)


# -- shim memory --------------------------------------------------------------------------------------


def shims_of(home: Path) -> list[psutil.Process]:
    """The shim processes of this run's server: the pids their attempts recorded in shim.pid (shims are forked
    from a launcher, so their command line names no attempt)."""
    found = []
    for pid_file in home.glob("jobs/*/attempts/*/shim.pid"):
        try:
            proc = psutil.Process(int(json.loads(pid_file.read_text())["pid"]))
            if SHIM_MARK in " ".join(proc.cmdline()) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, ValueError, OSError):
            continue
    return found


def measure_shims(client: Any, home: Path, n: int) -> dict[str, Any]:
    ids = [client.submit(spec(30)).id for _ in range(n)]
    states = wait_states(client, ids, {"RUNNING"}, timeout=60)
    running = sum(1 for s in states.values() if s == "RUNNING")
    time.sleep(1.0)  # let every shim reach its steady state (pump loop, first /proc scans)
    rss, uss, pss, cpu = [], [], [], []
    for proc in shims_of(home):
        try:
            rss.append(proc.memory_info().rss)
            try:
                full = proc.memory_full_info()
                uss.append(full.uss)
                pss.append(getattr(full, "pss", 0))
            except (psutil.AccessDenied, AttributeError):
                pass
            cpu.append(proc.cpu_times().user + proc.cpu_times().system)
        except psutil.Error:
            continue
    # Steady-state CPU of the idle shims (they sleep in select() until output or a signal): sample over 2 s.
    procs = shims_of(home)
    before = {}
    for p in procs:
        try:
            t = p.cpu_times()
            before[p.pid] = t.user + t.system
        except psutil.Error:
            pass
    t0 = time.monotonic()
    time.sleep(2.0)
    elapsed = time.monotonic() - t0
    used = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            used += t.user + t.system - before.get(p.pid, t.user + t.system)
        except psutil.Error:
            pass
    cancel_all(client, ids)
    return {
        "jobs": n,
        "running": running,
        "shims_found": len(rss),
        "rss": summary([r / MB for r in rss]),
        "uss": summary([u / MB for u in uss]),
        "pss": summary([p / MB for p in pss]),
        "idle_cpu_percent_all_shims": 100 * used / elapsed if elapsed else None,
        "idle_cpu_percent_per_shim": (100 * used / elapsed / len(procs)) if procs and elapsed else None,
    }


def kill_leftover_shims(home: Path) -> int:
    """Shims outlive the server by design; kill the ones this run started (and their sessions)."""
    killed = 0
    for proc in shims_of(home):
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the shim leads its own session/process group
            killed += 1
        except OSError:
            pass
    return killed


# -- report -------------------------------------------------------------------------------------------


def row(metric: str, value: float, baseline: float | None, target: str, ok: bool | None, unit: str = "ms") -> dict:
    return {
        "metric": metric,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "ratio": (value / baseline) if baseline else None,
        "target": target,
        "pass": ok,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=50, help="jobs per latency variant and baseline spawns")
    parser.add_argument("--rss-jobs", type=int, default=20, help="concurrent jobs for the shim RSS measurement")
    parser.add_argument("--reconcile-interval", default="0.5", help="KILN_RECONCILE_INTERVAL (default: 0.5)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["isolated", "burst", "rss"])
    parser.add_argument(
        "--network", default="isolated", choices=["isolated", "none"], help="the jobs' network (default: isolated)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parse_args(parser, {"jobs": 3, "rss_jobs": 2})
    NETWORK[0] = args.network
    n = args.jobs
    started = time.monotonic()
    results: dict[str, Any] = {
        "python": PY,
        "jobs": n,
        "cpus_on_machine": os.cpu_count(),
        "reconcile_interval": float(args.reconcile_interval),
        "network": args.network,
    }

    print(f"baseline: {n} x `{PY} -c pass` (after 3 warm-ups)")
    base = summary(spawn_baseline(n))
    results["baseline"] = base
    print(f"  p50 {ms(base['p50'])}  p99 {ms(base['p99'])}  min {ms(base['min'])}  max {ms(base['max'])}")

    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        home = Path(tmp) / "home"
        server = KilnServer(home, cpus="64", reconcile_interval=args.reconcile_interval)
        t0 = time.monotonic()
        server.start()
        results["server_start_s"] = time.monotonic() - t0
        print(f"\nkiln server up in {results['server_start_s']:.1f}s at {server.url} (home {home})")
        assert server.proc is not None
        cpu = ServerCpu(server.proc.pid)
        all_ids: list[str] = []
        client = server.client()
        try:
            wait_running(client, client.submit(spec(1)).id)  # warm-up: first request, placement, shim
            for variant, runner in (("isolated", run_isolated), ("burst", run_burst)):
                if variant in args.skip:
                    continue
                print(
                    f"\n{variant}: {n} jobs `sleep 5`"
                    + (
                        ", each submitted once the previous is RUNNING"
                        if variant == "isolated"
                        else ", submitted back to back"
                    )
                )
                t0 = time.monotonic()
                cpu_before = cpu.snapshot()
                lat, timelines, ids = runner(client, home, n)
                cpu_per_job = ServerCpu.per_job(cpu_before, cpu.snapshot(), n)
                all_ids += ids
                s = summary(lat)
                stages = stage_stats(timelines)
                results[variant] = {
                    "latency": s,
                    "stages": stages,
                    "wall_s": time.monotonic() - t0,
                    "not_running": n - len(lat),
                    "cpu_per_job_s": cpu_per_job,
                }
                print(
                    f"  submit→RUNNING p50 {ms(s.get('p50'))}  p99 {ms(s.get('p99'))}  "
                    f"min {ms(s.get('min'))}  max {ms(s.get('max'))}  ({len(lat)}/{n} reached RUNNING)"
                )
                print("  " + describe(cpu_per_job) + " (submit → RUNNING: the start, not the run)")
                print_stages(variant, stages)
                cancel_all(client, ids)
            if "rss" not in args.skip:
                print(f"\nshim memory: {args.rss_jobs} jobs `sleep 30` RUNNING at once")
                shim = measure_shims(client, home, args.rss_jobs)
                results["shim"] = shim
                for key in ("rss", "uss", "pss"):
                    s = shim[key]
                    if s.get("n"):
                        print(f"  {key.upper()}: mean {s['mean']:.1f} MB  max {s['max']:.1f} MB  (n={s['n']})")
                if shim["idle_cpu_percent_per_shim"] is not None:
                    print(
                        f"  idle CPU of the sleeping jobs' shims: {shim['idle_cpu_percent_all_shims']:.1f}% "
                        f"in all, {shim['idle_cpu_percent_per_shim']:.2f}% each"
                    )
        finally:
            try:
                open_ids = [j.id for j in client.list_jobs(limit=500) if str(j.state) not in TERMINAL]
                cancel_all(client, open_ids, timeout=15)
            except Exception as exc:  # clean-up must go on
                print(f"clean-up: cancelling failed: {exc}", file=sys.stderr)
            client.close()
            server.stop()
            cpu.close()
            leftovers = kill_leftover_shims(home)
            if leftovers:
                print(f"clean-up: killed {leftovers} left-over shim(s)", file=sys.stderr)

    rows = []
    for variant, note in (("isolated", "isolated"), ("burst", "burst")):
        if variant not in results:
            continue
        s = results[variant]["latency"]
        if not s.get("n"):
            continue
        targeted = variant == "isolated"
        rows.append(
            row(
                f"submit→RUNNING p50 ({note})",
                s["p50"],
                base["p50"],
                "≤ 2x" if targeted else "(info)",
                s["p50"] <= 2 * base["p50"] if targeted else None,
            )
        )
        rows.append(
            row(
                f"submit→RUNNING p99 ({note})",
                s["p99"],
                base["p99"],
                "≤ 3x" if targeted else "(info)",
                s["p99"] <= 3 * base["p99"] if targeted else None,
            )
        )
        rows.append(row(f"submit→RUNNING min ({note})", s["min"], base["min"], "(info)", None))
        rows.append(row(f"submit→RUNNING max ({note})", s["max"], base["max"], "(info)", None))
        for key, label in (("platform", "platform"), ("tree", "server+launcher")):
            used = results[variant]["cpu_per_job_s"].get(key)
            if used is not None:
                rows.append(row(f"start CPU per job, {label} ({note})", used, None, "(info)", None))
    if "shim" in results and results["shim"]["rss"].get("n"):
        sh = results["shim"]
        rows.append(row("shim RSS mean", sh["rss"]["mean"], None, "(info)", None, "MB"))
        rows.append(row("shim RSS max", sh["rss"]["max"], None, "≤ 30 MB", sh["rss"]["max"] <= 30, "MB"))
        if sh["uss"].get("n"):
            rows.append(row("shim USS mean", sh["uss"]["mean"], None, "(info)", None, "MB"))
        if sh["pss"].get("n"):
            rows.append(row("shim PSS mean", sh["pss"]["mean"], None, "(info)", None, "MB"))
    print_table(rows, metric_width=44)
    print(
        "targets apply to the isolated variant (each job submitted after the previous is RUNNING); the burst "
        "variant shows behaviour under load.\nbaseline = wall time of `python -c pass`, spawn to exit, same run. "
        f"p99 of {n} samples is nearest-rank (the maximum when n < 100)."
    )
    finish(results, rows, started, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

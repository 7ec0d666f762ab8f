"""Metrics through the real path, and what instrumentation costs a training job.

    .venv/bin/python benchmarks/metrics_ingest.py [--steps 30000] [--train-steps 1500] [--trials 3] [--json PATH]

``sdk``       a real ``kiln server`` (SQLite in its home) runs a job that calls ``kiln.log`` with 10 metrics per step
              for N steps as fast as it can: SDK → spool file → the server's ingester → the store. Points/s = points
              / (time the last point is queryable - the job's command start).
``log``       the same through log extraction: the job prints ``step=… m0=… … m9=…`` lines; the shim recognises
              them and spools them (no code change in the job).
``mlflow``    MLflow's ``log-batch`` through the same server: ``--senders`` clients (as several jobs or laptops logging
              at once) post ``--steps`` x 10 points as log-batch requests of 1,000 metrics (MLflow's cap), bodies
              encoded up front (what MLflow's client costs is its own), with an access key as basic auth.
              Points/s = points / (last point queryable - first request sent).
``raw``       the baseline, same run and same database file: ``executemany`` of as many rows into the metric
              points table through sqlite3, in one transaction (what the store could do at best).
              Target: real path ≥ 50,000 points/s on SQLite and ≥ 0.6x raw (sdk, log and mlflow).
``training``  a small PyTorch MLP (256→1024→10, batch 512, the `pytorch` runtime, 1 thread; a few ms a step) trained
              for S steps, printing ``step=… loss=…``
              and calling ``kiln.log`` every step: under Kiln with every collector on (log extraction, SDK,
              TensorBoard dir watched, system samples every second) against the same script run bare with the same
              interpreter; steps/s measured by the script itself, trials interleaved, medians compared.
              Target ≥ 0.99x. Needs the pytorch runtime (built on first use, a few minutes; tests share it).

Nothing is asserted; the machine is shared and noisy, run it two or three times.
"""

from __future__ import annotations

import argparse
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from report import finish, parse_args, print_table  # noqa: E402

PY = sys.executable

SDK_JOB = """
import kiln, sys
steps = int(sys.argv[1])
for step in range(steps):
    kiln.log({f"m{k}": step * 0.001 + k for k in range(10)}, step=step)
kiln.flush()
"""

LOG_JOB = """
import sys
steps = int(sys.argv[1])
out = sys.stdout
for step in range(steps):
    out.write("step=%d " % step + " ".join("m%d=%.4f" % (k, step * 0.001 + k) for k in range(10)) + "\\n")
"""

TRAIN = """
import os, sys, time
import torch
try:
    import kiln
    log = kiln.log
except ImportError:
    log = None
torch.set_num_threads(1)
torch.manual_seed(0)
steps = int(sys.argv[1])
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(512, 256), torch.randint(0, 10, (512,))
loss_fn = torch.nn.CrossEntropyLoss()
for _ in range(50):  # warm-up, not timed
    opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
t0 = time.perf_counter()
for step in range(steps):
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    value = loss.item()
    print(f"step={step} loss={value:.5f}", flush=True)
    if log is not None:
        log({"loss": value}, step=step)
elapsed = time.perf_counter() - t0
print(f"THROUGHPUT {steps / elapsed:.3f}", flush=True)
"""


def _row(metric: str, value: float, baseline: float | None, target: str, ok: bool | None, unit: str) -> dict:
    ratio = value / baseline if baseline else None
    return {
        "metric": metric,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "ratio": ratio,
        "target": target,
        "pass": ok,
    }


def _total_points(client: Any, job_id: str) -> int:
    return sum(s.count for s in client.metrics_summary(job_id))


def _running_at(server: Any, job_id: str) -> float:
    import json

    status = json.loads((server.home / "jobs" / job_id / "attempts" / "1" / "status.json").read_text())
    return float(status["running_at"])


def real_path(server: Any, client: Any, script: str, steps: int, label: str) -> dict[str, float]:
    expected = steps * 10
    job = client.submit({"command": [PY, "-c", script, str(steps)], "runtime": {"python": PY}, "name": label})
    deadline = time.monotonic() + 600
    while _total_points(client, job.id) < expected:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{label}: only {_total_points(client, job.id)} of {expected} points after 600 s")
        time.sleep(0.05)  # the time it became queryable is known to within this
    done = time.time()
    start = _running_at(server, job.id)
    rate = expected / (done - start)
    print(
        f"{label:8s} {expected} points queryable {done - start:6.2f} s after the command started: {rate:9.0f} points/s"
    )
    return {"points": expected, "seconds": done - start, "points_per_s": rate}


def mlflow_path(server: Any, steps: int, senders: int) -> dict[str, float]:
    """``steps`` x 10 points through MLflow's log-batch route, ``senders`` clients at once."""
    import json
    import threading

    import httpx

    creds = server.credentials()
    auth = (creds["KILN_ACCESS_KEY"], creds["KILN_SECRET_KEY"])
    base = f"{server.url}/mlflow/api/2.0/mlflow"
    with httpx.Client(auth=auth, timeout=60) as http:
        experiment = http.post(f"{base}/experiments/create", json={"name": f"bench-{time.time_ns()}"})
        experiment.raise_for_status()
        made = http.post(f"{base}/runs/create", json={"experiment_id": experiment.json()["experiment_id"]})
        made.raise_for_status()
    run = made.json()["run"]["info"]["run_id"]
    now = int(time.time() * 1000)
    per = 100  # steps of 10 metrics a request: 1,000 metrics, MLflow's cap
    bodies = [
        json.dumps(
            {
                "run_id": run,
                "metrics": [
                    {"key": f"m{k}", "value": step * 0.001 + k, "timestamp": now + step, "step": step}
                    for step in range(first, min(first + per, steps))
                    for k in range(10)
                ],
            }
        ).encode()
        for first in range(0, steps, per)
    ]
    failures: list[str] = []

    def send(part: list[bytes]) -> None:
        with httpx.Client(auth=auth, timeout=60) as http:
            for body in part:
                answer = http.post(f"{base}/runs/log-batch", content=body, headers={"content-type": "application/json"})
                if answer.status_code != 200:
                    failures.append(f"{answer.status_code} {answer.text[:200]}")
                    return

    threads = [threading.Thread(target=send, args=(bodies[i::senders],)) for i in range(senders)]
    expected = steps * 10
    started = time.time()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError(f"log-batch failed: {failures[0]}")
    done = time.time()  # each answer came after its points were committed: they are queryable now
    with httpx.Client(auth=auth, timeout=60) as http:
        for key in ("m0", "m9"):
            history = http.get(
                f"{base}/metrics/get-history", params={"run_id": run, "metric_key": key, "max_results": 100_000}
            )
            history.raise_for_status()
            if len(history.json().get("metrics", [])) != steps:
                raise RuntimeError(f"{key}: {len(history.json().get('metrics', []))} points stored of {steps}")
    rate = expected / (done - started)
    print(f"mlflow   {expected} points queryable {done - started:6.2f} s after the first request: {rate:9.0f} points/s")
    return {"points": expected, "seconds": done - started, "points_per_s": rate, "senders": senders}


def raw_executemany(db_path: Path, n: int) -> dict[str, float]:
    conn = sqlite3.connect(db_path, timeout=30)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        series = conn.execute("SELECT max(id) FROM metric_series").fetchone()[0] or 0
        job = conn.execute("SELECT job_id FROM metric_series LIMIT 1").fetchone()[0]
        cols = [r[1] for r in conn.execute("PRAGMA table_info(metric_points)")]
        conn.execute(
            "INSERT INTO metric_series (id, job_id, worker, name, kind, source, axis, count, created_at) "
            "VALUES (?, ?, 'bench', 'raw', 'scalar', 'sdk', 'step', 0, '2026-01-01 00:00:00')",
            (series + 1, job),
        )
        conn.commit()
        now = time.time()
        rows = [(series + 1, i, i, now, float(i), None) for i in range(n)]
        sql = f"INSERT INTO metric_points ({', '.join(cols[:6])}) VALUES (?, ?, ?, ?, ?, ?)"
        t0 = time.perf_counter()
        with conn:
            conn.executemany(sql, rows)
        elapsed = time.perf_counter() - t0
    finally:
        conn.close()
    rate = n / elapsed
    print(f"raw      {n} rows executemany'd in {elapsed:6.2f} s: {rate:9.0f} rows/s ({', '.join(cols[:6])})")
    return {"rows": n, "seconds": elapsed, "rows_per_s": rate}


def training(server: Any, client: Any, steps: int, trials: int) -> dict[str, Any]:
    from tests.kilnserver import TEST_RUNTIMES

    client.install_runtime("pytorch")
    deadline = time.monotonic() + 900
    while {r.name: r.status for r in client.runtimes()}.get("pytorch-2.13") != "installed":
        if time.monotonic() > deadline:
            raise RuntimeError("the pytorch runtime did not install in 15 minutes")
        time.sleep(2)
    python = TEST_RUNTIMES / "pytorch-2.13" / "bin" / "python"
    bare_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "PYTHONPATH": str(server.home / "pylib"),  # the same `import kiln` a job gets (a no-op outside Kiln)
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    bare, kiln = [], []
    # The script goes inline: a job sees nothing of $KILN_HOME (the sandbox), where it was once written.
    spec = {
        "command": ["python", "-c", TRAIN, str(steps)],
        "runtime": {"framework": "pytorch"},
        "resources": {"cpus": 1},
        "metrics": {"builtin": True, "tensorboard": True, "system": True, "system_interval": 1.0},
    }
    for trial in range(trials):
        out = subprocess.run(
            [str(python), "-c", TRAIN, str(steps)], env=bare_env, capture_output=True, text=True, check=True
        ).stdout
        bare.append(float(re.findall(r"THROUGHPUT ([0-9.]+)", out)[-1]))
        job = client.submit(spec)
        done = client.wait(job.id, timeout=600)
        if done.state != "SUCCEEDED":
            raise RuntimeError(f"training job {job.id} {done.state}: {done.message}")
        text = "\n".join(line.text for line in client.stream_logs(job.id, follow=False))
        kiln.append(float(re.findall(r"THROUGHPUT ([0-9.]+)", text)[-1]))
        points = _total_points(client, job.id)
        print(
            f"training trial {trial + 1}: bare {bare[-1]:7.1f} steps/s, under Kiln {kiln[-1]:7.1f} steps/s "
            f"({points} points stored so far)"
        )
    return {"bare_steps_per_s": bare, "kiln_steps_per_s": kiln}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30_000, help="steps of 10 metrics per ingestion job")
    parser.add_argument("--train-steps", type=int, default=1000)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--senders", type=int, default=4, help="clients posting MLflow log-batch requests at once")
    parser.add_argument("--skip", nargs="*", default=[], choices=["sdk", "log", "mlflow", "raw", "training"])
    parser.add_argument("--json", type=Path)
    args = parse_args(parser, {"steps": 200, "train_steps": 20, "trials": 1})
    from tests.kilnserver import KilnServer

    started = time.monotonic()
    results: dict[str, Any] = {"python": PY, "cpus_on_machine": os.cpu_count()}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kiln-bench-metrics-") as tmp:
        server = KilnServer(Path(tmp) / "home", cpus="2", rate_limit_per_second="0").start()  # bulk log-batch
        try:
            client = server.client()
            for name, script in (("sdk", SDK_JOB), ("log", LOG_JOB)):
                if name not in args.skip:
                    results[name] = real_path(server, client, script, args.steps, name)
            if "mlflow" not in args.skip:
                results["mlflow"] = mlflow_path(server, args.steps, args.senders)
            if "raw" not in args.skip and any(k in results for k in ("sdk", "log", "mlflow")):
                results["raw"] = raw_executemany(server.home / "kiln.db", args.steps * 10)
                raw = results["raw"]["rows_per_s"]
                for name in ("sdk", "log", "mlflow"):
                    if name in results:
                        rate = results[name]["points_per_s"]
                        ok = rate >= 50_000 and rate >= 0.6 * raw
                        what = "MLflow log-batch" if name == "mlflow" else name
                        rows.append(_row(f"ingestion via {what}, SQLite", rate, raw, "≥ 50,000/s, ≥ 0.6x", ok, "/s"))
            if "training" not in args.skip:
                t = training(server, client, args.train_steps, args.trials)
                results["training"] = t
                bare, kiln = statistics.median(t["bare_steps_per_s"]), statistics.median(t["kiln_steps_per_s"])
                rows.append(
                    _row("training steps/s under Kiln (median)", kiln, bare, "≥ 0.99x", kiln >= 0.99 * bare, "/s")
                )
        finally:
            server.stop()
    print_table(rows, metric_width=40, digits={"/s": 0})
    print(
        "baseline: raw = sqlite3 executemany of as many rows into metric_points, same database, same run; "
        "training = the same script run bare with the same interpreter, trials interleaved."
    )
    finish(results, rows, started, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

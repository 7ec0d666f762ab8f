"""Experiment tracking: the same logging and search workload through MLflow's own client, against Kiln (``<endpoint>/
mlflow``) and against MLflow's tracking server (``mlflow server``, SQLite backend, from PyPI), in the same run.

    .venv/bin/python benchmarks/tracking.py [--points 100000] [--params 50] [--runs 1000] [--searches 20] [--json PATH]

1. logging  one run with ``--params`` params and ``--points`` metric points sent with ``log_batch`` (1,000 metrics a
            call, MLflow's limit); points per second, client to committed. Target: Kiln >= 3x MLflow's rate.
2. search   ``--runs`` runs, each with params (lr, batch, seed) and two metrics, then ``search_runs`` over all of
            them with a params filter (``params.batch = '64'``) and an order-by on a metric, ``--searches`` times;
            p50 latency. Target: Kiln <= 0.5x MLflow's.

MLflow's server runs from a virtualenv of its own (``.cache/mlflow-server``, made with ``pip install mlflow`` the
first time, as the test runtimes are), one worker, on this machine; Kiln is a ``kiln server`` (rate limit off) with
its SQLite database. Both are started and stopped here; the client is the same ``mlflow-skinny`` in-process.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from report import finish, parse_args, print_table, summary  # noqa: E402

MLFLOW_ENV = REPO / ".cache" / "mlflow-server"
MLFLOW_REQUIREMENT = "mlflow>=3.17,<4"
BATCH = 1000  # metrics per log_batch: MLflow's limit


def mlflow_server_bin() -> Path:
    """MLflow's ``mlflow`` command in its own virtualenv, made the first time (a few minutes, ~0.9 GB)."""
    binary = MLFLOW_ENV / "bin" / "mlflow"
    if binary.exists():
        return binary
    print(f"making {MLFLOW_ENV} with {MLFLOW_REQUIREMENT} (once)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(MLFLOW_ENV)], check=True)
    python = str(MLFLOW_ENV / "bin" / "python")
    uv = Path(sys.prefix) / "bin" / "uv"  # make's installer: a sixth of pip's CPU time for the same versions
    install = [str(uv), "pip", "install", "--python", python] if uv.exists() else [python, "-m", "pip", "install"]
    subprocess.run([*install, "-q", MLFLOW_REQUIREMENT], check=True)
    return binary


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_mlflow(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    log = open(tmp / "mlflow-server.log", "wb")  # noqa: SIM115 - the server's, closed at exit
    proc = subprocess.Popen(
        [
            str(mlflow_server_bin()),
            "server",
            "--backend-store-uri",
            f"sqlite:///{tmp / 'mlflow.db'}",
            "--artifacts-destination",
            str(tmp / "mlflow-artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return proc, url
        except OSError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"mlflow server did not start: {(tmp / 'mlflow-server.log').read_text()[-2000:]}")


def workload(uri: str, args: argparse.Namespace) -> dict[str, Any]:
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.create_experiment(f"bench-{time.time_ns()}")
    run = client.create_run(experiment).info.run_id
    params = [Param(f"p{i}", str(i / 7)) for i in range(args.params)]
    now = int(time.time() * 1000)
    points = [Metric("loss", 1.0 / (i + 1), now + i, i) for i in range(args.points)]
    started = time.perf_counter()
    client.log_batch(run, params=params)
    for i in range(0, len(points), BATCH):
        client.log_batch(run, metrics=points[i : i + BATCH])
    logging_s = time.perf_counter() - started
    assert len(client.get_metric_history(run, "loss")) == args.points

    searched = client.create_experiment(f"search-{time.time_ns()}")
    for i in range(args.runs):
        made = client.create_run(searched).info.run_id
        client.log_batch(
            made,
            params=[Param("lr", str(10 ** -(i % 4))), Param("batch", str(32 * (1 + i % 3))), Param("seed", str(i))],
            metrics=[Metric("val_acc", (i * 7919 % 1000) / 1000, now, 0), Metric("loss", i / args.runs, now, 0)],
        )
    expected = sum(1 for i in range(args.runs) if 32 * (1 + i % 3) == 64)
    latencies = []
    for _ in range(args.searches):
        t0 = time.perf_counter()
        found = client.search_runs(
            [searched], "params.batch = '64'", order_by=["metrics.val_acc DESC"], max_results=args.runs
        )
        latencies.append(time.perf_counter() - t0)
        assert len(found) == expected, (len(found), expected)
    return {"points_per_s": args.points / logging_s, "logging_s": logging_s, "search": summary(latencies)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=100_000, help="metric points logged to one run")
    parser.add_argument("--params", type=int, default=50, help="params of that run")
    parser.add_argument("--runs", type=int, default=1000, help="runs searched over")
    parser.add_argument("--searches", type=int, default=20, help="timed searches")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parse_args(parser, {"points": 2000, "params": 5, "runs": 30, "searches": 3})
    started = time.monotonic()
    from tests.kilnserver import KilnServer

    results: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if k != "json"}}
    with tempfile.TemporaryDirectory(prefix="kiln-bench-tracking-") as tmp_dir:
        tmp = Path(tmp_dir)
        mlflow_proc, mlflow_url = start_mlflow(tmp)
        kiln = KilnServer(tmp / "home", rate_limit_per_second="0").start()
        try:
            creds = kiln.credentials()
            os.environ.update(
                MLFLOW_TRACKING_USERNAME=creds["KILN_ACCESS_KEY"],  # MLflow's server ignores them
                MLFLOW_TRACKING_PASSWORD=creds["KILN_SECRET_KEY"],
                MLFLOW_HTTP_REQUEST_MAX_RETRIES="0",
            )
            results["mlflow"] = workload(mlflow_url, args)
            results["kiln"] = workload(f"{kiln.url}/mlflow", args)
        finally:
            kiln.stop()
            mlflow_proc.terminate()
            mlflow_proc.wait(timeout=30)
    ours, theirs = results["kiln"], results["mlflow"]
    rate_ratio = ours["points_per_s"] / theirs["points_per_s"]
    search_ratio = ours["search"]["p50"] / theirs["search"]["p50"]
    rows = [
        {
            "metric": f"log_batch: {args.points} points + {args.params} params",
            "value": ours["points_per_s"],
            "baseline": theirs["points_per_s"],
            "ratio": rate_ratio,
            "target": ">= 3x mlflow",
            "pass": rate_ratio >= 3.0,
            "unit": "pts/s",
        },
        {
            "metric": f"search_runs over {args.runs} runs, p50",
            "value": ours["search"]["p50"],
            "baseline": theirs["search"]["p50"],
            "ratio": search_ratio,
            "target": "<= 0.5x mlflow",
            "pass": search_ratio <= 0.5,
            "unit": "ms",
        },
    ]
    print_table(rows, digits={"pts/s": 0, "ms": 1})
    finish(results, rows, started, args.json)


if __name__ == "__main__":
    main()

"""Kiln on Slurm against Slurm itself: submit latency and a burst, on the two-node test cluster
(tests/slurm_cluster.py).

    .venv/bin/python benchmarks/slurm_submit.py [--samples 10] [--jobs 50] [--threads 8] [--slurm-conf PATH]

It starts the cluster (as root: namespaces and a bridge; or uses the running one whose slurm.conf ``--slurm-conf``
names, e.g. ``make slurm-up``'s) and a Kiln server with ``KILN_BACKEND=slurm`` on the cluster's bridge
(``tests.kilnserver.SlurmServer``, ``KILN_RECONCILE_INTERVAL=0.5`` as in production).

1. latency   baseline: ``sbatch`` of a script whose first line is ``echo first``, timed from the call to that line in
             its output file; Kiln: ``client.submit`` of a job ``python -c "print('first')"`` timed to the job's state
             RUNNING (polled every 20 ms). Samples interleaved, each waiting for the previous job to end. Target: p50
             ratio Kiln / sbatch <= 1.5x.
2. burst     baseline: N scripts running ``python3 -c pass`` through ``sbatch`` one after the other, timed from the
             first call until squeue shows all of them ended; Kiln: the same N jobs (1 CPU each, as sbatch's
             default) submitted through the SDK from T threads, timed until all have ended. Rate = N / elapsed.
             Target: Kiln's rate >= 0.8x sbatch's.

The machine is shared and noisy: figures are ratios against a baseline of the same run, nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from report import finish, parse_args, print_table, summary  # noqa: E402
from tests.kilnserver import SlurmServer  # noqa: E402
from tests.slurm_cluster import SlurmCluster, running_cluster  # noqa: E402

ENDED = ("SUCCEEDED", "FAILED", "CANCELLED")
SLURM_ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL")


@contextlib.contextmanager
def cluster_for(conf: Path | None) -> Iterator[SlurmCluster]:
    if conf is None:
        with running_cluster() as started:
            yield started
        return
    existing = SlurmCluster(conf.parent.parent)  # a cluster's root holds etc/slurm.conf
    existing.running = False  # not ours to stop
    yield existing


def raw_latency(cluster: SlurmCluster, out: Path, n: int) -> float:
    path = out / f"raw-{n}.txt"
    script = "#!/bin/bash\necho first\n"
    started = time.monotonic()
    cluster.sbatch(script, f"--output={path}", f"--job-name=bench-raw-{n}")
    while not (path.exists() and path.read_text().startswith("first")):
        time.sleep(0.005)
    return time.monotonic() - started


def kiln_latency(client: Any) -> tuple[float, str]:
    started = time.monotonic()
    job = client.submit({"command": ["python", "-c", "print('first')"], "resources": {"cpus": 1}})
    while (state := client.get_job(job.id).state) not in ("RUNNING", *ENDED):
        time.sleep(0.02)
    elapsed = time.monotonic() - started
    assert state == "RUNNING" or state == "SUCCEEDED", state
    return elapsed, job.id


def wait_ended(client: Any, job_ids: list[str], timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    pending = set(job_ids)
    while pending:
        pending = {j for j in pending if client.get_job(j).state not in ENDED}
        if time.monotonic() > deadline:
            raise SystemExit(f"{len(pending)} Kiln jobs did not end in {timeout}s")
        time.sleep(0.1)


def section_latency(args: argparse.Namespace, cluster: SlurmCluster, client: Any, out: Path, rows: list) -> dict:
    raw, kiln = [], []
    for n in range(args.samples):
        raw.append(raw_latency(cluster, out, n))
        took, job_id = kiln_latency(client)
        kiln.append(took)
        wait_ended(client, [job_id])
    raw_s, kiln_s = summary(raw), summary(kiln)
    ratio = kiln_s["p50"] / raw_s["p50"]
    rows.append(
        {"metric": "submit→RUNNING p50 (Kiln) vs sbatch→first line", "value": kiln_s["p50"], "baseline": raw_s["p50"],
         "ratio": ratio, "target": "<= 1.5x", "pass": ratio <= 1.5, "unit": "ms"}
    )  # fmt: skip
    return {"sbatch_first_line": raw_s, "kiln_running": kiln_s}


def raw_burst(cluster: SlurmCluster, out: Path, jobs: int) -> float:
    script = "#!/bin/bash\npython3 -c pass\n"
    started = time.monotonic()
    ids = [cluster.sbatch(script, f"--output={out}/burst-%j.txt", "--job-name=bench-burst") for _ in range(jobs)]
    wanted = set(ids)
    while True:
        done = cluster.run("squeue", "-h", "--states=all", "-O", "JobID:|,State:|", "--name=bench-burst")
        states = dict(tuple(p.strip() for p in line.split("|")[:2]) for line in done.stdout.splitlines())
        if all(states.get(i) in SLURM_ENDED for i in wanted):
            return time.monotonic() - started
        time.sleep(0.05)


def kiln_burst(client: Any, jobs: int, threads: int) -> float:
    spec = {"command": ["python", "-c", "pass"], "resources": {"cpus": 1}}
    started = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        ids = [job.id for job in pool.map(lambda _: client.submit(spec), range(jobs))]
    wait_ended(client, ids)
    elapsed = time.monotonic() - started
    failed = [j for j in ids if client.get_job(j).state != "SUCCEEDED"]
    if failed:
        raise SystemExit(f"{len(failed)} of the burst's Kiln jobs did not succeed, e.g. {failed[0]}")
    return elapsed


def section_burst(args: argparse.Namespace, cluster: SlurmCluster, client: Any, out: Path, rows: list) -> dict:
    raw = raw_burst(cluster, out, args.jobs)
    kiln = kiln_burst(client, args.jobs, args.threads)
    raw_rate, kiln_rate = args.jobs / raw, args.jobs / kiln
    ratio = kiln_rate / raw_rate
    rows.append(
        {"metric": f"burst of {args.jobs}: Kiln jobs/s vs sbatch jobs/s", "value": kiln_rate, "baseline": raw_rate,
         "ratio": ratio, "target": ">= 0.8x", "pass": ratio >= 0.8, "unit": "jobs/s"}
    )  # fmt: skip
    return {"sbatch_seconds": raw, "kiln_seconds": kiln, "sbatch_rate": raw_rate, "kiln_rate": kiln_rate}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=10, help="latency samples of each (default: 10)")
    parser.add_argument("--jobs", type=int, default=50, help="jobs in each burst (default: 50)")
    parser.add_argument("--threads", type=int, default=8, help="SDK threads submitting Kiln's burst")
    parser.add_argument("--slurm-conf", type=Path, help="use the running test cluster of this slurm.conf")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parse_args(parser, {"samples": 2, "jobs": 4, "threads": 2})
    started = time.monotonic()
    results: dict[str, Any] = {"samples": args.samples, "jobs": args.jobs, "threads": args.threads}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kiln-slurm-bench-") as tmp, cluster_for(args.slurm_conf) as cluster:
        root = Path(tmp)
        server = SlurmServer(root / "home", cluster, reconcile_interval="0.5").start()
        try:
            client = server.client()
            results["latency"] = section_latency(args, cluster, client, root, rows)
            results["burst"] = section_burst(args, cluster, client, root, rows)
        finally:
            server.stop()
    print_table(rows, metric_width=50, digits={"ms": 0, "jobs/s": 2})
    print("latency baseline = raw sbatch to the script's first output line; burst baseline = raw sbatch's rate.")
    finish(results, rows, started, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

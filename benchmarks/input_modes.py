"""A job reading a dataset from an S3-compatible store: staged (cold and warm cache) and mounted, against a
plain boto3 process reading the same objects from the same store.

    .venv/bin/python benchmarks/input_modes.py [--mb 500] [--files 20] [--runs 3] [--json PATH]

One moto S3 server in its own process, one fresh ``kiln server`` storing into ``s3://<bucket>/kiln`` on it, one
dataset of ``--files`` files of random bytes (``--mb`` in all). Each run, interleaved:

- ``boto3``        a Python process that imports boto3 and reads every object of the dataset (``get_object``,
                   streamed), hashing what it reads: what a script does without Kiln;
- ``stage cold``   a job with ``inputs: [{dataset: bench}]`` on an empty data cache: the shim downloads every blob
                   (verifying its SHA-256) before the command starts, then the command reads the files;
- ``stage warm``   the same job again: every blob is in the machine's cache, nothing is downloaded;
- ``mount``        ``mode: mount``: the shim mounts the store (rclone) and the command reads through FUSE.

The job's command reads and hashes every file as the boto3 process does, and prints when it started and ended.
Reported per mode (best of ``--runs``): from submit until the command starts, the command's reading, and from
submit until the data is read, against the boto3 process's wall time (ratio = boto3 / Kiln: above 1, the job
had its data sooner). No target: the issue sets none for this; it shows what each mode costs where. The machine
is shared and noisy; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from report import finish, parse_args, print_table  # noqa: E402
from s3bench import MB, kiln_on_s3, random_file  # noqa: E402
from tests.kilnserver import KilnServer  # noqa: E402
from tests.s3server import ACCESS_KEY, REGION, SECRET_KEY, S3Server  # noqa: E402

from kiln.sdk.client import Client  # noqa: E402

READER = """
import hashlib, json, os, pathlib, time
start = time.time()
total = 0
for path in sorted(pathlib.Path(os.environ["KILN_INPUT_BENCH"]).rglob("*")):
    if path.is_file():
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
                total += len(chunk)
print("READ " + json.dumps({"start": start, "end": time.time(), "bytes": total}), flush=True)
"""

BOTO_READER = """
import hashlib, sys, boto3
endpoint, bucket, prefix = sys.argv[1:]
client = boto3.client("s3", endpoint_url=endpoint)
total = 0
for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
    for item in page.get("Contents", []):
        body = client.get_object(Bucket=bucket, Key=item["Key"])["Body"]
        digest = hashlib.sha256()
        while chunk := body.read(1 << 20):
            digest.update(chunk)
            total += len(chunk)
print(total)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=500, help="Dataset size in MB (10^6 bytes).")
    parser.add_argument("--files", type=int, default=20, help="Files in the dataset.")
    parser.add_argument("--runs", type=int, default=3, help="Runs of each mode (the best one counts).")
    parser.add_argument("--json", type=Path, default=None)
    args = parse_args(parser, {"mb": 1, "files": 2, "runs": 1})
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="kiln-inputs-bench-"))
    try:
        with kiln_on_s3(tmp / "home") as (s3, server, bucket):
            measure(args, tmp, s3, server, bucket, started)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def measure(args: argparse.Namespace, tmp: Path, s3: S3Server, server: KilnServer, bucket: str, started: float) -> None:
    creds = server.credentials()
    client = Client(server.url, creds["KILN_ACCESS_KEY"], creds["KILN_SECRET_KEY"])
    src = tmp / "bench"
    src.mkdir()
    size = args.mb * MB
    each = size // args.files
    for i in range(args.files):
        random_file(src / f"{i:04d}.bin", each)
    client.put_dataset(src, "bench", state_dir=tmp / "state")
    # The boto3 reader reads the same bytes as plain objects of the same store.
    boto = s3.client()
    for path in sorted(src.iterdir()):
        boto.upload_file(str(path), bucket, f"plain/{path.name}")
    volume = each * args.files
    print(f"dataset: {args.files} files, {volume / MB:.0f} MB of random bytes; moto at {s3.endpoint}")
    cache = server.home / "cache" / "data"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    env["AWS_DEFAULT_REGION"] = REGION

    def boto_process() -> dict[str, float]:
        t = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-c", BOTO_READER, s3.endpoint, bucket, "plain/"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        elapsed = time.monotonic() - t
        assert int(out.stdout) == volume, out.stdout
        return {"start": 0.0, "read": elapsed, "total": elapsed}

    def job(mode: str, cold: bool) -> dict[str, float]:
        if cold:
            shutil.rmtree(cache, ignore_errors=True)
        spec = {
            "command": [sys.executable, "-c", READER],
            "runtime": {"python": sys.executable},
            "inputs": [{"dataset": "bench", "mode": mode}],
        }
        submitted = time.time()
        submitted_job = client.submit(spec)
        done = client.wait(submitted_job.id, timeout=600, poll=0.05)
        lines = [
            ln
            for ln in client.stream_logs(done.id, follow=False)
            if ln.source == "stdout" and ln.text.startswith("READ ")
        ]
        if done.state != "SUCCEEDED" or len(lines) != 1:
            raise SystemExit(f"{mode} job {done.id}: {done.state} {done.message}")
        read = json.loads(lines[0].text.removeprefix("READ "))
        assert read["bytes"] == volume, read
        return {
            "start": read["start"] - submitted,
            "read": read["end"] - read["start"],
            "total": read["end"] - submitted,
        }

    modes = {
        "boto3 process": boto_process,
        "stage cold": lambda: job("stage", cold=True),
        "stage warm": lambda: job("stage", cold=False),
        "mount": lambda: job("mount", cold=False),
    }
    times: dict[str, list[dict[str, float]]] = {name: [] for name in modes}
    for run in range(args.runs):
        order = list(modes) if run % 2 == 0 else ["mount", "boto3 process", "stage cold", "stage warm"]
        for name in order:
            os.sync()
            result = modes[name]()
            times[name].append(result)
            print(
                f"  {name:14s} command starts {result['start']:6.2f}s  reads {result['read']:6.2f}s"
                f"  data read {result['total']:6.2f}s  ({volume / MB / result['total']:6.1f} MB/s)"
            )
    best = {name: min(values, key=lambda r: r["total"]) for name, values in times.items()}
    baseline = best["boto3 process"]["total"]
    rows = []
    for name in ("stage cold", "stage warm", "mount"):
        b = best[name]
        rows.append(
            {
                "metric": f"{name}: submit to data read (s)",
                "value": b["total"],
                "baseline": baseline,
                "ratio": baseline / b["total"],
                "target": "(information)",
                "pass": None,
                "unit": "s",
            }
        )
        for part, label in (("start", "submit to command start"), ("read", "the command's reading")):
            rows.append(
                {
                    "metric": f"  {label} (s)",
                    "value": b[part],
                    "baseline": None,
                    "ratio": None,
                    "target": "(information)",
                    "pass": None,
                    "unit": "s",
                }
            )
    print_table(rows, metric_width=44, digits={"s": 2})
    finish({"mb": args.mb, "files": args.files, "runs": args.runs, "times_s": times}, rows, started, args.json)


if __name__ == "__main__":
    main()

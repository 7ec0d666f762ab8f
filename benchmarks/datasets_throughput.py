"""Dataset upload and download throughput on an S3-compatible store, against boto3 on the same store.

    .venv/bin/python benchmarks/datasets_throughput.py [--mb 500] [--runs 2] [--json PATH]

What it measures (one moto S3 server in its own process, one fresh ``kiln server`` storing into
``s3://<bucket>/kiln`` on it, one file of random bytes):

1. kiln put   ``kiln data put FILE NAME`` as a subprocess (the CLI: hashing, manifest, upload sessions, parts
              straight to the store through presigned URLs, 4 parts in flight, commit). Each run removes the
              dataset first, so every run sends every byte (the store would otherwise already hold the blob).
2. kiln get   ``kiln data get NAME DEST`` as a subprocess (307 to a presigned URL, streamed, SHA-256 verified).
3. boto3      ``upload_file`` / ``download_file`` of the same file to/from the same server, in this process, with
              boto3's defaults (8 MiB parts, 10 threads).

MB/s = file size / wall time, best of ``--runs``; target: Kiln ≥ 0.8x boto3 for both directions. The CLI's
figures include its interpreter start (≈ 0.3 s). The machine is shared and noisy; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from report import finish, print_table  # noqa: E402
from tests.kilnserver import KilnServer  # noqa: E402
from tests.s3server import S3Server  # noqa: E402

MB = 1_000_000


def best(fn: Any, runs: int) -> float:
    times = []
    for _ in range(runs):
        times.append(fn())
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=500, help="File size in MB (10^6 bytes).")
    parser.add_argument("--runs", type=int, default=2, help="Runs of each transfer (the best one counts).")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="kiln-ds-bench-"))
    s3 = S3Server(separate_process=True).start()
    server: KilnServer | None = None
    try:
        bucket = s3.create_bucket("kiln-bench")
        server = KilnServer(tmp / "home", **s3.kiln_settings(bucket)).start()
        creds = server.credentials()
        env = {
            **os.environ,
            "KILN_ENDPOINT": server.url,
            "KILN_ACCESS_KEY": creds["KILN_ACCESS_KEY"],
            "KILN_SECRET_KEY": creds["KILN_SECRET_KEY"],
            "HOME": str(tmp / "client-home"),
        }
        src = tmp / "src" / "blob.bin"
        src.parent.mkdir()
        size = args.mb * MB
        with open(src, "wb") as fh:
            left = size
            while left:
                n = min(left, 16 * 1024 * 1024)
                fh.write(os.urandom(n))
                left -= n
        print(f"file: {size / MB:.0f} MB random bytes; moto at {s3.endpoint}; kiln at {server.url}")

        def cli(*argv: str) -> float:
            t = time.monotonic()
            result = subprocess.run([sys.executable, "-m", "kiln", *argv], env=env, capture_output=True, text=True)
            elapsed = time.monotonic() - t
            if result.returncode != 0:
                raise SystemExit(f"kiln {' '.join(argv)} failed: {result.stderr}")
            return elapsed

        def kiln_put() -> float:
            subprocess.run(
                [sys.executable, "-m", "kiln", "data", "rm", "bench"], env=env, capture_output=True, check=False
            )
            elapsed = cli("data", "put", str(src), "bench")
            print(f"  kiln put  {elapsed:6.2f}s  {size / MB / elapsed:7.1f} MB/s")
            return elapsed

        def kiln_get() -> float:
            dest = tmp / "kiln-out"
            shutil.rmtree(dest, ignore_errors=True)
            elapsed = cli("data", "get", "bench", str(dest))
            assert (dest / "blob.bin").stat().st_size == size
            print(f"  kiln get  {elapsed:6.2f}s  {size / MB / elapsed:7.1f} MB/s")
            return elapsed

        boto = s3.client()

        def boto_put() -> float:
            t = time.monotonic()
            boto.upload_file(str(src), bucket, "boto/blob.bin")
            elapsed = time.monotonic() - t
            print(f"  boto3 put {elapsed:6.2f}s  {size / MB / elapsed:7.1f} MB/s")
            return elapsed

        def boto_get() -> float:
            dest = tmp / "boto-out.bin"
            dest.unlink(missing_ok=True)
            t = time.monotonic()
            boto.download_file(bucket, "boto/blob.bin", str(dest))
            elapsed = time.monotonic() - t
            print(f"  boto3 get {elapsed:6.2f}s  {size / MB / elapsed:7.1f} MB/s")
            return elapsed

        # Interleaved, so that drift of the shared machine hits both sides alike.
        put_k, put_b, get_k, get_b = [], [], [], []
        for _ in range(args.runs):
            put_b.append(boto_put())
            put_k.append(kiln_put())
            get_b.append(boto_get())
            get_k.append(kiln_get())
        rates = {
            "kiln_put": size / MB / min(put_k),
            "boto_put": size / MB / min(put_b),
            "kiln_get": size / MB / min(get_k),
            "boto_get": size / MB / min(get_b),
        }
        rows = []
        for op in ("put", "get"):
            ratio = rates[f"kiln_{op}"] / rates[f"boto_{op}"]
            rows.append(
                {
                    "metric": f"kiln data {op} ({args.mb} MB, CLI subprocess, MB/s)",
                    "value": rates[f"kiln_{op}"],
                    "baseline": rates[f"boto_{op}"],
                    "ratio": ratio,
                    "target": ">= 0.8x boto3",
                    "pass": ratio >= 0.8,
                    "unit": "MB/s",
                }
            )
        print_table(rows, metric_width=52)
        finish(
            {"mb": args.mb, "runs": args.runs, "rates": rates, "times": locals_times(put_k, put_b, get_k, get_b)},
            rows,
            started,
            args.json,
        )
    finally:
        if server is not None:
            server.stop()
        s3.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def locals_times(put_k: list[float], put_b: list[float], get_k: list[float], get_b: list[float]) -> dict[str, Any]:
    return {"kiln_put_s": put_k, "boto_put_s": put_b, "kiln_get_s": get_k, "boto_get_s": get_b}


if __name__ == "__main__":
    main()

"""Dataset upload and download throughput on an S3-compatible store, against boto3 on the same store.

    .venv/bin/python benchmarks/datasets_throughput.py [--mb 500] [--runs 3] [--only put|get]
        [--files 500] [--file-kb 100] [--json PATH]

One moto S3 server in its own process, one fresh ``kiln server`` storing into ``s3://<bucket>/kiln`` on it, one
file of random bytes. Two pairs, each like against like, interleaved run by run:

1. processes  ``kiln data put FILE NAME`` / ``kiln data get NAME DEST`` (the CLI) against a Python process that
              imports boto3 and calls ``upload_file`` / ``download_file``: both pay an interpreter start and
              their imports.
2. in process ``Client.put_dataset`` / ``get_dataset`` (the SDK) against boto3's ``upload_file`` /
              ``download_file`` with a client made once, both in this process.
3. many files a directory of ``--files`` small files (``--file-kb`` each) with the SDK, against boto3's
              ``upload_file`` / ``download_file`` of each file on 10 threads, both in this process.

Kiln's put: hashing (SHA-256 of the file, with each part's MD5 and CRC32 in the same read), manifest, upload
session, parts straight to the store through presigned URLs (8 in flight), completion, commit. Every Kiln put
removes the dataset first (so every byte is sent) and starts with no client state. Kiln's get: a 307 to a
presigned URL, streamed, SHA-256 verified. boto3 runs with its defaults (8 MiB parts, 10 threads; CRC32 part
checksums; no digest of its own checked on the way back).

MB/s = file size / wall time, best of ``--runs``; target: Kiln ≥ 0.8x boto3 in both pairs and directions. Also
shown, for information: the median of the runs' own ratios (each pair's order alternates between runs; written
data is flushed to disk before each transfer), and the CLI against boto3 in this process (the
comparison earlier versions of this benchmark made: it charges the CLI's ≈ 0.3 s start to Kiln alone). The
machine is shared and noisy; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from report import finish, parse_args, print_table  # noqa: E402
from s3bench import MB, kiln_on_s3, random_file  # noqa: E402
from tests.kilnserver import KilnServer  # noqa: E402
from tests.s3server import ACCESS_KEY, REGION, SECRET_KEY, S3Server  # noqa: E402

from kiln.errors import KilnError  # noqa: E402
from kiln.sdk.client import Client  # noqa: E402

# A boto3 transfer as its own process: argv endpoint, upload_file|download_file, bucket, key, local path.
BOTO_SCRIPT = """
import sys, boto3
endpoint, op, bucket, key, path = sys.argv[1:]
client = boto3.client("s3", endpoint_url=endpoint)
if op == "upload_file":
    client.upload_file(path, bucket, key)
else:
    client.download_file(bucket, key, path)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=500, help="File size in MB (10^6 bytes).")
    parser.add_argument("--runs", type=int, default=3, help="Runs of each transfer (the best one counts).")
    parser.add_argument("--only", choices=["put", "get"], default=None, help="Measure one direction only.")
    parser.add_argument("--files", type=int, default=500, help="Small files of the many-files pair (0: skip it).")
    parser.add_argument("--file-kb", type=int, default=100, help="Size of each small file in kB (10^3 bytes).")
    parser.add_argument("--json", type=Path, default=None)
    args = parse_args(parser, {"mb": 1, "runs": 1, "files": 5, "file_kb": 1})
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="kiln-ds-bench-"))
    try:
        with kiln_on_s3(tmp / "home") as (s3, server, bucket):
            measure(args, tmp, s3, server, bucket, started)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def measure(args: argparse.Namespace, tmp: Path, s3: S3Server, server: KilnServer, bucket: str, started: float) -> None:
    creds = server.credentials()
    env = {
        **os.environ,
        "KILN_ENDPOINT": server.url,
        "KILN_ACCESS_KEY": creds["KILN_ACCESS_KEY"],
        "KILN_SECRET_KEY": creds["KILN_SECRET_KEY"],
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": REGION,
    }
    src = tmp / "src" / "blob.bin"
    src.parent.mkdir()
    size = args.mb * MB
    random_file(src, size)
    many = tmp / "many"
    many.mkdir()
    for i in range(args.files):
        (many / f"{i:05d}.bin").write_bytes(os.urandom(args.file_kb * 1000))
    many_files = sorted(many.iterdir())
    many_size = args.files * args.file_kb * 1000
    print(f"file: {size / MB:.0f} MB random bytes; {args.files} files of {args.file_kb} kB; moto at {s3.endpoint}")
    sdk = Client(server.url, creds["KILN_ACCESS_KEY"], creds["KILN_SECRET_KEY"])
    boto = s3.client()

    def fresh_home() -> Path:
        return Path(tempfile.mkdtemp(prefix="home-", dir=tmp))

    def process(argv: list[str]) -> float:
        t = time.monotonic()
        result = subprocess.run(argv, env={**env, "HOME": str(fresh_home())}, capture_output=True, text=True)
        elapsed = time.monotonic() - t
        if result.returncode != 0:
            raise SystemExit(f"{' '.join(argv[:4])} failed: {result.stderr}")
        return elapsed

    def remove_dataset(name: str = "bench") -> None:
        try:
            sdk.remove_dataset(name)
        except KilnError:  # not there yet
            pass

    def fresh_dest(name: str) -> Path:
        dest = tmp / name
        if dest.is_dir():
            shutil.rmtree(dest)
        dest.unlink(missing_ok=True)
        return dest

    def timed(fn: Callable[[], object]) -> float:
        t = time.monotonic()
        fn()
        return time.monotonic() - t

    kiln_cli = [sys.executable, "-m", "kiln", "data"]
    boto_cli = [sys.executable, "-c", BOTO_SCRIPT, s3.endpoint]

    def put_cli() -> float:
        remove_dataset()
        return process([*kiln_cli, "put", str(src), "bench"])

    def put_sdk() -> float:
        remove_dataset()
        return timed(lambda: sdk.put_dataset(src, "bench", state_dir=fresh_home()))

    def put_many_sdk() -> float:
        remove_dataset("bench-many")
        return timed(lambda: sdk.put_dataset(many, "bench-many", state_dir=fresh_home()))

    def boto_many(op: str) -> float:
        """The small files with boto3 on 10 threads (a client's pool holds 10 connections)."""
        dest = fresh_dest("many-boto3-out")
        if op == "get":
            dest.mkdir()

        def one(path: Path) -> None:
            if op == "put":
                boto.upload_file(str(path), bucket, f"boto/many/{path.name}")
            else:
                boto.download_file(bucket, f"boto/many/{path.name}", str(dest / path.name))

        with ThreadPoolExecutor(10) as pool:
            return timed(lambda: list(pool.map(one, many_files)))

    # Each returns the wall time of one transfer (what it sets up first excluded).
    transfers: dict[str, Callable[[], float]] = {
        "put cli": put_cli,
        "put boto3 process": lambda: process([*boto_cli, "upload_file", bucket, "boto/blob.bin", str(src)]),
        "put sdk": put_sdk,
        "put boto3": lambda: timed(lambda: boto.upload_file(str(src), bucket, "boto/blob.bin")),
        "get cli": lambda: process([*kiln_cli, "get", "bench", str(fresh_dest("kiln-out"))]),
        "get boto3 process": lambda: process(
            [*boto_cli, "download_file", bucket, "boto/blob.bin", str(fresh_dest("boto-out.bin"))]
        ),
        "get sdk": lambda: timed(lambda: sdk.get_dataset("bench", fresh_dest("sdk-out"))),
        "get boto3": lambda: timed(lambda: boto.download_file(bucket, "boto/blob.bin", str(fresh_dest("boto-in.bin")))),
        "put many-sdk": put_many_sdk,
        "put many-boto3": lambda: boto_many("put"),
        "get many-sdk": lambda: timed(lambda: sdk.get_dataset("bench-many", fresh_dest("many-sdk-out"))),
        "get many-boto3": lambda: boto_many("get"),
    }
    volume = {name: many_size if "many" in name else size for name in transfers}
    ops = [args.only] if args.only else ["put", "get"]
    if ops == ["get"]:  # the objects to read
        for name in ("put boto3", "put sdk", "put many-boto3", "put many-sdk"):
            if args.files or "many" not in name:
                transfers[name]()
    times: dict[str, list[float]] = {
        name: [] for name in transfers if name.split()[0] in ops and (args.files or "many" not in name)
    }
    names = list(times)  # pairs: Kiln, then the boto3 run it is compared with
    for run in range(args.runs):
        # Interleaved, so that drift of the shared machine hits both sides alike; each pair's order alternates
        # between runs, and written data is flushed to disk between transfers (so that one transfer's
        # write-back does not land on the next).
        order = names if run % 2 == 0 else [n for i in range(0, len(names), 2) for n in names[i : i + 2][::-1]]
        for name in order:
            os.sync()
            elapsed = transfers[name]()
            times[name].append(elapsed)
            print(f"  {name:18s} {elapsed:6.2f}s  {volume[name] / MB / elapsed:7.1f} MB/s")
    rows = []
    rates = {name: volume[name] / MB / min(values) for name, values in times.items()}
    pairs = [("cli", "boto3 process", True), ("sdk", "boto3", True), ("cli", "boto3", False)]
    if args.files:
        pairs.append(("many-sdk", "many-boto3", True))
    labels = {
        "cli": "CLI vs boto3 process",
        "sdk": "SDK vs boto3",
        "many-sdk": f"{args.files} x {args.file_kb} kB, SDK vs boto3",
    }
    for op in ops:
        for kiln_side, boto_side, target in pairs:
            k, b = f"{op} {kiln_side}", f"{op} {boto_side}"
            ratio = rates[k] / rates[b]
            paired = statistics.median(bt / kt for kt, bt in zip(times[k], times[b], strict=True))
            label = labels[kiln_side] if target else "CLI vs boto3 in process"
            rows.append(
                {
                    "metric": f"kiln data {op}, {label} (MB/s)",
                    "value": rates[k],
                    "baseline": rates[b],
                    "ratio": ratio,
                    "target": ">= 0.8x boto3" if target else "(information)",
                    "pass": ratio >= 0.8 if target else None,
                    "unit": "MB/s",
                }
            )
            rows.append(
                {
                    "metric": "  median of the runs' own ratios",
                    "value": paired,
                    "baseline": None,
                    "ratio": paired,
                    "target": "(information)",
                    "pass": None,
                    "unit": "x",
                }
            )
    print_table(rows, metric_width=54, digits={"x": 2})
    finish({"mb": args.mb, "runs": args.runs, "rates": rates, "times_s": times}, rows, started, args.json)


if __name__ == "__main__":
    main()

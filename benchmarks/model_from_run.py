"""``kiln models register NAME --from-run RUN`` of a large logged model against copying the same files through the
store, in the same run.

    .venv/bin/python benchmarks/model_from_run.py [--mb 100] [--repeats 5] [--json PATH]

Each repeat logs a model the way MLflow 3's client does (``create_logged_model``, ``log_model_artifacts``,
``finalize_logged_model``, against ``<endpoint>/mlflow`` of a fresh ``kiln server``): an ``MLmodel`` naming the
pytorch flavor and ``data/model.pth`` of ``--mb`` MB of random bytes (incompressible, and new each repeat, so no
registration finds its blobs held already; a first, tiny one is registered unmeasured). Then, on its files:

- baseline: the store's ``put_file`` of each file to a key of its own (the benchmark's own ``ObjectStore`` on the
  server's store; the copy every registration makes into the organisation's data blobs);
- register: ``register_model_from_run`` through the API (the SDK), wall time: reading the run and its logged model,
  hashing each file (the blobs are content-addressed), the copy, the version's rows.

Target: register p50 ≤ 1.2x the copy's p50. Also shown: a SHA-256 of the same files (what hashing costs).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from report import finish, parse_args, print_table, summary  # noqa: E402
from tests.kilnserver import KilnServer  # noqa: E402

from kiln.storage.store import ObjectStore  # noqa: E402

MLMODEL = """artifact_path: model
flavors:
  pytorch:
    model_data: data
    pytorch_version: 2.13.0
mlflow_version: 3.18.0
"""
TARGET = 1.2
CHUNK = 8 * 1024 * 1024


def log_model(uri: str, work: Path, megabytes: float, index: int) -> tuple[str, str]:
    """A logged model of ``megabytes`` of random bytes in a new run: (run id, logged model id)."""
    from mlflow.tracking import MlflowClient

    local = work / f"model-{index}"
    (local / "data").mkdir(parents=True)
    (local / "MLmodel").write_text(MLMODEL)
    left = int(megabytes * 1024 * 1024)
    with open(local / "data" / "model.pth", "wb") as fh:
        while left > 0:
            fh.write(os.urandom(min(CHUNK, left)))
            left -= CHUNK
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("from-run-bench")
    experiment_id = experiment.experiment_id if experiment else client.create_experiment("from-run-bench")
    run = client.create_run(experiment_id).info.run_id
    model = client.create_logged_model(experiment_id, name="model", source_run_id=run)
    client.log_model_artifacts(model.model_id, str(local))
    client.finalize_logged_model(model.model_id, "READY")
    client.set_terminated(run)
    return run, model.model_id


def copy_files(store: ObjectStore, root: Path, source: Path, index: int) -> float:
    """Seconds to put each file under ``source`` (the logged model's, on the local store) to a key of its own."""
    files = sorted(p for p in source.rglob("*") if p.is_file())
    started = time.perf_counter()
    for path in files:
        store.put_file(path, f"bench-copy/{index}/{path.relative_to(source).as_posix()}")
    took = time.perf_counter() - started
    assert sum(p.stat().st_size for p in (root / "bench-copy" / str(index)).rglob("*") if p.is_file()) > 0
    return took


def hash_files(source: Path) -> float:
    started = time.perf_counter()
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            while data := fh.read(CHUNK):
                digest.update(data)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=100.0, help="size of the model's weights file (MB)")
    parser.add_argument("--repeats", type=int, default=5, help="models logged, copied and registered")
    parser.add_argument("--json", type=Path, default=None)
    args = parse_args(parser, {"mb": 1.0, "repeats": 1})
    started = time.monotonic()
    results: dict[str, Any] = {"mb": args.mb, "repeats": args.repeats}
    with tempfile.TemporaryDirectory(prefix="kiln-from-run-") as tmp:
        work = Path(tmp)
        server = KilnServer(work / "home", rate_limit_per_second="0").start()
        try:
            creds = server.credentials()
            os.environ.update(
                MLFLOW_TRACKING_USERNAME=creds["KILN_ACCESS_KEY"],
                MLFLOW_TRACKING_PASSWORD=creds["KILN_SECRET_KEY"],
                MLFLOW_HTTP_REQUEST_MAX_RETRIES="0",
            )
            store_root = work / "home" / "store"
            store = ObjectStore(str(store_root))
            copies: list[float] = []
            registers: list[float] = []
            hashes: list[float] = []
            with server.client() as kiln:
                warm_run, _ = log_model(f"{server.url}/mlflow", work, 0.001, -1)  # the first call's costs, unmeasured
                kiln.register_model_from_run("bench-warm-up", warm_run)
                for i in range(args.repeats):
                    run, model_id = log_model(f"{server.url}/mlflow", work, args.mb, i)
                    [source] = store_root.glob(f"orgs/*/logged-models/{model_id}")
                    hashes.append(hash_files(source))
                    copies.append(copy_files(store, store_root, source, i))
                    begun = time.perf_counter()
                    version = kiln.register_model_from_run(f"bench-{i}", run)
                    registers.append(time.perf_counter() - begun)
                    assert version.flavor == "pytorch" and version.size >= args.mb * 1024 * 1024
                    print(
                        f"repeat {i + 1}/{args.repeats}: copy {copies[-1]:.3f} s, register {registers[-1]:.3f} s, "
                        f"sha256 {hashes[-1]:.3f} s",
                        flush=True,
                    )
        finally:
            server.stop()
    copy, register, hashed = summary(copies), summary(registers), summary(hashes)
    results.update(copy_s=copy, register_s=register, sha256_s=hashed)
    ratio = register["p50"] / copy["p50"] if copy["p50"] else None
    rows = [
        {
            "metric": f"register --from-run, {args.mb:g} MB, p50",
            "value": register["p50"],
            "baseline": copy["p50"],
            "ratio": ratio,
            "target": f"<= {TARGET}x copy",
            "pass": ratio is not None and ratio <= TARGET,
            "unit": "s",
        },
        {
            "metric": "sha256 of the same files, p50",
            "value": hashed["p50"],
            "baseline": copy["p50"],
            "ratio": hashed["p50"] / copy["p50"] if copy["p50"] else None,
            "target": "-",
            "pass": None,
            "unit": "s",
        },
    ]
    print_table(rows, digits={"s": 3})
    finish(results, rows, started, args.json)


if __name__ == "__main__":
    main()

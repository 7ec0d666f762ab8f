"""`kiln admin backup`'s throughput against the database's own tools, in the same run (issue 44).

A migrated Kiln database is filled with MB megabytes of incompressible rows; then, alternating, the baseline
(`sqlite3 kiln.db ".backup out.db"`, or `pg_dump -Fc -f out.dump`) and Kiln's whole backup of that home
(kiln.usecases.operations.backup.backup_home: the database copied, hashed and listed in the manifest, with the server
key)
each run REPEAT times. The figure is throughput relative to the baseline (its time over Kiln's, medians): target
>= 0.8x. PostgreSQL is measured when it answers at $KILN_TEST_PG_URL (else its rows say why not)."""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.report import finish, parse_args, print_table

if TYPE_CHECKING:
    from kiln.settings import Settings

# Kiln's modules are imported where they are used: ``--help`` (and tests/unit/test_benchmark_docs.py, which reads
# every script's parser) need none of them.

PG_ADMIN = os.environ.get("KILN_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
ROW = 64 * 1024


def fill(url: str, mb: int) -> None:
    """A migrated Kiln database plus ``mb`` MB of random rows (a table of its own: only the bytes matter)."""
    from kiln.db import migrate
    from kiln.db.session import Database

    db = Database(url)
    try:
        migrate.upgrade(db.engine)
        blob = "BLOB" if url.startswith("sqlite") else "BYTEA"
        with db.engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE TABLE bench_filler (id INTEGER PRIMARY KEY, data {blob})")
        rows = mb * 1024 * 1024 // ROW
        for start in range(0, rows, 256):
            batch = [{"id": i, "data": os.urandom(ROW)} for i in range(start, min(rows, start + 256))]
            with db.engine.begin() as conn:
                conn.exec_driver_sql(
                    "INSERT INTO bench_filler (id, data) VALUES (%(id)s, %(data)s)"
                    if not url.startswith("sqlite")
                    else "INSERT INTO bench_filler (id, data) VALUES (:id, :data)",
                    batch,
                )
    finally:
        db.dispose()


def timed(run) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def measure(name: str, settings: Settings, baseline, out: Path, repeat: int) -> list[dict[str, object]]:  # type: ignore[no-untyped-def]
    from kiln.usecases.operations.backup import backup_home

    base: list[float] = []
    ours: list[float] = []
    for i in range(repeat):
        target = out / f"base-{i}"
        base.append(timed(lambda t=target: baseline(t)))
        shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
        dest = out / f"kiln-{i}"
        ours.append(timed(lambda d=dest: backup_home(settings, d)))
        shutil.rmtree(dest)
    b, k = statistics.median(base), statistics.median(ours)
    ratio = b / k
    return [
        {
            "metric": f"{name}: kiln admin backup (median of {repeat})",
            "value": k,
            "baseline": b,
            "ratio": ratio,
            "target": ">= 0.80x",
            "pass": ratio >= 0.8,
            "unit": "s",
        },
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=512, help="megabytes of rows in the database (default 512)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each, alternating (default 3)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["sqlite", "postgresql"])
    parser.add_argument("--json", type=Path, default=None)
    args = parse_args(parser, {"mb": 4, "repeat": 1})
    from kiln.settings import Settings

    started = time.monotonic()
    rows: list[dict[str, object]] = []
    results: dict[str, object] = {"mb": args.mb, "repeat": args.repeat}
    with tempfile.TemporaryDirectory(prefix="kiln-bench-backup-") as tmp:
        root = Path(tmp)
        if "sqlite" not in args.skip:
            home = root / "sqlite-home"
            home.mkdir()
            (home / "server.key").write_bytes(b"x" * 44 + b"\n")
            fill(f"sqlite:///{home / 'kiln.db'}", args.mb)
            sqlite3 = shutil.which("sqlite3")
            if sqlite3 is None:
                rows.append(
                    {
                        "metric": "sqlite: the sqlite3 command is not installed",
                        "value": 0,
                        "baseline": 0,
                        "ratio": None,
                        "target": "-",
                        "pass": None,
                        "unit": "s",
                    }
                )
            else:

                def dot_backup(target: Path) -> None:
                    subprocess.run([sqlite3, str(home / "kiln.db"), f".backup {target}"], check=True)

                rows += measure("sqlite", Settings(home=home), dot_backup, root, args.repeat)
        if "postgresql" not in args.skip:
            rows += postgresql(root, args)
    print_table(rows)
    finish(results, rows, started, args.json)


def postgresql(root: Path, args: argparse.Namespace) -> list[dict[str, object]]:
    from kiln.settings import Settings

    try:
        import psycopg

        admin = psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3)
    except Exception as exc:  # PostgreSQL is optional here: say why its rows are missing
        return [
            {
                "metric": f"postgresql: not measured ({type(exc).__name__})",
                "value": 0,
                "baseline": 0,
                "ratio": None,
                "target": "-",
                "pass": None,
                "unit": "s",
            }
        ]
    name = f"kiln_bench_{secrets.token_hex(4)}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        base = PG_ADMIN.rsplit("/", 1)[0]
        url = f"{base.replace('postgresql://', 'postgresql+psycopg://', 1)}/{name}"
        fill(url, args.mb)
        home = root / "pg-home"
        home.mkdir()
        (home / "server.key").write_bytes(b"x" * 44 + b"\n")

        def dump(target: Path) -> None:
            subprocess.run(["pg_dump", "--format=custom", f"--file={target}", f"--dbname={base}/{name}"], check=True)

        return measure("postgresql", Settings(home=home, database_url=url), dump, root, args.repeat)
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


if __name__ == "__main__":
    main()

"""What every benchmark here shares: nearest-rank percentiles, summaries, the final results table, and a fresh
database per run."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def parse_args(parser: argparse.ArgumentParser, smallest: dict[str, Any]) -> argparse.Namespace:
    """The arguments, with ``--smoke`` added: every size at its smallest (``smallest``: argument name → value),
    for ``make bench-smoke``, which checks only that a benchmark runs to its results table (timings not judged)."""
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="smallest sizes, to check that it runs to its table (make bench-smoke); the figures mean nothing",
    )
    args = parser.parse_args()
    if args.smoke:
        for name, value in smallest.items():
            setattr(args, name, value)
        print("smoke run: " + ", ".join(f"{k}={v}" for k, v in smallest.items()) + " (figures not meaningful)")
    return args


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (p99 of 50 samples is the maximum: say so, do not interpolate)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "min": min(values),
        "p50": pct(values, 50),
        "mean": statistics.fmean(values),
        "p90": pct(values, 90),
        "p99": pct(values, 99),
        "max": max(values),
    }


def print_table(rows: list[dict[str, Any]], metric_width: int = 48, digits: dict[str, int] | None = None) -> None:
    """Rows of {metric, value, baseline, ratio, target, pass, unit}; values in ms are given in seconds."""
    digits = digits or {}
    width = metric_width + 56
    print("\n" + "=" * width)
    print(f"{'metric':{metric_width}s} {'value':>12s} {'baseline':>12s} {'ratio':>7s}  {'target':14s} result")
    print("-" * width)
    for r in rows:
        scale = 1000 if r["unit"] == "ms" else 1
        places = digits.get(r["unit"], 1)
        value = f"{r['value'] * scale:.{places}f} {r['unit']}"
        base = f"{r['baseline'] * scale:.{places}f} {r['unit']}" if r["baseline"] else "-"
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-"
        result = {True: "PASS", False: "FAIL", None: "info"}[r["pass"]]
        print(f"{r['metric']:{metric_width}s} {value:>12s} {base:>12s} {ratio:>7s}  {r['target']:14s} {result}")
    print("=" * width)


def finish(results: dict[str, Any], rows: list[dict[str, Any]], started: float, json_path: Path | None) -> None:
    """Close a run: total time, and every figure as JSON when ``--json`` asked for it."""
    results["table"] = rows
    results["total_s"] = time.monotonic() - started
    print(f"total {results['total_s']:.0f}s")
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(results, indent=2, default=str))
        print(f"wrote {json_path}")


@contextmanager
def fresh_database(url: str | None, sqlite_path: Path) -> Iterator[str]:
    """A new empty database: a SQLite file at ``sqlite_path``, or (``url``: a benchmark's ``--postgres URL``) a
    database next to URL's, dropped at exit, so that a run neither reads nor leaves anything in URL's own."""
    if url is None:
        yield f"sqlite:///{sqlite_path}"
        return
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    name = f"kiln_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()

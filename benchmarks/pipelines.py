"""Pipelines: what running steps as a pipeline costs over submitting the same jobs directly.

    .venv/bin/python benchmarks/pipelines.py [--chain 20] [--fan 100] [--json PATH]

``handoff``  one server with one CPU (so that one job runs at a time, whatever the order): a chain of ``--chain``
             steps, each ``sleep 0.3``, each depending on the one before; the gap from a step's job exit
             (``exit.json``) to the next step's job RUNNING (``status.json``), p50. Baseline, same server, same
             run: ``--chain`` plain jobs of the same command queued at once, the gap from one's exit to the next
             one's RUNNING (what ``scheduler_decisions.py``'s handoff section measures). Target ≤ 1.5x.
``fanout``   one server with 8 CPUs: a pipeline of one step, ``--fan`` independent steps after it and one step
             after all of them (fan-out, fan-in), every command ``true``; its wall time from the submit to the
             run's end, against the same ``--fan`` + 2 jobs submitted directly (the first, then the rest at once
             when it ended, then the last when they all ended: the same dependencies, driven by the client), wall
             time to the last job's end. Target ≤ 1.2x.

Nothing is asserted: the figures are printed with PASS/FAIL against the targets (the machine is shared).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from report import finish, parse_args, print_table  # noqa: E402

PY = sys.executable
SLEEP = ["sleep", "0.3"]


def _gap(home: Path, before: str, after: str) -> float:
    exited = json.loads((home / "jobs" / before / "attempts" / "1" / "exit.json").read_text())
    status = json.loads((home / "jobs" / after / "attempts" / "1" / "status.json").read_text())
    return float(status["running_at"]) - float(exited["finished_at"])


def section_handoff(args: argparse.Namespace, results: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    from tests.kilnserver import KilnServer

    spec = {"command": SLEEP, "runtime": {"python": PY}, "resources": {"cpus": 1}}
    with tempfile.TemporaryDirectory(prefix="kiln-bench-pipelines-") as tmp:
        server = KilnServer(Path(tmp) / "home", cpus="1", rate_limit_per_second="0").start()
        try:
            client = server.client()
            ids = [client.submit(spec).id for _ in range(args.chain)]
            for job_id in ids:
                client.wait(job_id, timeout=300)
            plain = [_gap(server.home, a, b) for a, b in itertools.pairwise(ids)]
            steps = {f"s{i}": {**spec, **({"depends_on": [f"s{i - 1}"]} if i else {})} for i in range(args.chain)}
            run = client.run_pipeline({"name": "chain", "steps": steps}, use_cache=False)
            run = client.wait_pipeline(run.id, timeout=600, poll=0.2)
            if run.state != "SUCCEEDED":
                raise RuntimeError(f"the chain ended {run.state}: {run.message}")
            jobs = [step.job_id or "" for step in run.steps]
            chained = [_gap(server.home, a, b) for a, b in itertools.pairwise(jobs)]
        finally:
            server.stop()
    p50, base = statistics.median(chained), statistics.median(plain)
    print(
        f"handoff    step exit → next step RUNNING: p50 {p50 * 1000:.0f} ms (max {max(chained) * 1000:.0f}); "
        f"plain jobs p50 {base * 1000:.0f} ms, over {len(chained)} handoffs each"
    )
    results["handoff"] = {"pipeline_s": chained, "plain_s": plain}
    rows.append(
        {
            "metric": f"handoff over a {args.chain}-step chain, p50",
            "value": p50,
            "baseline": base,
            "ratio": p50 / base if base else None,
            "target": "<= 1.5x plain jobs",
            "pass": base > 0 and p50 <= 1.5 * base,
            "unit": "ms",
        }
    )


def section_fanout(args: argparse.Namespace, results: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    from tests.kilnserver import KilnServer

    spec = {"command": ["true"], "runtime": {"python": PY}, "resources": {"cpus": 0.1}}
    with tempfile.TemporaryDirectory(prefix="kiln-bench-pipelines-") as tmp:
        server = KilnServer(Path(tmp) / "home", cpus="8", rate_limit_per_second="0").start()
        try:
            client = server.client()
            started = time.perf_counter()
            first = client.submit(spec).id
            client.wait(first, timeout=300)
            middle = [client.submit(spec).id for _ in range(args.fan)]
            for job_id in middle:
                client.wait(job_id, timeout=600)
            client.wait(client.submit(spec).id, timeout=300)
            direct = time.perf_counter() - started

            fan = [f"m{i}" for i in range(args.fan)]
            steps: dict[str, Any] = {"first": dict(spec)}
            steps.update({name: {**spec, "depends_on": ["first"]} for name in fan})
            steps["last"] = {**spec, "depends_on": fan}
            started = time.perf_counter()
            run = client.run_pipeline({"name": "fan", "steps": steps}, use_cache=False)
            run = client.wait_pipeline(run.id, timeout=900, poll=0.1)
            piped = time.perf_counter() - started
            if run.state != "SUCCEEDED":
                raise RuntimeError(f"the fan-out ended {run.state}: {run.message}")
        finally:
            server.stop()
    print(
        f"fanout     1 -> {args.fan} -> 1 steps: pipeline {piped:.2f} s, the same jobs submitted directly {direct:.2f}"
    )
    results["fanout"] = {"pipeline_s": piped, "direct_s": direct, "steps": args.fan + 2}
    rows.append(
        {
            "metric": f"fan-out/fan-in of {args.fan + 2} steps, wall",
            "value": piped,
            "baseline": direct,
            "ratio": piped / direct if direct else None,
            "target": "<= 1.2x direct jobs",
            "pass": piped <= 1.2 * direct,
            "unit": "s",
        }
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chain", type=int, default=20, help="steps of the chain (handoff)")
    parser.add_argument("--fan", type=int, default=100, help="independent steps between the first and the last")
    parser.add_argument("--skip", nargs="*", default=[], choices=["handoff", "fanout"])
    parser.add_argument("--json", type=Path)
    args = parse_args(parser, {"chain": 3, "fan": 3})
    started = time.monotonic()
    results: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if k != "json"}}
    rows: list[dict[str, Any]] = []
    if "handoff" not in args.skip:
        section_handoff(args, results, rows)
    if "fanout" not in args.skip:
        section_fanout(args, results, rows)
    print_table(rows, digits={"ms": 0, "s": 2})
    finish(results, rows, started, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

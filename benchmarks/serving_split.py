"""Model serving with a canary and a shadow on: what the split router adds to a predict, and what a shadow costs
the clients (issue 48).

    .venv/bin/python benchmarks/serving_split.py [--rounds 3] [--duration 5] [--warmup 2] [--json PATH]

One fresh ``kiln server`` (``KILN_CPUS=64``, no rate limit) and the cheapest predictor there is, so that what is
measured is Kiln's part: a custom class that multiplies (tests/integration/models/test_canary_rollout.py's), on this
interpreter, registered three times with the same weights (``scaler@1``, ``@2``, ``@3``). Three services, each with
1 replica per version and no batching:

- ``plain``: ``scaler@1`` alone (today's router: no split);
- ``split``: ``scaler@1`` with ``scaler@2`` as a 10 % canary (every predict goes through the split's choice; one
  in ten to the canary's replica, the same model);
- ``shadowed``: ``scaler@1`` with ``scaler@3`` as a shadow (a copy of every predict, compared, after the answer).

The load generator of ``benchmarks/serving.py`` (signed predicts of one instance, keep-alive connections, closed
loop, its own process) for ``--duration`` seconds after ``--warmup``, in ``--rounds`` interleaved rounds (the order
alternating): ``plain`` and ``split`` at concurrency 1 (p50), ``plain`` and ``shadowed`` at concurrency 16 (p99).
Figures: the medians of the rounds' p50 with and without the split (added ms; target ≤ +0.2 ms), and of the
rounds' p99 with and without the shadow (ratio; target ≤ 1.1x); and, in process, the time of the split's choice
per predict (``choose()``: no split, a 10 % canary, with a routing key), which a loaded machine's noise in the
p50s (milliseconds) cannot show. On a small shared machine a shadow competes for the
same CPUs as the replica it copies: the ratio says what that costs here. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from report import finish, parse_args, print_table  # noqa: E402
from serving import phase_spec, row, run_load  # noqa: E402
from tests.helpers import spec, wait_for  # noqa: E402
from tests.kilnserver import KilnServer  # noqa: E402

from kiln.domain.serving import ReplicaState, ServiceState  # noqa: E402
from kiln.domain.traffic_split import Split, choose  # noqa: E402
from kiln.sdk.client import Client  # noqa: E402

PREDICTOR = """
import json, pathlib

class Model:
    def load(self, path):
        path = pathlib.Path(path)
        self.scale = json.loads((path / "weights.json" if path.is_dir() else path).read_text())["scale"]

    def predict(self, batch):
        return [x * self.scale for x in batch]
"""
WEIGHTS = "import json, os; json.dump({'scale': 3}, open(os.environ['KILN_OUTPUT_DIR'] + '/weights.json', 'w'))"
SETTLE = 300.0


def deploy(client: Client, code: Path, name: str) -> None:
    service = {
        "name": name,
        "model": "scaler@1",
        "predictor": {"type": "custom", "class": "predictor:Model"},
        "runtime": {"python": sys.executable},
        "resources": {"cpus": 1},
        "replicas": 1,
    }
    client.serve(service, code_dir=code)
    ready = client.wait_service(name, timeout=SETTLE)
    assert ready.state == ServiceState.READY, ready.message


def wait_role(client: Client, name: str, role: str) -> None:
    deadline = time.monotonic() + SETTLE
    while not any(getattr(r, role) and r.state == ReplicaState.READY for r in client.get_service(name).replicas):
        assert time.monotonic() < deadline, f"{name}: no {role} replica ready"
        time.sleep(0.5)


def choice_cost(n: int) -> dict[str, float]:
    """Seconds per ``choose()`` call, in process: the split's own work per predict, without the noise of a load
    through the server (the best of 5 repeats of ``n`` calls)."""
    cases = {
        "no split": (Split(1), None),
        "canary 10 %": (Split(1, 2, 10), None),
        "canary 10 %, routing key": (Split(1, 2, 10), "user-42"),
    }
    out = {}
    for label, (split, key) in cases.items():
        best = min(timeit.repeat(lambda split=split, key=key: choose(split, None, key), number=n, repeat=5))
        out[label] = best / n
    return out


def median(phases: list[dict[str, Any]], key: str) -> float:
    return statistics.median(p["latency"][key] for p in phases)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0, help="Timed seconds per phase.")
    parser.add_argument("--warmup", type=float, default=2.0, help="Seconds of load before each timed window.")
    parser.add_argument("--rounds", type=int, default=3, help="Interleaved rounds.")
    parser.add_argument("--json", type=Path)
    args = parse_args(parser, {"duration": 0.5, "warmup": 0.3, "rounds": 1})
    started = time.monotonic()
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    cost = results["choose_seconds"] = choice_cost(20_000 if args.smoke else 200_000)
    for label, seconds in cost.items():
        print(f"  choose(), {label:26s} {1e6 * seconds:6.2f} µs")

    with tempfile.TemporaryDirectory(prefix="kiln-bench-split-") as tmp_s:
        tmp = Path(tmp_s)
        kiln = KilnServer(tmp / "home", cpus="64", rate_limit_per_second="0", reconcile_interval="0.5").start()
        client = kiln.client()
        try:
            code = tmp / "code"
            code.mkdir()
            (code / "predictor.py").write_text(PREDICTOR)
            for _ in range(3):
                job = client.submit(spec(["python", "-c", WEIGHTS]))
                assert wait_for(client, job.id, timeout=SETTLE).state == "SUCCEEDED"
                client.register_model("scaler", job.id, "weights.json", framework="custom")
            for name in ("plain", "split", "shadowed"):
                deploy(client, code, name)
            client.update_service("split", model="scaler@2", canary=10)
            client.update_service("shadowed", shadow="scaler@3")
            wait_role(client, "split", "canary")
            wait_role(client, "shadowed", "shadow")

            phases: dict[str, list[dict[str, Any]]] = {"plain c=1": [], "split c=1": []}
            phases |= {"plain c=16": [], "shadowed c=16": []}
            for i in range(args.rounds):  # interleaved, the order alternating: each pair sees the machine's load alike
                for label in sorted(phases, reverse=bool(i % 2)):
                    name, c = label.split(" c=")
                    load = phase_spec(kiln, name, [1.0], int(c), args.duration, args.warmup)
                    phases[label].append(run_load(tmp, label, load))
            shadow = client.get_service("shadowed").shadow
            results["phases"] = phases
            results["shadow"] = shadow.model_dump() if shadow is not None else None
        finally:
            client.close()
            kiln.stop()

    p50_plain, p50_split = median(phases["plain c=1"], "p50"), median(phases["split c=1"], "p50")
    p99_plain, p99_shadow = median(phases["plain c=16"], "p99"), median(phases["shadowed c=16"], "p99")
    added = 1000 * (p50_split - p50_plain)
    ratio = p99_shadow / p99_plain
    rows = [
        row("p50 c=1, canary 10 % (split router)", p50_split, p50_plain, f"+{added:.2f}ms <=+0.2", added <= 0.2, "ms"),
        row("p99 c=16, shadow on", p99_shadow, p99_plain, "<= 1.1x", ratio <= 1.1, "ms"),
        row("choose(), canary 10 % (in process)", cost["canary 10 %"], cost["no split"], "info", None, "ms"),
        row("choose(), canary, routing key", cost["canary 10 %, routing key"], cost["no split"], "info", None, "ms"),
    ]
    print_table(rows, metric_width=40, digits={"ms": 4})
    if results.get("shadow"):
        s = results["shadow"]
        print(
            f"shadow: {s['copied']} copies, {s['dropped']} dropped, {s['errors']} errors, {s['agreement_rate']} agree"
        )
    print("baselines: the same service without a split (p50 at c=1) and without a shadow (p99 at c=16), same run.")
    finish(results, rows, started, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

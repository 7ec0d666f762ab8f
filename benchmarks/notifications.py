"""Notifications: how soon a job's end reaches a webhook, and what delivering to subscriptions costs other work.

    .venv/bin/python benchmarks/notifications.py [--events 50] [--jobs 300] [--rate 1000] [--json PATH]

``latency``  one server, a webhook receiver on loopback (KILN_WEBHOOK_ALLOW=127.0.0.1/32) subscribed to job.failed;
             ``--events`` jobs that fail (``exit 3``) one after the other: the time from the event (its ``time``,
             stamped in the transaction that ends the job, just before its commit) to the POST's arrival, p50 and
             p99. Baseline, same run: a plain POST to the same receiver from this process. Target: p50 <= 100 ms.
``load``     the same server: ``--jobs`` jobs (``true``) submitted at ``--rate`` a minute, their submit -> RUNNING
             p50, first with no subscription, then with 10 subscriptions of job.* (every end delivered 10 times).
             Target: with subscriptions <= 1.1x without, in the same run.

Nothing is asserted: the figures are printed with PASS/FAIL against the targets (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from report import finish, parse_args, pct, print_table  # noqa: E402

PY = sys.executable
TINY = {"cpus": 0.01, "memory": "64M"}


def _event_latencies(client: Any, receiver: Any, count: int) -> list[float]:
    sub = client.subscribe("bench", ["job.failed"], url=receiver.url("/latency"))
    out = []
    for i in range(count):
        job = client.submit({"command": "exit 3", "runtime": {"python": PY}, "resources": TINY, "max_restarts": 0})
        got = receiver.wait("/latency", i + 1, timeout=120)[-1]
        body = json.loads(got.body)
        assert body["subject"]["id"] == job.id, (body, job.id)
        out.append(got.at - datetime.fromisoformat(body["time"]).timestamp())
    client.unsubscribe(sub.id)
    return out


def _plain_posts(receiver: Any, count: int) -> list[float]:
    out = []
    with httpx.Client() as http:
        for _ in range(count):
            start = time.time()
            http.post(receiver.url("/baseline"), content=b"{}")
            out.append(receiver.at("/baseline")[-1].at - start)
    return out


def _submit_to_running(client: Any, jobs: int, rate: float) -> float:
    spec = {"command": "true", "runtime": {"python": PY}, "resources": TINY}
    gap = 60.0 / rate
    ids, start = [], time.monotonic()
    for i in range(jobs):
        delay = start + i * gap - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        ids.append(client.submit(spec).id)
    waits = []
    for job_id in ids:
        job = client.wait(job_id, timeout=600)
        if job.running_at is not None:
            waits.append((job.running_at - job.created_at).total_seconds())
    return statistics.median(waits)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=50, help="failing jobs timed to their webhook")
    parser.add_argument("--jobs", type=int, default=300, help="jobs submitted in each phase of the load section")
    parser.add_argument("--rate", type=float, default=1000.0, help="job submissions a minute (load)")
    parser.add_argument("--subscriptions", type=int, default=10)
    parser.add_argument("--json", type=Path)
    args = parse_args(parser, {"events": 3, "jobs": 5, "rate": 600.0, "subscriptions": 2})
    started = time.monotonic()
    results: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if k != "json"}}
    rows: list[dict[str, Any]] = []

    from tests.kilnserver import KilnServer
    from tests.notify_receiver import WebhookReceiver

    receiver = WebhookReceiver().start()
    with tempfile.TemporaryDirectory(prefix="kiln-bench-notify-") as tmp:
        server = KilnServer(
            Path(tmp) / "home", cpus="8", rate_limit_per_second="0", webhook_allow="127.0.0.1/32"
        ).start()
        try:
            client = server.client()
            latencies = _event_latencies(client, receiver, args.events)
            plain = _plain_posts(receiver, args.events)
            p50, p99, base = pct(latencies, 50), pct(latencies, 99), pct(plain, 50)
            print(
                f"latency    event -> webhook p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms; "
                f"plain POST {base * 1000:.1f} ms"
            )
            results["latency"] = {"p50_s": p50, "p99_s": p99, "plain_post_p50_s": base, "samples": latencies}
            rows.append(
                {
                    "metric": "event -> webhook received, p50",
                    "value": p50,
                    "baseline": base,
                    "ratio": None,
                    "target": "<= 100 ms",
                    "pass": p50 <= 0.1,
                    "unit": "ms",
                }
            )
            rows.append(
                {
                    "metric": "event -> webhook received, p99",
                    "value": p99,
                    "baseline": None,
                    "ratio": None,
                    "target": "-",
                    "pass": None,
                    "unit": "ms",
                }
            )
            without = _submit_to_running(client, args.jobs, args.rate)
            subs = [
                client.subscribe(f"load-{i}", ["job.*"], url=receiver.url(f"/load-{i}"))
                for i in range(args.subscriptions)
            ]
            with_subs = _submit_to_running(client, args.jobs, args.rate)
            delivered = sum(len(receiver.at(f"/load-{i}")) for i in range(len(subs)))
            print(
                f"load       submit -> RUNNING p50 {with_subs * 1000:.0f} ms with {len(subs)} subscriptions, "
                f"{without * 1000:.0f} ms without ({delivered} webhooks delivered meanwhile)"
            )
            results["load"] = {"with_s": with_subs, "without_s": without, "delivered": delivered}
            ratio = with_subs / without if without else None
            rows.append(
                {
                    "metric": f"submit -> RUNNING p50, {len(subs)} subscriptions",
                    "value": with_subs,
                    "baseline": without,
                    "ratio": ratio,
                    "target": "<= 1.1x none",
                    "pass": ratio is not None and ratio <= 1.1,
                    "unit": "ms",
                }
            )
            client.close()
        finally:
            server.stop()
            receiver.stop()
    print_table(rows, digits={"ms": 0})
    finish(results, rows, started, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

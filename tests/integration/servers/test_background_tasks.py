"""A real server's background tasks as /readyz and /metrics report them: the reconciler, the metrics ingester
and the housekeeping each run as a task of the one runner, with its runs, last run, errors and lease."""

from __future__ import annotations

import re
import time
from datetime import datetime

import httpx

from tests.kilnserver import KilnServer

SERVER_TASKS = {
    "server-presence",
    "reconciler",
    "metrics-ingest",
    "checkpoint-sync",
    "nonce-flush",
    "purge-nonces",
    "purge-audit",
    "purge-idempotency-keys",
    "backend-sweep",
    "shim-notify",  # the local backend's background work (kiln.tasks.backend_work)
}


def _value(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line.rsplit(" ", 1)[0]))
            if all(found.get(k) == v for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in:\n{text}")


def _ready_tasks(server: KilnServer) -> dict[str, dict]:  # type: ignore[type-arg]
    r = httpx.get(server.url + "/readyz", timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "ready"
    return {task["name"]: task for task in r.json()["tasks"]}


def test_readyz_lists_every_background_task(shared_server: KilnServer) -> None:
    deadline = time.monotonic() + 30
    tasks = _ready_tasks(shared_server)
    while not all(tasks[name]["runs"] >= 1 for name in ("reconciler", "metrics-ingest", "purge-nonces")):
        assert time.monotonic() < deadline, tasks
        time.sleep(0.2)
        tasks = _ready_tasks(shared_server)
    assert set(tasks) >= SERVER_TASKS, sorted(tasks)
    reconciler = tasks["reconciler"]
    assert reconciler["running"] is True and reconciler["last_run_ok"] is True
    assert reconciler["lease_scope"] is None and reconciler["holds_lease"] is None  # every server runs it
    assert datetime.fromisoformat(reconciler["last_run"]).timestamp() > time.time() - 60
    assert datetime.fromisoformat(reconciler["next_run"]) is not None
    assert reconciler["errors"] == 0 and reconciler["last_error"] is None
    ingester = tasks["metrics-ingest"]
    assert ingester["running"] is True and ingester["runs"] >= 1 and ingester["last_duration_seconds"] >= 0
    purge = tasks["purge-nonces"]
    assert purge["lease_scope"] == "purge-nonces" and purge["holds_lease"] is True  # the only server holds it


def test_metrics_export_each_tasks_runs_errors_last_run_and_duration(shared_server: KilnServer) -> None:
    deadline = time.monotonic() + 30
    while True:
        text = httpx.get(shared_server.url + "/metrics", timeout=10).text
        if "kiln_task_last_run_timestamp_seconds" in text and 'task="metrics-ingest"' in text:
            break
        assert time.monotonic() < deadline, text
        time.sleep(0.2)
    for task in ("reconciler", "metrics-ingest"):
        assert _value(text, "kiln_task_runs_total", task=task) >= 1
        assert _value(text, "kiln_task_errors_total", task=task) == 0
        assert _value(text, "kiln_task_last_run_timestamp_seconds", task=task) > time.time() - 60
        assert _value(text, "kiln_task_duration_seconds", task=task) >= 0
    runs = _value(text, "kiln_task_runs_total", task="reconciler")
    time.sleep(1.5)  # a pass every reconcile_interval (0.5 s) while idle
    later = httpx.get(shared_server.url + "/metrics", timeout=10).text
    assert _value(later, "kiln_task_runs_total", task="reconciler") > runs

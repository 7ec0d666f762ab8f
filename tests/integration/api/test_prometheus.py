"""/metrics: the Prometheus exposition of a real server, and KILN_METRICS_TOKEN."""

from __future__ import annotations

import json
import re
import sys
import time

import httpx

from tests.tenancy_helpers import job_spec


def _scrape(url: str, **headers: str) -> str:
    r = httpx.get(url + "/metrics", headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return r.text


def _value(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line.rsplit(" ", 1)[0]))
            if all(found.get(k) == v for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in:\n{text}")


def test_metrics_endpoint(make_server) -> None:  # type: ignore[no-untyped-def]
    server = make_server()
    client = server.client()
    job = client.submit(job_spec([sys.executable, "-c", "pass"]))
    assert client.wait(job.id, timeout=60).state == "SUCCEEDED"
    client.get_job(job.id)
    line = json.dumps({"t": time.time(), "s": 1, "m": {"loss": 1.0, "acc": 0.5}}) + "\n"
    assert client.send_metrics(job.id, line).points == 2

    text = _scrape(server.url)
    assert _value(text, "kiln_jobs", state="SUCCEEDED", backend="local") == 1
    assert _value(text, "kiln_jobs", state="RUNNING", backend="local") == 0
    assert _value(text, "kiln_queue_length") == 0
    assert _value(text, "kiln_job_admission_seconds_count") >= 1
    assert _value(text, "kiln_metrics_points_ingested_total") >= 2
    # Request latency by route template: never a raw path with an id in it.
    assert _value(text, "kiln_http_request_duration_seconds_count", route="/api/v1/jobs/{job_id}", status="200") >= 1
    assert job.id not in text
    assert "org" not in re.sub(r"#.*", "", text).lower().replace("kiln_", "")  # no organisation labels


def test_metrics_token(make_server) -> None:  # type: ignore[no-untyped-def]
    server = make_server(metrics_token="s3cret-scrape-token")
    assert httpx.get(server.url + "/metrics", timeout=10).status_code == 401
    bad = httpx.get(server.url + "/metrics", headers={"Authorization": "Bearer nope"}, timeout=10)
    assert bad.status_code == 401
    assert "kiln_jobs" in _scrape(server.url, Authorization="Bearer s3cret-scrape-token")
    assert httpx.get(server.url + "/healthz", timeout=10).status_code == 200

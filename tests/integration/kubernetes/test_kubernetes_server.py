"""A whole Kiln server with KILN_BACKEND=kubernetes, against the FAKE Kubernetes API (tests/fakes/kube_api.py: no
cluster exists here): the same job spec that runs on the local executor is submitted unchanged, becomes a Job (an
Indexed Job with a headless Service for a gang), follows its pods through RUNNING to its end, keeps their logs,
and is cancelled by deleting its Jobs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes.kube_api import FakeKubeAPI
from tests.helpers import wait_for


@pytest.fixture
def fake() -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI() as api:
        api.add_node("node-1", cpu="16", memory="64Gi", gpus=2, labels={"nvidia.com/gpu.product": "NVIDIA-H200"})
        yield api


@pytest.fixture
def kiln(make_server, fake: FakeKubeAPI):  # type: ignore[no-untyped-def]
    return make_server(backend="kubernetes", kubernetes_api_url=fake.url, kubernetes_namespace="kiln")


def _until(check: Any, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _pods(fake: FakeKubeAPI, job_id: str) -> list[str]:
    return sorted(p["metadata"]["name"] for p in fake.pods(f"kiln.io/job={job_id}"))


def test_a_job_runs_on_the_cluster_unchanged(kiln, fake: FakeKubeAPI) -> None:  # type: ignore[no-untyped-def]
    client = kiln.client()
    spec = {"command": "python train.py", "runtime": {"framework": "pytorch"}, "resources": {"cpus": 2}}
    job = client.submit(spec)
    pods = _until(lambda: _pods(fake, job.id))
    assert len(fake.jobs(f"kiln.io/job={job.id}")) == 1 and len(pods) == 1
    fake.set_running(pods[0])
    assert wait_for(client, job.id, "RUNNING", timeout=20).state == "RUNNING"
    fake.append_log(pods[0], "step=1 loss=0.5", "epoch done")
    _until(lambda: [ln.text for ln in client.stream_logs(job.id, follow=False) if ln.source == "stdout"])
    fake.set_terminated(pods[0], exit_code=0)
    done = wait_for(client, job.id, timeout=20)
    assert (done.state, done.exit_code) == ("SUCCEEDED", 0), done.message
    texts = [ln.text for ln in client.stream_logs(job.id, follow=False) if ln.source == "stdout"]
    assert texts == ["step=1 loss=0.5", "epoch done"]  # kept by Kiln, whatever becomes of the pod


def test_a_gang_becomes_an_indexed_job_and_fails_together(kiln, fake: FakeKubeAPI) -> None:  # type: ignore[no-untyped-def]
    client = kiln.client()
    spec = {
        "command": "python train.py",
        "runtime": {"framework": "pytorch"},
        "resources": {"cpus": 2},
        "distributed": {"framework": "pytorch", "workers": 2},
    }
    job = client.submit(spec)
    pods = _until(lambda: len(_pods(fake, job.id)) == 2 and _pods(fake, job.id))
    (indexed,) = fake.jobs(f"kiln.io/job={job.id}")
    assert indexed["spec"]["completionMode"] == "Indexed" and indexed["spec"]["parallelism"] == 2
    for pod in pods:
        fake.set_running(pod)
    wait_for(client, job.id, "RUNNING", timeout=20)
    fake.set_terminated(pods[1], exit_code=3)
    done = wait_for(client, job.id, timeout=30)
    assert (done.state, done.exit_code) == ("FAILED", 3), done.message
    assert "worker1" in (done.message or "") or "worker 1" in (done.message or ""), done.message


def test_cancel_deletes_the_jobs_objects(kiln, fake: FakeKubeAPI) -> None:  # type: ignore[no-untyped-def]
    client = kiln.client()
    job = client.submit({"command": "sleep 600", "runtime": {"framework": "python"}})
    pods = _until(lambda: _pods(fake, job.id))
    fake.set_running(pods[0])
    wait_for(client, job.id, "RUNNING", timeout=20)
    client.cancel(job.id)
    assert wait_for(client, job.id, timeout=30).state == "CANCELLED"
    _until(lambda: not fake.jobs(f"kiln.io/job={job.id}"))


def test_a_host_interpreter_is_refused_at_submit(kiln) -> None:  # type: ignore[no-untyped-def]
    from kiln.errors import InvalidInput

    with pytest.raises(InvalidInput, match="python"):
        kiln.client().submit({"command": "true", "runtime": {"python": "/usr/bin/python3"}})

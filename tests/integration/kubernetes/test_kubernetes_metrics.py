"""Metrics of pods with no change to the job, through a whole Kiln server with KILN_BACKEND=kubernetes against the
FAKE Kubernetes API (tests/fakes/kube_api.py): progress lines a pod prints become queryable series, per gang
member, as they do on the local executor, up to the last line printed before the pods ended."""

from __future__ import annotations

import time
from typing import Any

from tests.fakes.kube_api import FakeKubeAPI
from tests.helpers import wait_for
from tests.integration.kubernetes.test_kubernetes_server import _pods, _until, fake, kiln  # noqa: F401 - fixtures


def _series(client: Any, job_id: str) -> dict[tuple[str, str], Any]:
    return {(s.worker, s.name): s for s in client.metrics_summary(job_id)}


def test_pod_progress_lines_become_metrics_per_member(kiln, fake: FakeKubeAPI) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    client = kiln.client()
    spec = {
        "command": "python train.py",
        "runtime": {"framework": "pytorch"},
        "resources": {"cpus": 2},
        "distributed": {"framework": "pytorch", "workers": 2},
        "metrics": {"patterns": [{"regex": r"val top1 (?P<top1>[\d.]+)"}]},
    }
    job = client.submit(spec)
    pods = _until(lambda: len(_pods(fake, job.id)) == 2 and _pods(fake, job.id))
    for pod in pods:
        fake.set_running(pod)
    wait_for(client, job.id, "RUNNING", timeout=20)
    fake.append_log(pods[0], "step=1 loss=0.5", "Epoch 1/2", "val top1 0.75", "step=2 loss=0.25")
    fake.append_log(pods[1], "step=1 loss=0.6")
    found = _until(lambda: (s := _series(client, job.id)).get(("worker0", "loss")) and s.get(("worker1", "loss")) and s)
    assert found[("worker0", "loss")].count == 2 and found[("worker0", "loss")].last_value == 0.25
    assert found[("worker1", "loss")].count == 1
    assert _until(lambda: _series(client, job.id).get(("worker0", "top1"))).last_value == 0.75
    # The job's end: what the pods printed last is still extracted and stored.
    fake.append_log(pods[0], "step=3 loss=0.125")
    for pod in pods:
        fake.set_terminated(pod, exit_code=0)
    assert wait_for(client, job.id, timeout=30).state == "SUCCEEDED"
    last = _until(lambda: (s := _series(client, job.id)[("worker0", "loss")]).count == 3 and s)
    assert (last.last_step, last.last_value) == (3, 0.125)
    (loss,) = client.metrics(job.id, names=["loss"], worker="worker0")
    assert [p[0] for p in loss.points] == [1, 2, 3]


def test_metrics_off_means_no_extraction(kiln, fake: FakeKubeAPI) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    client = kiln.client()
    job = client.submit(
        {"command": "python train.py", "runtime": {"framework": "pytorch"}, "metrics": {"builtin": False}}
    )
    (pod,) = _until(lambda: _pods(fake, job.id))
    fake.set_running(pod)
    wait_for(client, job.id, "RUNNING", timeout=20)
    fake.append_log(pod, "step=1 loss=0.5")
    fake.set_terminated(pod, exit_code=0)
    assert wait_for(client, job.id, timeout=30).state == "SUCCEEDED"
    _until(lambda: any("loss=0.5" in line.text for line in client.stream_logs(job.id, follow=False)))
    time.sleep(1.5)  # several extraction and ingestion passes
    assert client.metrics_summary(job.id) == []

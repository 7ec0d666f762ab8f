"""Metrics from real jobs on a real server, with no change to the training code (Keras-style and key=value
lines), with the SDK, and from TensorBoard event files; plus system series, custom patterns, bad patterns, and
metrics outliving the server."""

from __future__ import annotations

import sys
import time

from kiln.domain.schemas import MetricSeriesData
from tests.helpers import wait_for
from tests.tenancy_helpers import Api

PY = sys.executable

KERAS = r"""
import time
for epoch in range(1, 4):
    print(f"Epoch {epoch}/3")
    bar = "32/32 [==============================] - 0s 2ms/step"
    print(f"{bar} - loss: {1 / epoch:.4f} - accuracy: {0.5 + epoch / 10:.2f}")
print("Downloading 50 files")  # a number in a sentence is not a metric
"""

STEPS = r"""
for step in range(0, 200, 40):
    print(f"step={step} loss={1 / (step + 1):.5f} lr=0.001", flush=True)
"""

SDK = r"""
import kiln
for step in range(100):
    kiln.log({"loss": 1 / (step + 1), "phase": "warmup" if step < 10 else "train"}, step=step)
"""

TENSORBOARD = r"""
import os
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter
writer = EventFileWriter(os.environ["KILN_TENSORBOARD_DIR"])
for step in range(5):
    value = summary_pb2.Summary.Value(tag="eval/accuracy", simple_value=0.5 + step / 10)
    summary = summary_pb2.Summary(value=[value])
    writer.add_event(event_pb2.Event(wall_time=1_800_000_000 + step, step=step, summary=summary))
writer.close()
"""


def _series(client, job_id: str, name: str, timeout: float = 20) -> MetricSeriesData:  # type: ignore[no-untyped-def]
    """The series once ingested (ingestion follows the job by up to a pass)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [s for s in client.metrics(job_id, names=[name]) if s.name == name]
        if found and (found[0].count > 0):
            return found[0]
        assert time.monotonic() < deadline, (name, [s.name for s in client.metrics(job_id)])
        time.sleep(0.2)


def _run(client, script: str, **spec):  # type: ignore[no-untyped-def]
    job = client.submit({"command": [PY, "-c", script], "runtime": {"python": PY}, **spec})
    done = wait_for(client, job.id, timeout=60)
    assert done.state == "SUCCEEDED", done.message
    return done


def test_keras_style_lines_become_metrics(shared_server):
    client = shared_server.client()
    job = _run(client, KERAS)
    loss = _series(client, job.id, "loss")
    assert [p[0] for p in loss.points] == [1, 2, 3]
    assert [round(p[2], 4) for p in loss.points] == [1.0, 0.5, 0.3333]
    accuracy = _series(client, job.id, "accuracy")
    assert [p[2] for p in accuracy.points] == [0.6, 0.7, 0.8]
    names = {s.name for s in client.metrics_summary(job.id)}
    assert "files" not in names and "downloading" not in names, names


def test_key_value_lines_become_metrics(shared_server):
    client = shared_server.client()
    job = _run(client, STEPS)
    loss = _series(client, job.id, "loss")
    assert [p[0] for p in loss.points] == [0, 40, 80, 120, 160]
    assert {p[2] for p in _series(client, job.id, "lr").points} == {0.001}


def test_sdk_logs_numbers_and_text(shared_server):
    client = shared_server.client()
    job = _run(client, SDK)
    loss = _series(client, job.id, "loss")
    assert loss.count == 100 and loss.points[0][:1] == [0] and loss.points[-1][0] == 99
    phase = _series(client, job.id, "phase")
    assert phase.kind == "text" and {p[2] for p in phase.points} == {"warmup", "train"}


def test_tensorboard_scalars_are_ingested(shared_server):
    client = shared_server.client()
    job = _run(client, TENSORBOARD)
    series = _series(client, job.id, "eval/accuracy")
    assert [p[0] for p in series.points] == [0, 1, 2, 3, 4]
    assert [round(p[2], 5) for p in series.points] == [0.5, 0.6, 0.7, 0.8, 0.9]


def test_custom_pattern_with_a_lookahead_window_and_system_series(shared_server):
    client = shared_server.client()
    script = (
        "import time\nfor i in range(3):\n    print(f'Iteration {i}:')\n    print(f'  val={i * 2}.5')\ntime.sleep(1.5)"
    )
    pattern = {"regex": r"Iteration (?P<iteration>\d+):\n\s+val=(?P<val_score>[0-9.]+)", "lines": 2}
    job = _run(client, script, metrics={"patterns": [pattern], "builtin": False, "system_interval": 0.5})
    val = _series(client, job.id, "val_score")
    assert [(p[0], p[2]) for p in val.points] == [(0, 0.5), (1, 2.5), (2, 4.5)]
    assert "val" not in {s.name for s in client.metrics_summary(job.id)}  # built-in recognition is off
    rss = _series(client, job.id, "system/rss_bytes")
    assert rss.source == "sys" and all(p[2] > 0 for p in rss.points)


def test_a_bad_pattern_is_refused_at_submit_by_name(shared_server):
    api = Api.admin(shared_server)
    for regex, needle in ((r"loss=(?P<loss>[0-9.]+", "does not compile"), (r"loss=[0-9.]+", "no named group")):
        response = api.post(
            "/jobs", json_body={"spec": {"command": "true", "metrics": {"patterns": [{"regex": regex}]}}}
        )
        assert response.status_code == 422, response.text
        assert needle in response.text and "metrics" in response.text, response.text


def test_metrics_survive_a_server_restart(make_server):
    server = make_server()
    client = server.client()
    job = _run(client, STEPS)
    before = _series(client, job.id, "loss")
    server.stop()
    server.start()
    after = next(s for s in server.client().metrics(job.id, names=["loss"]) if s.name == "loss")
    assert after.points == before.points and after.count == 5

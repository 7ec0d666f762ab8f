"""The shim's metrics threads on a temporary attempt dir: log extraction, a log flood, system samples."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.local.test_shim_procs import Attempt, py, ranks


def metrics_cfg(root: Path, **extra: Any) -> dict[str, Any]:
    return {
        "dir": str(root / "metrics"),
        "builtin": True,
        "patterns": [],
        "tensorboard_dir": None,
        "system": False,
        "system_interval": 5.0,
        **extra,
    }


@pytest.fixture
def run(tmp_path: Path):
    made: list[Attempt] = []

    def make(command: list[str], metrics: dict[str, Any] | None = None, **config: Any) -> Attempt:
        root = tmp_path / f"a{len(made)}"
        root.mkdir()
        config["metrics"] = metrics_cfg(root, **(metrics or {}))
        made.append(Attempt(root, command, **config))
        return made[-1]

    yield make
    for attempt in made:
        attempt.kill()


def spool(attempt: Attempt, name: str) -> list[dict[str, Any]]:
    path = Path(attempt.config["metrics"]["dir"]) / name
    if not path.exists():
        return []
    text = path.read_text()
    assert text == "" or text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def points(lines: list[dict[str, Any]]) -> list[tuple[int | None, dict[str, Any]]]:
    return [(line["s"], line["m"]) for line in lines if "m" in line]


def test_keras_and_key_value_lines_become_points(run) -> None:
    script = (
        "print('Downloading 50 files')\n"
        "for epoch in range(1, 4):\n"
        "    print(f'Epoch {epoch}/3')\n"
        "    print(f'100/100 [====] - 1s 10ms/step - loss: {1 / epoch:.4f} - accuracy: 0.{epoch}')\n"
        "for step in (10, 20):\n"
        "    print(f'step={step} loss={step / 100} lr=3e-4', flush=True)\n"
    )
    attempt = run(py(script))
    result = attempt.wait()
    assert result["reason"] == "Completed"
    lines = spool(attempt, "log-a1-worker0.jsonl")
    assert points(lines) == [
        (1, {"loss": 1.0, "accuracy": 0.1}),
        (2, {"loss": 0.5, "accuracy": 0.2}),
        (3, {"loss": 0.3333, "accuracy": 0.3}),
        (10, {"loss": 0.1, "lr": 0.0003}),
        (20, {"loss": 0.2, "lr": 0.0003}),
    ]
    first = lines[0]
    assert first["w"] == "worker0" and first["src"] == "log"
    assert abs(first["t"] - time.time()) < 60
    assert not any("event" in line for line in lines)


def test_custom_pattern_and_member_tag_and_ranks(run) -> None:
    script = (
        "import os\nprint('iter', os.environ['RANK'], 'top1', '0.75', flush=True)\nprint('score: 0.5', flush=True)\n"
    )
    pattern = {"regex": r"iter (?P<it>\d+) top1 (?P<top1>[\d.]+)", "lines": 1, "step": "it"}
    attempt = run(py(script), metrics={"builtin": False, "patterns": [pattern]}, procs=ranks(2), log_tag="worker1")
    assert attempt.wait()["reason"] == "Completed"
    got = points(spool(attempt, "log-a1-worker1.jsonl"))
    assert sorted(got, key=lambda p: p[0] or 0) == [(0, {"top1": 0.75}), (1, {"top1": 0.75})]


def test_without_metrics_config_nothing_is_written(tmp_path: Path) -> None:
    attempt = Attempt(tmp_path, py("print('loss=0.5')"))
    try:
        assert attempt.wait()["reason"] == "Completed"
    finally:
        attempt.kill()
    assert not (tmp_path / "metrics").exists()


FLOOD = (
    "import sys\n"
    "w = sys.stdout.write\n"
    "pad = '.' * 90\n"
    "for i in range(300000):\n"
    "    w(f'progress {i:06d} {pad}\\n')\n"
    "    if i % 1000 == 999:\n"
    "        w(f'step={i} loss={i / 300000:.4f}\\n')\n"
    "sys.stdout.flush()\n"
)


def test_a_flood_lags_the_exit_record_does_not_wait_and_nothing_is_lost(run) -> None:
    # ~30 MB as fast as Python can print it, a metrics line every thousand lines. No drain time before the exit
    # record: the drain goes on after it, announced by the draining marker, until every point is extracted.
    attempt = run(py(FLOOD), metrics={"drain_seconds": 0.0})
    marker = Path(attempt.config["metrics"]["dir"]) / "draining-a1-worker0"
    deadline = time.monotonic() + 120
    while not (attempt.dir / "exit.json").exists():
        assert time.monotonic() < deadline, "no exit record"
        time.sleep(0.01)
    # The marker is written before the exit record and removed only when the shim is done.
    assert marker.exists() or attempt.proc.poll() is not None
    result = attempt.wait(timeout=120)
    assert result["reason"] == "Completed"
    assert not marker.exists()
    assert attempt.log_path.stat().st_size > 30_000_000
    status = json.loads((attempt.dir / "status.json").read_text())
    assert result["finished_at"] - status["running_at"] < 60
    lines = spool(attempt, "log-a1-worker0.jsonl")
    events = [line["event"] for line in lines if "event" in line]
    assert events[0] == "MetricsLagging"
    assert events[-1] == "MetricsCaughtUp" and "MetricsIncomplete" not in events
    got = points(lines)
    assert got[:2] == [(999, {"loss": 0.0033}), (1999, {"loss": 0.0067})]
    assert [s for s, _ in got] == [i * 1000 + 999 for i in range(300)]


def test_the_flood_is_not_slowed_by_extraction(run, tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "w = sys.stdout.write\n"
        "for i in range(300000):\n"
        "    w(f'step={i} loss=0.{i % 97} acc=0.5 ........................................\\n')\n"
    )
    (tmp_path / "plain").mkdir()
    plain = Attempt(tmp_path / "plain", py(script))
    try:
        exit_plain = plain.wait(timeout=120)
    finally:
        plain.kill()
    with_metrics = run(py(script), metrics={"drain_seconds": 0.0, "drain_limit_seconds": 0.0})
    exit_metrics = with_metrics.wait(timeout=120)
    job_plain = exit_plain["finished_at"] - json.loads((plain.dir / "status.json").read_text())["running_at"]
    job_metrics = exit_metrics["finished_at"] - json.loads((with_metrics.dir / "status.json").read_text())["running_at"]
    assert job_metrics < max(2 * job_plain, job_plain + 2.0), (job_plain, job_metrics)
    events = [line["event"] for line in spool(with_metrics, "log-a1-worker0.jsonl") if "event" in line]
    assert "MetricsIncomplete" in events  # no drain time at all: what was left is reported lost, not waited for


@pytest.mark.parametrize("builtin", [False, True])  # with the log's metrics, the log thread starts the sampler
def test_system_metrics_are_sampled(run, builtin: bool) -> None:
    script = "import time\nx = bytearray(50 * 1024 * 1024)\nend = time.time() + 1.5\nwhile time.time() < end: pass\n"
    attempt = run(py(script), metrics={"builtin": builtin, "system": True, "system_interval": 0.2})
    assert attempt.wait()["reason"] == "Completed"
    lines = spool(attempt, "sys-a1-worker0.jsonl")
    samples = [line["m"] for line in lines if "m" in line]
    assert len(samples) >= 3
    assert all(line["s"] is None and line["src"] == "sys" for line in lines)
    assert max(m.get("system/rss_bytes", 0) for m in samples) > 50 * 1024 * 1024
    busy = [m["system/cpu_percent"] for m in samples if "system/cpu_percent" in m]
    assert busy and max(busy) > 30
    if not builtin:
        assert not (Path(attempt.config["metrics"]["dir"]) / "log-a1-worker0.jsonl").exists()


@pytest.mark.needs("tensorboard")
def test_tensorboard_scalars_are_followed(run, tmp_path: Path) -> None:
    tb = tmp_path / "tb"
    script = (
        "import sys, time\n"
        "from tensorboard.compat.proto import event_pb2, summary_pb2\n"
        "from tensorboard.summary.writer.event_file_writer import EventFileWriter\n"
        f"w = EventFileWriter({str(tb / 'train')!r}, flush_secs=0.1)\n"
        "for step in range(3):\n"
        "    v = summary_pb2.Summary.Value(tag='loss', simple_value=1.0 / (step + 1))\n"
        "    w.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=[v])))\n"
        "    w.flush()\n"
        "    time.sleep(0.3)\n"
        "w.close()\n"
    )
    attempt = run(py(script), metrics={"builtin": False, "tensorboard_dir": str(tb)})
    assert attempt.wait()["reason"] == "Completed"
    lines = spool(attempt, "tb-a1-worker0.jsonl")
    got = points(lines)
    assert [s for s, _ in got] == [0, 1, 2]
    assert [m["train/loss"] for _, m in got] == pytest.approx([1.0, 0.5, 1 / 3], rel=1e-6)
    assert all(line["src"] == "tb" for line in lines)

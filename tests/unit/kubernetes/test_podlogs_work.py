"""PodLogs as background work: ``follow`` makes a running pod's uid one of the keys the task runner runs a step
for (and wakes it), a step that finds the pod gone marks its log read to its end (the key leaves, for good, across a
restart too), and a stopped backend has no keys left. It starts no thread itself."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from kiln.backends.kubernetes.podlogs import PodLogs
from kiln.storage.logs import LogStore


class GonePods:
    """A CoreV1Api whose pods are all gone (404 on their logs)."""

    def __init__(self) -> None:
        self.reads: list[str] = []

    def read_namespaced_pod_log(self, name: str, namespace: str, **kwargs: Any) -> Any:
        self.reads.append(name)
        raise ApiException(status=404, reason="Not Found")


def running_pod(uid: str) -> dict[str, Any]:
    return {"metadata": {"name": f"pod-{uid}", "uid": uid, "labels": {}}, "status": {"phase": "Running"}}


def pod_logs(tmp_path: Path, core: Any, stop: threading.Event) -> PodLogs:
    return PodLogs(core, "kiln", LogStore(tmp_path / "logs"), tmp_path / "state", stop, set(), lambda name: None)


def test_a_followed_pod_is_a_key_until_a_step_reads_its_log_to_its_end(tmp_path: Path) -> None:
    core, stop = GonePods(), threading.Event()
    threads = set(threading.enumerate())
    logs = pod_logs(tmp_path, core, stop)
    logs.follow("job-1", {"metadata": {"name": "pending", "uid": "u0"}, "status": {"phase": "Pending"}})
    assert logs.following() == [] and not logs.wake.is_set()  # not running yet: nothing to read
    logs.follow("job-1", running_pod("u1"))
    logs.follow("job-1", running_pod("u1"))  # again: one key
    assert logs.following() == ["u1"] and logs.wake.is_set()
    assert set(threading.enumerate()) == threads, "PodLogs starts no thread: the task runner runs its steps"

    assert logs.step("u1") is None  # the pod is gone: its log is read to its end
    assert core.reads == ["pod-u1"]
    assert logs.following() == []
    saved = json.loads((tmp_path / "state" / "kubernetes-logs.json").read_text())
    assert saved["u1"]["done"] is True
    logs.follow("job-1", running_pod("u1"))
    assert logs.following() == []
    assert pod_logs(tmp_path, core, threading.Event())._state["u1"]["done"] is True  # a restart skips it too


def test_a_stopped_backend_follows_nothing(tmp_path: Path) -> None:
    core, stop = GonePods(), threading.Event()
    logs = pod_logs(tmp_path, core, stop)
    logs.follow("job-1", running_pod("u1"))
    logs.close()
    assert logs.following() == []
    assert logs.step("u1") is None and core.reads == []  # no stream opened once stopped
    logs.follow("job-1", running_pod("u2"))
    assert logs.following() == []

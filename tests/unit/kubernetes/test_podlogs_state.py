"""PodLogs keeps its log positions in a state file, written atomically (a temporary file, then a rename). Two on the
same state (a controller built again in one process while the old one's streams end, as the controller-restart test
does) must not rename each other's temporary file from under it: that raised FileNotFoundError in a stream's
thread."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from kiln.backends.kubernetes.podlogs import PodLogs


def _pod_logs(state_dir: Path) -> PodLogs:
    return PodLogs(None, "kiln", None, state_dir, threading.Event(), set(), lambda name: None)


def test_two_writers_of_one_state_file_never_take_each_others_temporary_file(tmp_path: Path) -> None:
    writers = [_pod_logs(tmp_path), _pod_logs(tmp_path)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(writers))

    def save(logs: PodLogs, n: int) -> None:
        start.wait()
        try:
            for i in range(300):
                with logs._lock:
                    logs._state[f"uid-{n}"] = {"ts": None, "n": i}
                    logs._save_state(force=True)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=save, args=(logs, n)) for n, logs in enumerate(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    saved = json.loads((tmp_path / "kubernetes-logs.json").read_text())
    assert saved in ({"uid-0": {"ts": None, "n": 299}}, {"uid-1": {"ts": None, "n": 299}})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kubernetes-logs.json"]  # no temporary file left

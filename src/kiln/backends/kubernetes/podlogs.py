"""Pod logs into Kiln's :class:`LogStore`: the Kubernetes backend owns one :class:`PodLogs`.

A thread per pod follows ``pods/log`` (with timestamps) into the store, as lines tagged with the member
(``O@worker1``) for gangs, so logs outlive the pods. Where each pod's log was read up to (its last timestamp and
how many lines carried it) is kept in a small state file, so a restarted controller resumes (``sinceSeconds``
and skipping what it already has) without duplicating lines; a crash may repeat at most the lines of the last
``LOG_STATE_EVERY`` seconds.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kiln.backends.kubernetes.status import INDEX_LABEL, member_of, parse_time
from kiln.storage.logs import LogStore

log = logging.getLogger(__name__)

Obj = dict[str, Any]
LOG_STATE_EVERY = 0.5  # seconds between saves of the log positions while lines flow
TERMINAL = ("Succeeded", "Failed")


def _ts_key(stamp: str) -> tuple[str, int]:
    """An RFC 3339 (nano) timestamp as a sortable key: (seconds part, nanoseconds); the kubelet trims zeros."""
    head, _, frac = stamp.rstrip("Z").partition(".")
    digits = "".join(ch for ch in frac if ch.isdigit())[:9]
    return head[:19], int(digits.ljust(9, "0")) if digits else 0


def iter_lines(resp: Any) -> Iterator[str]:
    buffer = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        buffer += chunk if isinstance(chunk, bytes) else chunk.encode()
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield line.decode("utf-8", errors="replace")
    if buffer:
        yield buffer.decode("utf-8", errors="replace")


class PodLogs:
    """The log streams of the backend's pods. ``stop`` and ``responses`` are the backend's: its stop event and
    the open streams its ``close`` shuts down; ``pod(name)`` is the backend's cached pod of that name."""

    def __init__(
        self,
        core: Any,
        namespace: str,
        logs: LogStore | None,
        state_dir: Path | None,
        stop: threading.Event,
        responses: set[Any],
        pod: Callable[[str], Obj | None],
    ) -> None:
        self.core = core
        self.namespace = namespace
        self.logs = logs
        self.stop = stop
        self.responses = responses
        self._pod = pod
        # Log positions: pod uid → {"ts": last timestamp read, "n": lines read with that timestamp, "done": bool}.
        self._lock = threading.Lock()
        self._threads: dict[str, threading.Thread] = {}
        self._state_path = state_dir / "kubernetes-logs.json" if state_dir is not None else None
        self._state: dict[str, dict[str, Any]] = self._load_state()
        self._saved = 0.0

    def _load_state(self) -> dict[str, dict[str, Any]]:
        if self._state_path is None:
            return {}
        try:
            return dict(json.loads(self._state_path.read_text()))
        except (FileNotFoundError, ValueError):
            return {}

    def _save_state(self, force: bool = False) -> None:
        """With ``_lock`` held."""
        if self._state_path is None or (not force and time.monotonic() - self._saved < LOG_STATE_EVERY):
            return
        self._state_path.parent.mkdir(parents=True, exist_ok=True)
        # A temporary file of this writer's own: another PodLogs on the same state (a controller built again in the
        # same process, while the old one's streams end) renames its own, never this one from under it.
        tmp = self._state_path.with_name(f"{self._state_path.name}.{os.getpid()}.{id(self)}.tmp")
        tmp.write_text(json.dumps(self._state))
        os.replace(tmp, self._state_path)
        self._saved = time.monotonic()

    def follow(self, job_id: str, pod: Obj) -> None:
        """Start streaming ``pod``'s log (once it runs), unless it is streamed already or was read to its end."""
        if self.logs is None or self.stop.is_set():
            return
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid"))
        if (pod.get("status") or {}).get("phase") not in ("Running", *TERMINAL):
            return
        with self._lock:
            if uid in self._threads or self._state.get(uid, {}).get("done"):
                return
            distributed = INDEX_LABEL in (meta.get("labels") or {})
            stream = f"O@{member_of(pod)}" if distributed else "O"
            thread = threading.Thread(
                target=self._stream,
                args=(job_id, str(meta.get("name")), uid, stream),
                name=f"kiln-k8s-log-{meta.get('name')}",
                daemon=True,
            )
            self._threads[uid] = thread
        thread.start()

    def _stream(self, job_id: str, pod_name: str, uid: str, stream: str) -> None:
        from kubernetes.client.exceptions import ApiException

        assert self.logs is not None
        while not self.stop.is_set():
            with self._lock:
                state = dict(self._state.get(uid) or {"ts": None, "n": 0})
            kwargs: dict[str, Any] = {}
            if state["ts"]:
                since = parse_time(state["ts"])
                if since is not None:
                    kwargs["since_seconds"] = max(1, int((datetime.now(UTC) - since).total_seconds()) + 2)
            try:
                resp = self.core.read_namespaced_pod_log(
                    pod_name,
                    self.namespace,
                    container="job",
                    follow=True,
                    timestamps=True,
                    _preload_content=False,
                    **kwargs,
                )
            except ApiException as exc:
                if exc.status == 404:
                    break  # the pod is gone: whatever was not read is lost with it
                self.stop.wait(1.0)  # 400: the container is not started yet
                continue
            except Exception as exc:
                log.debug("log stream of %s: %s", pod_name, exc)
                self.stop.wait(1.0)
                continue
            self.responses.add(resp)
            last = (state["ts"], int(state["n"]))
            skip_key = _ts_key(last[0]) if last[0] else None
            seen_equal = 0
            try:
                for line in iter_lines(resp):
                    stamp, _, text = line.partition(" ")
                    key = _ts_key(stamp)
                    if skip_key is not None:
                        if key < skip_key:
                            continue
                        if key == skip_key:
                            seen_equal += 1
                            if seen_equal <= last[1]:
                                continue
                    with self._lock:
                        if self.stop.is_set():
                            return
                        self.logs.append(job_id, stream, [text])
                        entry = self._state.setdefault(uid, {"ts": None, "n": 0})
                        entry["n"] = entry["n"] + 1 if entry["ts"] == stamp else 1
                        entry["ts"] = stamp
                        self._save_state()
            except Exception as exc:
                log.debug("log stream of %s broke: %s", pod_name, exc)
            finally:
                self.responses.discard(resp)
            pod = self._pod(pod_name)
            phase = (pod or {}).get("status", {}).get("phase")
            if pod is None or phase in TERMINAL:
                break
            self.stop.wait(0.5)
        with self._lock:
            if not self.stop.is_set():
                self._state.setdefault(uid, {"ts": None, "n": 0})["done"] = True
            self._save_state(force=True)

    def close(self) -> None:
        """Set the stop event (no line is stored after it) and save the positions."""
        with self._lock:
            self.stop.set()
            self._save_state(force=True)

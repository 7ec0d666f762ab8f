"""Pod logs into Kiln's :class:`LogStore`: the Kubernetes backend owns one :class:`PodLogs`.

Each running pod's ``pods/log`` is followed (with timestamps) into the store, as lines tagged with the member
(``O@worker1``) for gangs, so logs outlive the pods. The streams are a piece of the backend's background work, a
:class:`~kiln.backends.capabilities.WorkSet` keyed by pod uid: the server's task runner gives each pod whose log is
followed a thread of its own (the read blocks for as long as the pod writes) and ends it once :meth:`PodLogs.step`
has read the log to its end; this module starts no thread. Where each pod's log was read up to (its last timestamp
and how many lines carried it) is kept in a small state file, so a restarted controller resumes (``sinceSeconds``
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
from typing import Any, NamedTuple

from kiln.backends.kubernetes.status import INDEX_LABEL, member_of, parse_time
from kiln.storage.logs import LogStore

log = logging.getLogger(__name__)

Obj = dict[str, Any]
LOG_STATE_EVERY = 0.5  # seconds between saves of the log positions while lines flow
REOPEN_SECONDS = 0.5  # after a stream broke while its pod still runs
RETRY_SECONDS = 1.0  # after the stream could not be opened (the container has not started yet)
TERMINAL = ("Succeeded", "Failed")


class _Followed(NamedTuple):
    job_id: str
    pod: str  # its name
    stream: str  # the log store's stream: "O", or "O@worker1" for a member of a gang


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
    """The log streams of the backend's pods: :meth:`follow` a pod, and the task runner runs :meth:`step` for each
    uid :meth:`following` returns. ``stop`` and ``responses`` are the backend's: its stop event and the open
    streams its ``close`` shuts down; ``pod(name)`` is the backend's cached pod of that name."""

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
        self._followed: dict[str, _Followed] = {}  # pod uid → the log followed now (until read to its end)
        self.wake = threading.Event()  # set when a pod joins: the task runner starts its stream at once
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
        """Follow ``pod``'s log (once it runs), unless it is followed already or was read to its end: its uid
        joins :meth:`following`, and the task runner starts its stream at once (``wake``)."""
        if self.logs is None or self.stop.is_set():
            return
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid"))
        if (pod.get("status") or {}).get("phase") not in ("Running", *TERMINAL):
            return
        with self._lock:
            if uid in self._followed or self._state.get(uid, {}).get("done"):
                return
            distributed = INDEX_LABEL in (meta.get("labels") or {})
            stream = f"O@{member_of(pod)}" if distributed else "O"
            self._followed[uid] = _Followed(job_id, str(meta.get("name")), stream)
        self.wake.set()

    def following(self) -> list[str]:
        """The uids of the pods whose logs are followed now (none once the backend stops): the keys of the
        backend's ``k8s-pod-logs`` work."""
        with self._lock:
            return [] if self.stop.is_set() else list(self._followed)

    def step(self, uid: str) -> float | None:
        """Follow the log of the pod ``uid`` names from where it was read up to, until the stream ends (the pod
        ended, or the connection broke, or the server stops). Returns the seconds until following it again (the pod
        still runs; its container has not started), or None once its log was read to its end (the pod ended or is
        gone: its uid leaves :meth:`following`, and the task runner ends its thread) or the backend stops."""
        from kubernetes.client.exceptions import ApiException

        with self._lock:
            followed = self._followed.get(uid)
            state = dict(self._state.get(uid) or {"ts": None, "n": 0})
        logs = self.logs
        if followed is None or logs is None or self.stop.is_set():
            return None
        kwargs: dict[str, Any] = {}
        if state["ts"]:
            since = parse_time(state["ts"])
            if since is not None:
                kwargs["since_seconds"] = max(1, int((datetime.now(UTC) - since).total_seconds()) + 2)
        try:
            resp = self.core.read_namespaced_pod_log(
                followed.pod,
                self.namespace,
                container="job",
                follow=True,
                timestamps=True,
                _preload_content=False,
                **kwargs,
            )
        except ApiException as exc:
            if exc.status == 404:
                self._done(uid)  # the pod is gone: whatever was not read is lost with it
                return None
            return RETRY_SECONDS  # 400: the container is not started yet
        except Exception as exc:
            log.debug("log stream of %s: %s", followed.pod, exc)
            return RETRY_SECONDS
        self.responses.add(resp)
        try:
            # Checked once the stream is among the backend's: a stop that came before this line did not shut it
            # down, and one after it does.
            if not self.stop.is_set():
                self._read(logs, uid, followed, resp, (state["ts"], int(state["n"])))
        except Exception as exc:
            log.debug("log stream of %s broke: %s", followed.pod, exc)
        finally:
            self.responses.discard(resp)
        if self.stop.is_set():
            return None
        pod = self._pod(followed.pod)
        if pod is None or (pod.get("status") or {}).get("phase") in TERMINAL:
            self._done(uid)
            return None
        return REOPEN_SECONDS

    def _read(self, logs: LogStore, uid: str, followed: _Followed, resp: Any, last: tuple[str | None, int]) -> None:
        """Store the stream's lines in ``logs``, skipping those read before (up to the timestamp ``last[0]``, and
        ``last[1]`` lines carrying it)."""
        skip_key = _ts_key(last[0]) if last[0] else None
        seen_equal = 0
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
                logs.append(followed.job_id, followed.stream, [text])
                entry = self._state.setdefault(uid, {"ts": None, "n": 0})
                entry["n"] = entry["n"] + 1 if entry["ts"] == stamp else 1
                entry["ts"] = stamp
                self._save_state()

    def _done(self, uid: str) -> None:
        """The pod's log was read to its end: never followed again, here or after a restart."""
        with self._lock:
            if self.stop.is_set():
                return  # stopped, not done: the next controller resumes it (``close`` saved the positions)
            self._state.setdefault(uid, {"ts": None, "n": 0})["done"] = True
            self._followed.pop(uid, None)
            self._save_state(force=True)

    def close(self) -> None:
        """Set the stop event (no line is stored after it) and save the positions."""
        with self._lock:
            self.stop.set()
            self._save_state(force=True)

"""The informers: Kiln's pods and Jobs in the namespace (``app.kubernetes.io/managed-by=kiln``), kept in step with
the API server. Each kind is listed once, then watched from the list's resourceVersion; a watch that ends at the
server's timeout is resumed from the last version seen (bookmarks included), and ``410 Gone`` or an error leads to
a new list (after a back-off that doubles to 10 s on errors). What the list and the watch events say is handed to
the backend (``apply``), which keeps the objects; a list also says which known objects are gone (``DELETED``).
One list or watch request is one step of the backend's ``k8s-pods``/``k8s-jobs`` work, which the server's task
runner runs."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from kiln.backends.kubernetes.names import MANAGED_BY
from kiln.backends.kubernetes.podlogs import iter_lines
from kiln.errors import BackendError

log = logging.getLogger(__name__)

INFORM_BACKOFF = 0.2  # seconds before the first re-list after a failed list or watch (doubling to 10 s)
MAX_BACKOFF = 10.0
KINDS = ("Pod", "Job")

Obj = dict[str, Any]


class Informers:
    """The list-then-watch loops of ``lists`` (kind → the client's list call, which also watches)."""

    def __init__(
        self,
        lists: dict[str, Callable[..., Any]],
        namespace: str,
        *,
        apply: Callable[[str, str, Obj], None],
        known: Callable[[str], list[Obj]],
        stop: threading.Event,
        responses: set[Any],
        watch_timeout: int = 300,
    ) -> None:
        """``apply(kind, event, obj)``: an ADDED/MODIFIED/DELETED object; ``known(kind)``: the objects the backend
        holds (a new list deletes those it no longer has); ``responses``: open streams, which the backend shuts
        down when it closes (a watch blocked in one then returns)."""
        self.lists = lists
        self.namespace = namespace
        self.apply = apply
        self.known = known
        self.stop = stop
        self.responses = responses
        self.watch_timeout = watch_timeout
        self.synced = {kind: threading.Event() for kind in lists}  # listed at least once
        # Each informer's place: the resourceVersion to watch from (None: list first) and its back-off.
        self.versions: dict[str, str | None] = dict.fromkeys(lists)
        self.backoff = dict.fromkeys(lists, INFORM_BACKOFF)

    def wait_synced(self, timeout: float) -> bool:
        """Has every kind been listed (waiting up to ``timeout`` seconds for each)?"""
        return all(event.wait(timeout) for event in self.synced.values())

    def inform_once(self, kind: str) -> float | None:
        """One request of the informer of ``kind``: the list (at first, and after 410 Gone or an error), else one
        watch from the last resourceVersion until the server's timeout. Returns 0 (the next request at once), or
        the back-off after an error (doubling to 10 s), or None once the backend is closing."""
        if self.stop.is_set():
            return None
        selector = f"{MANAGED_BY}=kiln"
        call = self.lists[kind]
        version = self.versions[kind]
        try:
            if version is None:
                resp = call(self.namespace, label_selector=selector, _preload_content=False)
                listed = json.loads(resp.data)
                self._replace(kind, listed.get("items") or [])
                self.synced[kind].set()
                self.versions[kind] = str((listed.get("metadata") or {}).get("resourceVersion") or "")
            else:
                version, gone = self._watch(kind, call, selector, version)
                if gone:
                    log.info("watch of %ss: resourceVersion %s expired (410 Gone); re-listing", kind, version)
                self.versions[kind] = None if gone else version
        except Exception as exc:
            if self.stop.is_set():
                return None
            backoff = self.backoff[kind]
            log.warning("watch of %ss failed (%s: %s); re-listing in %.1fs", kind, type(exc).__name__, exc, backoff)
            self.versions[kind] = None
            self.backoff[kind] = min(backoff * 2, MAX_BACKOFF)
            return backoff
        self.backoff[kind] = INFORM_BACKOFF
        return 0.0

    def _watch(self, kind: str, call: Callable[..., Any], selector: str, version: str) -> tuple[str, bool]:
        """One watch request, until the server's timeout; (last resourceVersion seen, whether it was 410 Gone)."""
        resp = call(
            self.namespace,
            label_selector=selector,
            watch=True,
            resource_version=version or None,
            timeout_seconds=self.watch_timeout,
            allow_watch_bookmarks=True,
            _preload_content=False,
            _request_timeout=(10, self.watch_timeout + 30),
        )
        self.responses.add(resp)
        try:
            for line in iter_lines(resp):
                if self.stop.is_set():
                    return version, False
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    if obj.get("code") == 410:
                        return version, True
                    raise BackendError(f"watch error: {obj.get('reason')}: {obj.get('message')}", retryable=True)
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if event.get("type") != "BOOKMARK":
                    self.apply(kind, str(event.get("type")), obj)
        finally:
            self.responses.discard(resp)
            resp.release_conn()
        return version, False

    def _replace(self, kind: str, items: list[Obj]) -> None:
        """A list's answer: what the backend knows and the list lacks is deleted, the rest applied."""
        fresh = {str(o["metadata"]["name"]) for o in items}
        for old in self.known(kind):
            if str((old.get("metadata") or {}).get("name")) not in fresh:
                self.apply(kind, "DELETED", old)
        for obj in items:
            self.apply(kind, "MODIFIED", obj)

"""Shadow traffic: a copy of a service's predicts sent to its shadow version, whose answers are compared with the
ones the clients got (kiln.domain.shadow) and never returned.

Off the predict's critical path and bounded: the API hands a copy over once the client's answer is on its way (a
background task of the response), into a queue per service of at most ``QUEUE`` copies; one worker per service
sends them to a ready shadow replica, one at a time. A copy that finds the queue full (a shadow slower than the
traffic) or no ready shadow replica is dropped and counted: a slow shadow never slows the clients, nor holds
memory beyond its queue.
"""

from __future__ import annotations

import asyncio
import threading
import time

from kiln.domain.shadow import ShadowStats, compare
from kiln.routing.router import Router

QUEUE = 16


class Shadows:
    def __init__(self, router: Router, queue: int = QUEUE) -> None:
        self.router = router
        self.queue = queue
        self._lock = threading.Lock()
        self._queues: dict[str, asyncio.Queue[tuple[int, bytes, bytes, float]]] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._stats: dict[tuple[str, int], ShadowStats] = {}  # (service id, shadow version) → its figures

    def stats(self, service_id: str) -> dict[int, ShadowStats]:
        """Per shadow version of the service: its figures through this server since it started (copies)."""
        with self._lock:
            return {v: stats.copy() for (s, v), stats in self._stats.items() if s == service_id}

    def _of(self, service_id: str, version: int) -> ShadowStats:
        with self._lock:
            stats = self._stats.get((service_id, version))
            if stats is None:
                stats = self._stats[(service_id, version)] = ShadowStats()
            return stats

    async def copy(self, service_id: str, version: int, body: bytes, answered: bytes, timeout: float) -> None:
        """Queue a copy of a predict (its body, and the body the client got) for the shadow ``version``; dropped
        (counted) when the queue is full. Called on the event loop, after the client's answer went."""
        queue = self._queues.get(service_id)
        worker = self._workers.get(service_id)
        if queue is None or worker is None or worker.done() or worker.get_loop() is not asyncio.get_running_loop():
            queue = self._queues[service_id] = asyncio.Queue(self.queue)
            self._workers[service_id] = asyncio.get_running_loop().create_task(self._work(service_id, queue))
        try:
            queue.put_nowait((version, body, answered, timeout))
        except asyncio.QueueFull:
            self._of(service_id, version).dropped += 1

    async def _work(self, service_id: str, queue: asyncio.Queue[tuple[int, bytes, bytes, float]]) -> None:
        while True:
            version, body, answered, timeout = await queue.get()
            stats = self._of(service_id, version)
            endpoint = self.router._pick(service_id, set(), "shadow")
            if endpoint is None or endpoint.version != version:  # no ready replica of it (yet, or any more)
                if endpoint is not None:
                    self.router.release(endpoint)
                stats.dropped += 1
                continue
            started = time.monotonic()
            stats.copied += 1
            try:
                answer = await self.router._send(endpoint, body, timeout)
            except Exception:  # whatever it was, a shadow's failure is its own figure, never the client's
                self.router._done(endpoint, started, service_id=service_id, error=True)
                stats.errors += 1
                continue
            self.router._done(endpoint, started, service_id=service_id, error=answer.status >= 500)
            if answer.status != 200:
                stats.errors += 1
                continue
            compare(answered, answer.body, stats)

"""Kiln's request router for model services: forwards a predict to a ready replica of the service.

The serving task (kiln.tasks.serving) tells the router of the server that runs it which replicas are
ready (``add``), which drain (``drain``: no new requests) and which are gone (``remove``); every server's router
(that one's too) is also kept in step with what the database records of them (``sync``, from
kiln.tasks.serving_routes), so that any server on the database forwards predicts. A request goes to the ready
replica with the fewest requests in flight (least outstanding requests; ties to the one used longest ago). A
replica that fails mid-request (connection refused or reset, or it answers 502/503) is marked suspect and the
request is sent once more to another replica; a request with no ready replica waits for one up to the service's
request timeout (a cold start from zero replicas), then gets 503 with ``Retry-After``.

A service that runs a canary (kiln.domain.traffic_split) splits its replicas in two tracks: the API server chooses
a predict's track (or the model version it targets) and the router picks among that track's replicas only; a
canary with no replica to take it (still starting, or rolled back and draining) leaves its share to the stable ones.

A service whose backend runs its replicas itself (a Kubernetes Deployment behind a Service) is one endpoint with
a ``base_url`` per track (the stable one; a canary's and a shadow's, each a Deployment of its own, flagged as a
local canary's or shadow's replica is: kiln.tasks.serving_tracks): the cluster balances between a track's pods,
and a request that failed on it is retried once on the same URL (another pod answers it), where a local replica's
failure marks it suspect.

The router keeps per replica what it forwarded (requests, errors, latencies, batch sizes) for the serving task to
record into the metrics store, and process-wide aggregates for ``/metrics``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from kiln.domain.rollout import VersionStats
from kiln.domain.traffic_split import Track
from kiln.errors import NoReplica, PredictFailed
from kiln.routing.replica_http import ReplicaPool, ReplicaUnreachable

RETRY_AFTER_SECONDS = 5


@dataclass
class Endpoint:
    """A replica on this machine (``socket``: the path of its Unix socket, ``<jobs dir>/<job id>/work/<name>``)
    or a backend's own address for the service (``base_url``: a Kubernetes Service); one of the two."""

    replica_id: str
    job_id: str
    socket: str | None
    secret: str
    model: str  # NAME@VERSION it serves
    base_url: str | None = None
    canary: bool = False  # a canary's replica: only predicts the split sends to the canary (or target its version)
    shadow: bool = False  # a shadow's replica: only copies of predicts (kiln.routing.shadow), or those targeting it
    draining: bool = False
    in_flight: int = 0
    last_used: float = 0.0
    suspect_until: float = 0.0
    added_at: float = field(default_factory=time.monotonic)  # when the router learnt of it
    # What was forwarded since the serving task last took it (take_stats).
    requests: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if (self.socket is None) == (self.base_url is None):
            raise ValueError(f"replica {self.replica_id}: a socket or a base URL, one of the two")

    @property
    def version(self) -> int | None:
        """The model version it serves (the number after the ``@``)."""
        tail = self.model.rpartition("@")[2]
        return int(tail) if tail.isdigit() else None

    def serves(self, track: Track | Literal["shadow"] | None, version: int | None) -> bool:
        """Whether a predict of ``track`` (or targeting ``version``) may go to it; neither: any."""
        if version is not None:
            return self.version == version
        if self.shadow or track == "shadow":
            return self.shadow and track == "shadow"
        if track is not None:
            return self.canary == (track == "canary")
        return True


@dataclass
class Answer:
    status: int
    body: bytes
    model: str
    replica_id: str
    batch_size: int | None


class Router:
    def __init__(
        self,
        on_cold_start: Callable[[str], None] | None = None,
        *,
        latency_observer: Callable[[float], None] | None = None,
        batch_observer: Callable[[int], None] | None = None,
        track_observer: Callable[[str, float, bool], None] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._services: dict[str, dict[str, Endpoint]] = {}  # service id → replica id → endpoint
        self._changed: dict[str, asyncio.Event] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None
        self._local = ReplicaPool()
        self.on_cold_start = on_cold_start  # service id: it has no ready replica and a request waits
        self.last_request: dict[str, float] = {}  # service id → monotonic time of its last request
        self.requests: dict[str, int] = {}  # service id → predicts it was sent through this server
        # service id → why no replica of it can be reached from this server, if that is so (a NoReplica says it)
        self.why_unreachable: Callable[[str], str | None] | None = None
        # Process-wide aggregates (Prometheus: no tenant labels).
        self.total_requests = 0
        self.total_errors = 0
        self.latency_observer = latency_observer
        self.batch_observer = batch_observer
        self.track_observer = track_observer  # (track, seconds, error) of each forwarded predict
        # (service id, model version) → what it answered since this server started (counts and a fixed-bucket
        # latency histogram: bounded whatever the traffic), for the service read and a canary's rollout policy
        self._versions: dict[tuple[str, int], VersionStats] = {}

    # ---- what the serving task tells the router

    def add(self, service_id: str, endpoint: Endpoint) -> None:
        with self._lock:
            replicas = self._services.setdefault(service_id, {})
            known = replicas.get(endpoint.replica_id)
            if known is not None and (known.socket, known.secret, known.base_url) == (
                endpoint.socket,
                endpoint.secret,
                endpoint.base_url,
            ):
                known.draining = endpoint.draining
                known.model = endpoint.model  # a backend's endpoint rolls to another version in place
                known.canary = endpoint.canary  # a promoted canary's replica serves every predict
                known.shadow = endpoint.shadow
                return
            replicas[endpoint.replica_id] = endpoint
        self._notify(service_id)

    def sync(self, routes: dict[str, list[Endpoint]], read_since: float) -> None:
        """Match what the database records (``routes``: every service's routable replicas, from a read that began
        at monotonic ``read_since``). A replica it names is added (or marked draining: never back, a drained
        replica never serves again); one it does not name is removed, unless the router learnt of it after the
        read began (the serving task added it and records it now). A replica the router knows keeps its count of
        requests in flight and its statistics."""
        changed: list[str] = []
        with self._lock:
            for service_id in set(self._services) | set(routes):
                wanted = {e.replica_id: e for e in routes.get(service_id, [])}
                replicas = self._services.setdefault(service_id, {})
                for replica_id, known in list(replicas.items()):
                    if replica_id not in wanted and known.added_at < read_since:
                        del replicas[replica_id]
                for replica_id, endpoint in wanted.items():
                    have = replicas.get(replica_id)
                    if have is not None and (have.socket, have.secret, have.base_url) == (
                        endpoint.socket,
                        endpoint.secret,
                        endpoint.base_url,
                    ):
                        have.draining = have.draining or endpoint.draining
                        have.model = endpoint.model
                        have.canary = endpoint.canary
                        have.shadow = endpoint.shadow
                        continue
                    if have is not None and have.added_at >= read_since:
                        continue  # the serving task's own, newer than the read
                    replicas[replica_id] = endpoint
                    changed.append(service_id)
                if not replicas and service_id not in routes:
                    del self._services[service_id]
        for service_id in set(changed):
            self._notify(service_id)

    def drain(self, service_id: str, replica_id: str) -> None:
        with self._lock:
            endpoint = self._services.get(service_id, {}).get(replica_id)
            if endpoint is not None:
                endpoint.draining = True

    def remove(self, service_id: str, replica_id: str) -> None:
        with self._lock:
            self._services.get(service_id, {}).pop(replica_id, None)

    def forget(self, service_id: str) -> None:
        with self._lock:
            self._services.pop(service_id, None)
            self.last_request.pop(service_id, None)
            self.requests.pop(service_id, None)
            for key in [k for k in self._versions if k[0] == service_id]:
                del self._versions[key]

    def version_traffic(self, service_id: str) -> dict[int, VersionStats]:
        """Per model version of the service: what it answered through this server since it started (copies)."""
        with self._lock:
            return {v: stats.copy() for (s, v), stats in self._versions.items() if s == service_id}

    def traffic(self) -> dict[str, tuple[int, dict[str, int], int, float | None]]:
        """Per service predicted through this server: (requests in flight, the same per replica, predicts so far,
        monotonic time of the last)."""
        with self._lock:
            return {
                service_id: (
                    sum(e.in_flight for e in self._services.get(service_id, {}).values()),
                    {r: e.in_flight for r, e in self._services.get(service_id, {}).items() if e.in_flight},
                    count,
                    self.last_request.get(service_id),
                )
                for service_id, count in self.requests.items()
            }

    def in_flight(self, service_id: str, replica_id: str | None = None) -> int:
        with self._lock:
            replicas = self._services.get(service_id, {})
            if replica_id is not None:
                endpoint = replicas.get(replica_id)
                return endpoint.in_flight if endpoint is not None else 0
            return sum(e.in_flight for e in replicas.values())

    def ready(self, service_id: str) -> list[str]:
        with self._lock:
            return [r for r, e in self._services.get(service_id, {}).items() if not e.draining]

    def take_stats(self, service_id: str) -> dict[str, tuple[int, int, list[float], list[int]]]:
        """Per replica (requests, errors, latencies in seconds, batch sizes) since the last call."""
        out = {}
        with self._lock:
            for replica_id, e in self._services.get(service_id, {}).items():
                out[replica_id] = (e.requests, e.errors, e.latencies, e.batch_sizes)
                e.requests, e.errors, e.latencies, e.batch_sizes = 0, 0, [], []
        return out

    # ---- forwarding

    def _notify(self, service_id: str) -> None:
        loop, event = self._loop, self._changed.get(service_id)
        if loop is not None and event is not None:
            loop.call_soon_threadsafe(event.set)

    def _pick(
        self,
        service_id: str,
        avoid: set[str],
        track: Track | Literal["shadow"] | None = None,
        version: int | None = None,
    ) -> Endpoint | None:
        now = time.monotonic()
        with self._lock:
            candidates = [
                e
                for e in self._services.get(service_id, {}).values()
                if not e.draining and e.replica_id not in avoid and e.suspect_until <= now and e.serves(track, version)
            ]
            if not candidates:
                return None
            best = min(candidates, key=lambda e: (e.in_flight, e.last_used))
            best.in_flight += 1
            best.last_used = now
            return best

    def _has(self, service_id: str, track: Track, avoid: set[str]) -> bool:
        """Whether a replica of ``track`` could take a request now (as ``_pick`` would choose among them)."""
        now = time.monotonic()
        with self._lock:
            return any(
                e.serves(track, None) and not e.draining and e.replica_id not in avoid and e.suspect_until <= now
                for e in self._services.get(service_id, {}).values()
            )

    async def _wait_for_replica(
        self, service_id: str, avoid: set[str], deadline: float, track: Track | None, version: int | None
    ) -> Endpoint:
        self._loop = asyncio.get_running_loop()
        event = self._changed.setdefault(service_id, asyncio.Event())
        woken = False
        while True:
            if track == "canary" and not self._has(service_id, "canary", avoid):
                track = "stable"  # no canary replica (yet, or any more: rolled back): the stable ones answer
            endpoint = self._pick(service_id, avoid, track, version)
            if endpoint is not None:
                return endpoint
            if not woken and self.on_cold_start is not None:
                self.on_cold_start(service_id)  # scale from zero, or at least look at the replicas now
                woken = True
            left = deadline - time.monotonic()
            if left <= 0:
                why = self.why_unreachable(service_id) if self.why_unreachable is not None else None
                raise NoReplica(
                    why or "no ready replica of this service answered in time; retry later",
                    details={"retry_after": RETRY_AFTER_SECONDS},
                )
            event.clear()
            try:
                await asyncio.wait_for(event.wait(), timeout=min(left, 0.25))
            except TimeoutError:
                pass

    async def predict(
        self,
        service_id: str,
        body: bytes,
        timeout: float,
        *,
        track: Track | None = None,
        version: int | None = None,
    ) -> Answer:
        """Forward a predict body; one retry on another replica when the first one fails mid-request. With
        ``version`` only a replica of that model version answers (it waits for one); with ``track`` (the traffic
        split's choice) only the stable replicas, or the canary's — a canary with no ready replica yet leaves its
        share to the stable ones."""
        self.last_request[service_id] = time.monotonic()
        self.requests[service_id] = self.requests.get(service_id, 0) + 1
        deadline = time.monotonic() + timeout
        tried: set[str] = set()
        last_error = ""
        for _ in range(2):
            endpoint = await self._wait_for_replica(service_id, tried, deadline, track, version)
            if endpoint.base_url is None:  # a backend's Service: the retry goes there too, to another pod
                tried.add(endpoint.replica_id)
            started = time.monotonic()
            try:
                answer = await self._send(endpoint, body, max(0.1, deadline - started))
            except (httpx.TransportError, ReplicaUnreachable) as exc:
                last_error = f"replica {endpoint.replica_id}: {type(exc).__name__}"
                self._done(endpoint, started, service_id=service_id, error=True, suspect=endpoint.base_url is None)
                continue
            if answer.status in (502, 503):  # the replica is going away: another one may answer
                last_error = f"replica {endpoint.replica_id} answered {answer.status}"
                self._done(endpoint, started, service_id=service_id, error=True, suspect=endpoint.base_url is None)
                continue
            self._done(endpoint, started, service_id=service_id, error=answer.status >= 500, batch=answer.batch_size)
            return answer
        self.total_errors += 1
        raise PredictFailed(f"the replicas failed to answer ({last_error}); retry later")

    async def _send(self, endpoint: Endpoint, body: bytes, timeout: float) -> Answer:
        headers = {"Authorization": f"Bearer {endpoint.secret}", "Content-Type": "application/json"}
        if endpoint.socket is not None:  # a replica on this machine: the lean client, over its Unix socket
            status, answer_headers, content = await self._local.post(
                endpoint.socket, "/predict", headers, body, timeout
            )
        else:  # a backend's own address (a Kubernetes Service)
            assert endpoint.base_url is not None
            if self._client is None:
                limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
                self._client = httpx.AsyncClient(limits=limits, trust_env=False)
            url = f"{endpoint.base_url.rstrip('/')}/predict"
            response = await self._client.post(url, content=body, headers=headers, timeout=timeout)
            status, answer_headers, content = response.status_code, dict(response.headers), response.content
        batch = answer_headers.get("x-kiln-batch-size")
        return Answer(
            status, content, endpoint.model, endpoint.replica_id, int(batch) if batch and batch.isdigit() else None
        )

    def release(self, endpoint: Endpoint) -> None:
        """A replica ``_pick`` chose is not sent the request after all."""
        with self._lock:
            endpoint.in_flight -= 1

    def _done(
        self,
        endpoint: Endpoint,
        started: float,
        *,
        error: bool = False,
        suspect: bool = False,
        batch: int | None = None,
        service_id: str | None = None,
    ) -> None:
        elapsed = time.monotonic() - started
        with self._lock:
            if service_id is not None and endpoint.version is not None:
                # one entry per version this server forwarded to: bounded by the versions the service ran
                stats = self._versions.get((service_id, endpoint.version))
                if stats is None:
                    stats = self._versions[(service_id, endpoint.version)] = VersionStats()
                stats.observe(elapsed, error, started + elapsed)
            endpoint.in_flight -= 1
            endpoint.requests += 1
            endpoint.errors += int(error)
            if len(endpoint.latencies) < 100_000:
                endpoint.latencies.append(elapsed)
            if batch is not None and len(endpoint.batch_sizes) < 100_000:
                endpoint.batch_sizes.append(batch)
            if suspect:
                endpoint.suspect_until = time.monotonic() + 2.0
        if self.track_observer is not None:
            self.track_observer(
                "shadow" if endpoint.shadow else "canary" if endpoint.canary else "stable", elapsed, error
            )
        if endpoint.shadow:
            return  # a copy: not a predict the clients sent
        self.total_requests += 1
        self.total_errors += int(error)
        if self.latency_observer is not None:
            self.latency_observer(elapsed)
        if batch is not None and self.batch_observer is not None:
            self.batch_observer(batch)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()


def outputs_of(answer: Answer) -> Any:
    """The replica's JSON answer, or a PredictFailed naming what it sent."""
    try:
        return json.loads(answer.body)
    except ValueError:
        raise PredictFailed(f"replica {answer.replica_id} answered something that is not JSON") from None

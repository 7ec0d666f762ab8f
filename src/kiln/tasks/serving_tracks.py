"""A deployed service's canary and shadow (issue 48), for a backend that runs a service's replicas itself
(:class:`~kiln.backends.capabilities.ServiceDeployer`: on Kubernetes each track is a Deployment behind a Service of
its own). Part of the ``serving`` task's :class:`kiln.tasks.serving_deployed.DeployedServices`.

Kiln's router does the weighting, as for the local executor's replicas: each track is one endpoint of the router
(``<service id>-canary``, ``<service id>-shadow``), flagged canary or shadow, so that the traffic split
(kiln.domain.traffic_split), sticky keys, a targeted version and the shadow's copies work the same, and the
router counts each version's figures for the rollout policy. Where every server routes each track is recorded in
``services.route_tracks`` (kiln.tasks.serving_routes), before this server's router routes it.

Each run, for each track:

- while the service has a canary (shadow): **apply** the track (the canary's version with ``canary_replicas``; the
  shadow's with one replica) when it changed, read how many of its replicas are ready, and **route** it while one
  is;
- once it has none: **retire** the applied track. A **promoted** canary (its version is now the stable version's)
  goes on answering as a stable endpoint until the stable track's new revision has all its wanted replicas ready;
  a rolled-back (or ended) one stops being routed at once. Then, its route gone from the row and from this
  router (drained: no new request), and no request in flight on it through any live server, it is **deleted**.

Each backend call comes right after ``ctx.fence()`` and each write is in the run's fenced transaction.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kiln.auth.secrets import SecretBox
from kiln.backends.capabilities import DeployTrack, ServiceAddress, ServiceDeployer
from kiln.db.tables import Service
from kiln.domain.serving import ServiceSpec, ServiceState
from kiln.errors import KilnError
from kiln.routing.router import Endpoint, Router
from kiln.tasks.runner import TaskContext

log = logging.getLogger(__name__)

MAX_BACKOFF = 60.0
READY_INTERVAL = 2.0
TRACKS: tuple[DeployTrack, ...] = ("canary", "shadow")


@dataclass
class _Track:
    key: tuple[int, int, int]  # (revision, model version, replicas) as last applied
    address: ServiceAddress
    version: int
    model: str  # NAME@VERSION
    ready: int = 0
    read_at: float = 0.0
    routed: str | None = None  # the role it is routed as (canary, shadow, stable), None: not routed
    retiring: bool = False  # no longer wanted: its route goes, then its objects


class DeployedTracks:
    """Keeps each deployed service's canary and shadow tracks applied, routed, and deleted once they end."""

    def __init__(
        self,
        backend: ServiceDeployer,
        router: Router,
        box: SecretBox | None,
        in_flight: Callable[[str, str], int],
    ) -> None:
        self.backend = backend
        self.router = router
        self.box = box
        self.in_flight = in_flight  # (service id, endpoint id) → requests in flight through every live server
        self._tracks: dict[tuple[str, DeployTrack], _Track] = {}
        self._failures: dict[tuple[str, DeployTrack], tuple[int, float]] = {}
        # Tracks of a service this server has not seen running: deleted once (idempotent) in case a server before
        # this one ended them and stopped before it deleted them.
        self._swept: set[tuple[str, DeployTrack]] = set()

    def drive(self, ctx: TaskContext, service: Service, spec: ServiceSpec, stable_settled: bool) -> None:
        """``stable_settled``: the stable track's current revision has its wanted replicas ready."""
        routes: dict[DeployTrack, dict[str, Any]] = {}
        for track in TRACKS:
            route = self._drive(ctx, service, spec, track, stable_settled)
            if route is not None:
                routes[track] = route
        self._record(ctx, service, routes)
        for track in TRACKS:
            state = self._tracks.get((service.id, track))
            if state is None:
                continue
            endpoint_id = f"{service.id}-{track}"
            if state.routed is not None:
                self.router.add(
                    service.id,
                    Endpoint(
                        endpoint_id,
                        "",
                        None,
                        state.address.secret,
                        state.model,
                        base_url=state.address.url,
                        canary=state.routed == "canary",
                        shadow=state.routed == "shadow",
                    ),
                )
            elif state.retiring:
                self.router.drain(service.id, endpoint_id)  # after its row says so: no server routes it back
                if self.in_flight(service.id, endpoint_id) == 0:
                    self._delete(ctx, service, track)
            else:
                self.router.remove(service.id, endpoint_id)

    def forget(self, service_id: str) -> None:
        for track in TRACKS:
            self._tracks.pop((service_id, track), None)
            self._failures.pop((service_id, track), None)
            self._swept.discard((service_id, track))

    def _wanted(self, service: Service, track: DeployTrack) -> tuple[int, int] | None:
        """(model version, replicas) the track runs now; None: the service has none."""
        if service.state == ServiceState.DELETING:
            return None
        if track == "canary":
            return (service.canary_version, service.canary_replicas) if service.canary_version is not None else None
        return (service.shadow_version, 1) if service.shadow_version is not None else None

    def _drive(
        self, ctx: TaskContext, service: Service, spec: ServiceSpec, track: DeployTrack, stable_settled: bool
    ) -> dict[str, Any] | None:
        """Apply, read and choose how the track is routed; its route as the row records it (None: not routed)."""
        wanted = self._wanted(service, track)
        state = self._tracks.get((service.id, track))
        if wanted is None:
            if state is None:
                if (service.id, track) not in self._swept and self._delete(ctx, service, track):
                    self._swept.add((service.id, track))
                return None
            promoted = track == "canary" and state.version == service.model_version and not state.retiring
            if promoted and not stable_settled and state.routed is not None:
                state.routed = "stable"  # answers with the stable track until its new replicas are ready
            else:
                state.routed, state.retiring = None, True
            return self._route(state)
        version, replicas = wanted
        state = self._apply(ctx, service, spec, track, version, replicas)
        if state is None:
            return None
        now = time.monotonic()
        if state.ready < replicas or now - state.read_at >= READY_INTERVAL:
            try:
                ctx.fence()
                state.ready = self.backend.service_ready(service.id, track)
                state.read_at = now
            except KilnError as exc:
                log.warning("service %s: reading its %s's readiness failed: %s", service.id, track, exc.message)
        state.routed = track if state.ready > 0 else None
        return self._route(state)

    def _route(self, state: _Track) -> dict[str, Any] | None:
        if state.routed is None or self.box is None:
            return None
        return {"url": state.address.url, "model": state.model, "role": state.routed}

    def _apply(
        self, ctx: TaskContext, service: Service, spec: ServiceSpec, track: DeployTrack, version: int, replicas: int
    ) -> _Track | None:
        key = (service.revision, version, replicas)
        previous = self._tracks.get((service.id, track))
        if previous is not None and previous.key == key and not previous.retiring:
            return previous
        count, not_before = self._failures.get((service.id, track), (0, 0.0))
        if time.monotonic() < not_before:
            return previous if previous is not None and not previous.retiring else None
        model = f"{service.model_name}@{version}"
        wanted = spec.model_copy(update={"model": model, "replicas": replicas, "autoscale": None})
        ctx.fence()
        try:
            address = self.backend.apply_service(
                service.id,
                service.org_id,
                wanted,
                (service.model_name, version),
                service.revision,
                service.code_sha256,
                track=track,
            )
        except KilnError as exc:
            log.warning("service %s: applying its %s (%s) failed: %s", service.id, track, model, exc.message)
            self._failures[(service.id, track)] = (count + 1, time.monotonic() + min(MAX_BACKOFF, 2.0**count))
            return previous if previous is not None and not previous.retiring else None
        self._failures.pop((service.id, track), None)
        same = previous is not None and previous.version == version and not previous.retiring
        state = _Track(key, address, version, model, ready=previous.ready if same and previous else 0)
        self._tracks[(service.id, track)] = state
        return state

    def _record(self, ctx: TaskContext, service: Service, routes: dict[DeployTrack, dict[str, Any]]) -> None:
        """The tracks' routes every server routes to, written when they changed (the secret sealed anew only
        then)."""
        if self.box is None:
            return
        have = {
            track: {k: v for k, v in route.items() if k != "secret"}
            for track, route in (service.route_tracks or {}).items()
            if isinstance(route, dict)
        }
        if have == routes:
            return
        sealed: dict[str, Any] = {}
        for track, route in routes.items():
            state = self._tracks[(service.id, track)]
            sealed[track] = {**route, "secret": self.box.seal(state.address.secret)}
        with ctx.transaction() as s:
            row = s.get(Service, service.id)
            if row is None or row.state == ServiceState.DELETING:
                return
            row.route_tracks = sealed or None
        service.route_tracks = sealed or None

    def _delete(self, ctx: TaskContext, service: Service, track: DeployTrack) -> bool:
        ctx.fence()
        try:
            self.backend.delete_service(service.id, track)
        except KilnError as exc:  # the next run tries again
            log.warning("service %s: deleting its %s failed: %s", service.id, track, exc.message)
            return False
        self.router.remove(service.id, f"{service.id}-{track}")
        if self._tracks.pop((service.id, track), None) is not None:
            log.info("service %s: its %s is deleted", service.id, track)
        return True

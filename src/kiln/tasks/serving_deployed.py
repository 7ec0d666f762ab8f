"""The serving task's part for a backend that runs a service's replicas itself
(:class:`~kiln.backends.capabilities.ServiceDeployer`: on Kubernetes a Deployment behind a Service, with an HPA
when it autoscales), where the local executor runs each replica as a job (kiln.tasks.serving).

Each run, for each service:

1. **Apply** the service when what it asks of the backend changed since the last apply (and once after a server
   start: applying the same again changes nothing): a new revision (model version, spec) is rolled out by the
   backend, one replica at a time; a scale sets the replicas (with ``autoscale`` the backend's autoscaler owns
   them, between min and max). A failed apply is retried with a growing back-off; meanwhile the service is
   DEGRADED with the backend's error, and what was applied before keeps serving.
2. **Observe** how many replicas of the applied revision are ready (``service_ready``).
3. **Route**: the router gets the backend's address as one endpoint while a replica is ready, and keeps it while
   a change rolls out and the replicas it had go on serving (a rolling update's old ones); with none ready and
   nothing rolling out (scaled to zero, every replica gone) it drops it, so that a request waits for a replica
   (a cold start) and then gets 503, rather than a refused connection.
4. **State**: READY once the wanted replicas are ready; DEPLOYING (UPDATING for a new revision of a service that
   was serving) until then; DEGRADED when fewer are ready than were; IDLE at zero.

Each backend call comes right after ``ctx.fence()`` and each write is in the run's fenced transaction: a server
that stalled past the serving task's lease and resumed after another took it applies, deletes and writes nothing.

A canary and a shadow are tracks of their own (kiln.tasks.serving_tracks: a second and a third deployment, each an
endpoint of the router, which splits between them as between local replicas); a canary's rollout policy is judged
from the router's per-version figures as for local replicas (kiln.tasks.serving_rollout).

The backend has no per-replica rows or jobs here: a service's replicas are the cluster's pods, so the API lists
none and the router's per-replica request statistics are not recorded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from kiln.auth.secrets import SecretBox
from kiln.backends.capabilities import ServiceAddress, ServiceDeployer
from kiln.db.session import Database
from kiln.db.tables import Service, utcnow
from kiln.domain.rollout import VersionStats
from kiln.domain.serving import ServiceSpec, ServiceState
from kiln.errors import KilnError
from kiln.routing.router import Endpoint, Router
from kiln.tasks.runner import TaskContext
from kiln.tasks.serving_rollout import Rollouts
from kiln.tasks.serving_tracks import DeployedTracks
from kiln.usecases.notifications import notification_events

log = logging.getLogger(__name__)

MAX_BACKOFF = 60.0
READY_INTERVAL = 2.0  # how often a settled service's readiness is read from the backend


@dataclass
class _Applied:
    key: tuple[int, int | None]  # (revision, replicas; None: the backend autoscales) as last applied
    address: ServiceAddress
    model: str  # NAME@VERSION of that revision
    rolling: bool = False  # a new revision of a service that was serving
    settled: bool = False  # its wanted replicas have been ready since it was applied
    serving: bool = False  # the router sends it requests
    read_at: float = 0.0  # when its readiness was last read
    ready: int = 0


class DeployedServices:
    """Keeps each service applied to a :class:`ServiceDeployer` backend, routed and its state told."""

    def __init__(
        self,
        db: Database,
        backend: ServiceDeployer,
        router: Router,
        backend_name: str = "",
        box: SecretBox | None = None,
        rollouts: Rollouts | None = None,
        in_flight: Callable[[str, str], int] | None = None,
    ) -> None:
        self.db = db
        self.box = box  # the address is recorded on the service's row (secret sealed) for every server's router
        self.backend = backend
        self.router = router
        self.backend_name = backend_name
        self._applied: dict[str, _Applied] = {}  # service id → what was applied last
        self._failures: dict[str, tuple[int, float, str]] = {}  # service id → (failed applies, not before, why)
        self.rollouts = rollouts  # a canary's rollout policy (None: none judged)
        # (service id, endpoint id) → requests in flight on it through every live server (default: this one's)
        self.tracks = DeployedTracks(backend, router, box, in_flight or router.in_flight)

    def drive(self, ctx: TaskContext, service_id: str, remote: dict[int, VersionStats] | None = None) -> None:
        """``remote``: what the other live servers forwarded per model version of the service (the rollout
        policy's figures with this router's)."""
        with self.db.read() as s:
            service = s.get(Service, service_id)
            if service is None:
                return
            s.expunge(service)
        if service.state == ServiceState.DELETING:
            self._delete(ctx, service)
            return
        spec = ServiceSpec.model_validate(service.spec)
        applied = self._apply(ctx, service, spec)
        if applied is None:  # never applied yet, and the backend refused or failed
            self._update_state(ctx, service, ServiceState.DEGRADED, self._failures[service.id][2])
            return
        now = time.monotonic()
        if not applied.settled or now - applied.read_at >= READY_INTERVAL:
            try:
                ctx.fence()
                applied.ready = self.backend.service_ready(service.id)
                applied.read_at = now
            except KilnError as exc:
                log.warning("service %s: reading its readiness failed: %s", service.id, exc.message)
                return
        wanted = max(1, spec.autoscale.min) if spec.autoscale is not None else service.desired_replicas
        ready = applied.ready
        applied.settled = applied.settled or ready >= wanted
        if ready > 0 or (applied.serving and not applied.settled):
            endpoint = Endpoint(
                service.id, "", None, applied.address.secret, applied.model, base_url=applied.address.url
            )
            self._record_route(ctx, service, applied.address, applied.model)  # first: see serving_control
            self.router.add(service.id, endpoint)
            applied.serving = True
        else:
            self._record_route(ctx, service, None, "")
            self.router.remove(service.id, service.id)
            applied.serving = False
        # A canary and a shadow: after the stable track (they use its secret); a promoted canary answers until the
        # stable track's new revision is ready.
        self.tracks.drive(ctx, service, spec, applied.settled and applied.key[0] == service.revision)
        self.router.take_stats(service.id)  # per-replica statistics go to replica jobs; there are none here
        self._update_state(ctx, service, *self._state(service, applied, wanted))
        if self.rollouts is not None:
            self.rollouts.drive(ctx, service, remote)

    # ---- 1. apply

    def _apply(self, ctx: TaskContext, service: Service, spec: ServiceSpec) -> _Applied | None:
        """What is applied now: applied again if the service changed (or after a server start); the previous
        apply (None if none) while a failed one waits for its back-off."""
        key = (service.revision, None if spec.autoscale is not None else service.desired_replicas)
        previous = self._applied.get(service.id)
        if previous is not None and previous.key == key:
            return previous
        count, not_before, _ = self._failures.get(service.id, (0, 0.0, ""))
        if time.monotonic() < not_before:
            return previous
        # A fixed service's replicas are its desired count (a cold start raises it above the spec's 0).
        wanted = spec if spec.autoscale is not None else spec.model_copy(update={"replicas": service.desired_replicas})
        model = (service.model_name, service.model_version)
        ctx.fence()
        try:
            address = self.backend.apply_service(
                service.id, service.org_id, wanted, model, service.revision, service.code_sha256
            )
        except KilnError as exc:
            why = f"applying revision {service.revision} failed: {exc.message}"
            log.warning("service %s: %s", service.id, why)
            self._failures[service.id] = (count + 1, time.monotonic() + min(MAX_BACKOFF, 2.0**count), why)
            return previous
        self._failures.pop(service.id, None)
        rolling = previous is not None and previous.serving and previous.key[0] != service.revision
        applied = _Applied(
            key,
            address,
            f"{service.model_name}@{service.model_version}",
            rolling=rolling or (previous is not None and previous.rolling and not previous.settled),
            serving=previous.serving if previous is not None else False,
        )
        self._applied[service.id] = applied
        return applied

    def _record_route(self, ctx: TaskContext, service: Service, address: ServiceAddress | None, model: str) -> None:
        """The address every server routes to (kiln.tasks.serving_routes), written when it changed."""
        if self.box is None:
            return
        url = address.url if address is not None else None
        if (service.route_url, service.route_model or "") == (url, model if address is not None else ""):
            return
        with ctx.transaction() as s:
            row = s.get(Service, service.id)
            if row is None or row.state == ServiceState.DELETING:
                return
            row.route_url = url
            row.route_secret = self.box.seal(address.secret) if address is not None else None
            row.route_model = model if address is not None else None
        service.route_url, service.route_model = url, model if address is not None else None

    # ---- 4. state

    def _state(self, service: Service, applied: _Applied, wanted: int) -> tuple[ServiceState, str]:
        ready = applied.ready
        where = f" ({self.backend_name})" if self.backend_name else ""
        failure = self._failures.get(service.id)
        if failure is not None:
            return ServiceState.DEGRADED, failure[2]
        if wanted == 0 and ready == 0:
            return ServiceState.IDLE, ""
        if ready >= wanted:
            return ServiceState.READY, f"{ready} of {wanted} replicas ready{where}"
        if not applied.settled:
            if applied.rolling:
                return ServiceState.UPDATING, f"rolling out revision {service.revision}: {ready} of {wanted} new ready"
            return ServiceState.DEPLOYING, f"{ready} of {wanted} replicas ready{where}"
        return ServiceState.DEGRADED, f"{ready} of {wanted} replicas ready{where}"

    def _update_state(self, ctx: TaskContext, service: Service, state: ServiceState, message: str) -> None:
        if state == service.state and message == (service.message or ""):
            return
        with ctx.transaction() as s:
            row = s.get(Service, service.id)
            if row is not None and row.state != ServiceState.DELETING:
                was, row.state = row.state, state
                row.message = message
                row.updated_at = utcnow()
                notification_events.service_state_changed(s, row, was)  # unhealthy, recovered

    # ---- deletion

    def _delete(self, ctx: TaskContext, service: Service) -> None:
        ctx.fence()
        try:
            self.backend.delete_service(service.id)
        except KilnError as exc:  # the next run tries again; the row stays DELETING until then
            log.warning("service %s: deleting it from the backend failed: %s", service.id, exc.message)
            return
        self.router.forget(service.id)
        self.tracks.forget(service.id)
        self._applied.pop(service.id, None)
        self._failures.pop(service.id, None)
        with ctx.transaction() as s:
            row = s.get(Service, service.id)
            if row is not None:
                s.delete(row)

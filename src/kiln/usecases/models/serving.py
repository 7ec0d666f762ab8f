"""Model services' use cases: deploy, read, list, update (roll out or scale), delete, tokens, predict. They record
intent; the ``serving`` task (kiln.tasks.serving) runs the replicas and the router forwards."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from kiln.db.session import Database
from kiln.db.tables import Job, Organization, Service, ServiceKey, ServiceReplica, User, utcnow
from kiln.domain import tracking
from kiln.domain.ids import new_id
from kiln.domain.rollout import RolloutPolicy, VersionStats
from kiln.domain.serving import (
    MODEL_DIR,
    CanaryRead,
    ReplicaRead,
    ReplicaState,
    RolloutEvent,
    ServiceRead,
    ServiceSpec,
    ServiceState,
    ServiceSubmit,
    ServiceToken,
    ServiceUpdate,
    ShadowRead,
    VersionTraffic,
    replica_params,
)
from kiln.domain.shadow import ShadowStats
from kiln.domain.spec import JobSpec
from kiln.domain.stored_spec import SERVICE_LABEL
from kiln.domain.traffic_split import Split
from kiln.errors import Conflict, InvalidInput, KilnError, NotFound
from kiln.usecases.access.idempotency import Idempotency, IdempotentRequest, Remember
from kiln.usecases.access.identity import AuthFailure, Principal
from kiln.usecases.jobs.jobs import JobService
from kiln.usecases.models import rollout

CATEGORY = "serve"  # the quota category replicas count against
TOKEN_PREFIX = "kst"
ACTIVE_REPLICAS = (ReplicaState.STARTING, ReplicaState.READY, ReplicaState.DRAINING)
FAILED_SHOWN = timedelta(minutes=10)


def replica_read(replica: ServiceReplica, job_state: str | None, in_flight: int) -> ReplicaRead:
    return ReplicaRead(
        id=replica.id,
        job_id=replica.job_id,
        job_state=job_state,
        revision=replica.revision,
        state=ReplicaState(replica.state),
        model_version=replica.model_version,
        canary=replica.canary,
        shadow=replica.shadow,
        in_flight=in_flight,
        message=replica.message,
        created_at=replica.created_at,
        ready_at=replica.ready_at,
    )


def replica_spec(spec: ServiceSpec, service_id: str, replica_id: str, model: str, version: int) -> JobSpec:
    """The job a replica runs: ``kiln.injob.serve`` over the model version staged at /model, on the service's
    ``runtime.python`` where it names one (there may be no ``python`` beside it: Debian's /usr/bin/python3)."""
    params = replica_params(spec, (model, version))
    return JobSpec.model_validate(
        {
            "name": f"{spec.name}-replica"[:128],
            "command": [spec.runtime.python or "python", "-m", "kiln.injob.serve"],
            "runtime": spec.runtime.model_dump(exclude_none=True),
            "resources": spec.resources.model_dump(exclude_none=True),
            "env": spec.env,
            "labels": {**spec.labels, SERVICE_LABEL: service_id, "kiln-replica": replica_id},
            "params": params,
            "inputs": [{"model": f"{model}@{version}", "path": MODEL_DIR}],
            "metrics": {"builtin": False, "system": True},
            "experiment": tracking.SERVICES_EXPERIMENT,  # not a run among the team's trainings
        }
    )


def canary_read(service: Service) -> CanaryRead | None:
    if service.canary_version is None:
        return None
    policy = RolloutPolicy.model_validate(service.canary_policy) if service.canary_policy else None
    return CanaryRead(
        model_version=service.canary_version,
        weight=service.canary_weight,
        replicas=service.canary_replicas,
        policy=policy,
        step_at=service.canary_step_at,
    )


def shadow_read(service: Service, stats: dict[int, ShadowStats], traffic: dict[int, VersionStats]) -> ShadowRead | None:
    version = service.shadow_version
    if version is None:
        return None
    figures, latency = stats.get(version, ShadowStats()), traffic.get(version, VersionStats())
    rate, diff = figures.agreement_rate, figures.mean_abs_diff
    return ShadowRead(
        model_version=version,
        copied=figures.copied,
        dropped=figures.dropped,
        errors=figures.errors,
        compared=figures.instances,
        agreement_rate=round(rate, 6) if rate is not None else None,
        mean_abs_diff=diff,
        latency_ms_p50=_ms(latency.percentile_ms(0.5)),
        latency_ms_p99=_ms(latency.percentile_ms(0.99)),
    )


def _ms(value: float | None) -> float | None:
    return round(value, 3) if value is not None else None


def versions_read(service: Service, traffic: dict[int, VersionStats]) -> list[VersionTraffic]:
    """The stable and canary versions, and any other this server's router forwarded to (a retired one)."""
    served = {service.model_version: "stable"}
    if service.canary_version is not None:
        served[service.canary_version] = "canary"
    if service.shadow_version is not None:
        served[service.shadow_version] = "shadow"
    out = []
    now = time.monotonic()
    for version in sorted(set(served) | set(traffic)):
        stats = traffic.get(version, VersionStats())
        out.append(
            VersionTraffic(
                model_version=version,
                role=served.get(version, "retired"),  # type: ignore[arg-type]
                requests=stats.requests,
                errors=stats.errors,
                error_rate=round(stats.error_rate, 6) if stats.error_rate is not None else None,
                requests_per_second=round(stats.rate(now), 3),
                latency_ms_mean=_ms(stats.mean_ms),
                latency_ms_p50=_ms(stats.percentile_ms(0.5)),
                latency_ms_p99=_ms(stats.percentile_ms(0.99)),
            )
        )
    return out


class ServingService:
    def __init__(
        self,
        db: Database,
        jobs: JobService,
        resolve_model: Callable[[str, str], tuple[str, int]],
        wake: Callable[[], None],
        in_flight: Callable[[str, str], int],
        endpoint: str,
        idempotency: Idempotency | None = None,
        traffic: Callable[[str], dict[int, VersionStats]] | None = None,
        shadow_traffic: Callable[[str], dict[int, ShadowStats]] | None = None,
    ) -> None:
        self.db = db
        self.jobs = jobs
        self.idempotency = idempotency or jobs.idempotency  # the Idempotency-Keys of creates
        self.resolve_model = resolve_model  # (org id, NAME@REF) → (name, version) or NotFound
        self.wake = wake  # the serving task
        self.in_flight = in_flight  # (service id, replica id) → requests in flight (the router's)
        self.endpoint = endpoint.rstrip("/")
        # service id → model version → what it answered through this server's router
        self.traffic = traffic or (lambda service_id: {})
        self.shadow_traffic = shadow_traffic or (lambda service_id: {})  # service id → shadow version → figures

    # ---- reading

    def load(self, s: Session, principal: Principal, name: str, *, lock: bool = False) -> Service:
        query = select(Service).where(Service.name == name, Service.state != ServiceState.DELETING)
        query = query.where(Service.org_id == principal.org_id)
        if principal.service_id is not None:
            query = query.where(Service.id == principal.service_id)
        if lock and self.db.dialect == "postgresql":
            query = query.with_for_update()
        service = s.scalar(query)
        if service is None:  # the same answer whether it does not exist or is another organisation's
            raise NotFound(f"service {name} not found")
        return service

    def _read(self, s: Session, service: Service) -> ServiceRead:
        # The live replicas, and those that failed in the last FAILED_SHOWN (a model that did not load shows).
        shown = or_(
            ServiceReplica.state.in_([str(x) for x in ACTIVE_REPLICAS]),
            and_(ServiceReplica.state == ReplicaState.FAILED, ServiceReplica.ended_at > utcnow() - FAILED_SHOWN),
        )
        rows = s.execute(
            select(ServiceReplica, Job.state)
            .outerjoin(Job, Job.id == ServiceReplica.job_id)
            .where(ServiceReplica.service_id == service.id, shown)
            .order_by(ServiceReplica.created_at)
        ).all()
        replicas = [replica_read(r, state, self.in_flight(service.id, r.id)) for r, state in rows]
        ready = sum(
            r.state == ReplicaState.READY and r.revision == service.revision and not (r.canary or r.shadow)
            for r in replicas
        )
        traffic = self.traffic(service.id)
        return ServiceRead(
            id=service.id,
            name=service.name,
            org_id=service.org_id,
            user_id=service.user_id,
            state=ServiceState(service.state),
            message=service.message,
            spec=ServiceSpec.model_validate(service.spec),
            model_name=service.model_name,
            model_version=service.model_version,
            revision=service.revision,
            canary=canary_read(service),
            shadow=shadow_read(service, self.shadow_traffic(service.id), traffic),
            versions=versions_read(service, traffic),
            rollout_events=[RolloutEvent.model_validate(e) for e in service.rollout_events or []],
            desired_replicas=service.desired_replicas,
            ready_replicas=ready,
            replicas=replicas,
            endpoint=f"{self.endpoint}/api/v1/services/{service.name}/predict",
            created_at=service.created_at,
            updated_at=service.updated_at,
        )

    def get(self, principal: Principal, name: str) -> ServiceRead:
        principal.require("services:read")
        with self.db.read() as s:
            return self._read(s, self.load(s, principal, name))

    def list_services(self, principal: Principal) -> list[ServiceRead]:
        principal.require("services:read")
        with self.db.read() as s:
            query = select(Service).where(Service.state != ServiceState.DELETING).order_by(Service.name)
            if not principal.platform_admin:
                query = query.where(Service.org_id == principal.org_id)
            return [self._read(s, x) for x in s.scalars(query)]

    def route(self, principal: Principal, name: str) -> tuple[str, float, Split]:
        """(service id, request timeout, traffic split) of a service the caller may predict on."""
        principal.require("services:predict")
        with self.db.read() as s:
            service = self.load(s, principal, name)
            split = Split(service.model_version, service.canary_version, service.canary_weight, service.shadow_version)
            return service.id, float(service.spec.get("request_timeout", 60.0)), split

    # ---- changing

    def _check(self, principal: Principal, spec: ServiceSpec, code_sha256: str | None) -> tuple[str, int]:
        """Every check a deploy makes: the model, the predictor's code, a replica's spec as a job submit."""
        name, version = self.resolve_model(principal.org_id, spec.model)
        if spec.predictor.type == "custom" and code_sha256 is None:
            raise InvalidInput(
                "code_sha256: a custom predictor needs the code bundle holding its class",
                details={"field": "code_sha256"},
            )
        try:
            replica = replica_spec(spec, "svc", "rep", name, version)
            self.jobs.check_submit(principal, replica, code_sha256, category=CATEGORY)
        except KilnError as exc:
            if isinstance(exc, InvalidInput):
                raise InvalidInput(f"replica: {exc.message}", details={"field": "spec"}) from None
            raise
        return name, version

    def create(
        self, principal: Principal, body: ServiceSubmit, idempotency: IdempotentRequest | None = None
    ) -> ServiceRead:
        """A new service (409 when the organisation has one of that name). With ``idempotency`` (the request's
        Idempotency-Key), a repeat of the same request answers the service the first one created, as it is now
        (the same service: same id), rather than a 409."""
        principal.require("services:write")
        return self.idempotency.create(
            principal, idempotency, "service", lambda remember: self._create(principal, body, remember), self._by_id
        )

    def _by_id(self, s: Session, service_id: str) -> ServiceRead | None:
        service = s.get(Service, service_id)
        if service is None or service.state == ServiceState.DELETING:
            return None
        return self._read(s, service)

    def _create(self, principal: Principal, body: ServiceSubmit, remember: Remember) -> ServiceRead:
        spec = body.spec
        name, version = self._check(principal, spec, body.code_sha256)
        now = utcnow()
        with self.db.transaction() as s:
            taken = s.scalar(select(Service).where(Service.org_id == principal.org_id, Service.name == spec.name))
            if taken is not None:
                raise Conflict(f"service {spec.name} exists; update it with PATCH /api/v1/services/{spec.name}")
            service = Service(
                id=new_id("svc"),
                org_id=principal.org_id,
                user_id=principal.user_id,
                name=spec.name,
                spec=spec.model_dump(mode="json", by_alias=True),
                code_sha256=body.code_sha256,
                state=ServiceState.DEPLOYING if spec.min_replicas else ServiceState.IDLE,
                message="",
                model_name=name,
                model_version=version,
                revision=1,
                desired_replicas=spec.min_replicas,
                created_at=now,
                updated_at=now,
            )
            s.add(service)
            s.flush()
            remember(s, service.id)
            read = self._read(s, service)
        self.wake()
        return read

    def update(self, principal: Principal, name: str, body: ServiceUpdate) -> ServiceRead:
        """A new model or spec is a new revision, rolled out replica by replica; replicas scale at once."""
        principal.require("services:write")
        with self.db.read() as s:
            current = self.load(s, principal, name)
            spec = ServiceSpec.model_validate(current.spec)
            code = current.code_sha256
        if body.spec is not None:
            if body.spec.name != name:
                raise InvalidInput("spec.name: a service keeps its name", details={"field": "spec.name"})
            spec = body.spec
        if body.model is not None:
            spec = spec.model_copy(update={"model": body.model})
        if body.code_sha256 is not None:
            code = body.code_sha256
        if body.replicas is not None and spec.autoscale is not None:
            raise InvalidInput(
                "replicas: this service autoscales; change autoscale.min/max in its spec instead",
                details={"field": "replicas"},
            )
        if body.shadow is not None:
            if set(body.model_fields_set) - {"shadow"}:
                raise InvalidInput("shadow: change a shadow alone", details={"field": "shadow"})
            return self._set_shadow(principal, name, spec, code, body.shadow)
        if body.canary is not None and body.model is not None:
            return self._start_canary(principal, name, spec, code, body)
        if body.rollout is not None and body.model is not None and body.canary is None:
            raise InvalidInput("rollout: a rollout policy is a canary's: give canary too", details={"field": "rollout"})
        if body.canary is not None or body.canary_replicas is not None or body.rollout is not None:
            if body.spec is not None or body.code_sha256 is not None or body.replicas is not None:
                raise InvalidInput(
                    "canary: change a canary alone (or start one with model and canary)", details={"field": "canary"}
                )
            return self._change_canary(principal, name, body)
        rolling = body.spec is not None or body.model is not None or body.code_sha256 is not None
        model_name, version = self._check(principal, spec, code) if rolling else ("", 0)
        with self.db.transaction() as s:
            service = self.load(s, principal, name, lock=True)
            if rolling and service.canary_version is not None:
                raise Conflict(
                    f"service {name} runs a canary (version {service.canary_version}): promote or roll it back first"
                )
            if rolling:
                service.spec = spec.model_dump(mode="json", by_alias=True)
                service.code_sha256 = code
                service.model_name, service.model_version = model_name, version
                service.revision += 1
                if body.spec is not None:
                    service.desired_replicas = max(spec.min_replicas, min(service.desired_replicas, spec.max_replicas))
            if body.replicas is not None:
                spec = spec.model_copy(update={"replicas": body.replicas})
                service.spec = spec.model_dump(mode="json", by_alias=True)
                service.desired_replicas = body.replicas
            service.updated_at = utcnow()
            read = self._read(s, service)
        self.wake()
        return read

    # ---- canaries (kiln.domain.traffic_split)

    def _start_canary(
        self, principal: Principal, name: str, spec: ServiceSpec, code: str | None, body: ServiceUpdate
    ) -> ServiceRead:
        """Run ``body.model`` beside the stable version with ``body.canary`` percent of the predicts (a canary
        already running is replaced: its replicas drain)."""
        if body.spec is not None or body.code_sha256 is not None or body.replicas is not None:
            raise InvalidInput("canary: a canary changes the model version only", details={"field": "canary"})
        model_name, version = self._check(principal, spec, code)
        with self.db.transaction() as s:
            service = self.load(s, principal, name, lock=True)
            if model_name != service.model_name:
                raise InvalidInput(
                    f"model: a canary is another version of {service.model_name}, not of {model_name}",
                    details={"field": "model"},
                )
            if version == service.model_version:
                raise InvalidInput(
                    f"model: {model_name}@{version} is the stable version already", details={"field": "model"}
                )
            service.canary_version, service.canary_weight = version, int(body.canary or 0)
            service.canary_replicas = body.canary_replicas or 1
            service.canary_policy = body.rollout.model_dump(mode="json") if body.rollout is not None else None
            service.canary_step_at = service.updated_at = utcnow()
            read = self._read(s, service)
        self.wake()
        return read

    def _set_shadow(
        self, principal: Principal, name: str, spec: ServiceSpec, code: str | None, model: str
    ) -> ServiceRead:
        """Send a copy of the predicts to ``model`` (another version of the service's model; one replica), or
        end the shadow (``""``: its replica drains)."""
        version: int | None = None
        if model:
            model_name, version = self._check(principal, spec.model_copy(update={"model": model}), code)
        with self.db.transaction() as s:
            service = self.load(s, principal, name, lock=True)
            if version is not None:
                if model_name != service.model_name:
                    raise InvalidInput(
                        f"shadow: another version of {service.model_name}, not of {model_name}",
                        details={"field": "shadow"},
                    )
                if version in (service.model_version, service.canary_version):
                    raise InvalidInput(
                        f"shadow: {model_name}@{version} answers the clients already", details={"field": "shadow"}
                    )
            service.shadow_version = version
            service.updated_at = utcnow()
            read = self._read(s, service)
        self.wake()
        return read

    def _change_canary(self, principal: Principal, name: str, body: ServiceUpdate) -> ServiceRead:
        with self.db.transaction() as s:
            service = self.load(s, principal, name, lock=True)
            if service.canary_version is None:
                raise Conflict(f"service {name} runs no canary: start one with --model NAME@VERSION --canary PERCENT")
            if body.canary is not None and body.canary != service.canary_weight:
                service.canary_weight = body.canary
                service.canary_step_at = utcnow()  # a rollout policy's step begins again
            if body.canary_replicas is not None:
                service.canary_replicas = body.canary_replicas
            if body.rollout is not None:
                service.canary_policy = body.rollout.model_dump(mode="json")
                service.canary_step_at = utcnow()
            service.updated_at = utcnow()
            read = self._read(s, service)
        self.wake()
        return read

    def promote(self, principal: Principal, name: str) -> ServiceRead:
        """The canary becomes the stable version (kiln.usecases.models.rollout.promote): no request dropped."""
        principal.require("services:write")
        with self.db.transaction() as s:
            service = self.load(s, principal, name, lock=True)
            if service.canary_version is None:
                raise Conflict(f"service {name} runs no canary to promote")
            rollout.promote(s, service, f"promoted by {principal.user_name}", "hand")
            read = self._read(s, service)
        self.wake()
        return read

    def rollback(self, principal: Principal, name: str) -> ServiceRead:
        """The canary ends: no predict is sent to it any more, and its replicas drain (those in flight finish)."""
        principal.require("services:write")
        with self.db.transaction() as s:
            service = self.load(s, principal, name, lock=True)
            if service.canary_version is None:
                raise Conflict(f"service {name} runs no canary to roll back")
            rollout.roll_back(s, service, f"rolled back by {principal.user_name}", "hand")
            read = self._read(s, service)
        self.wake()
        return read

    def delete(self, principal: Principal, name: str) -> None:
        principal.require("services:write")
        with self.db.transaction() as s:
            service = self.load(s, principal, name, lock=True)
            service.state = ServiceState.DELETING
            service.desired_replicas = 0
            service.updated_at = utcnow()
        self.wake()

    def cold_start(self, service_id: str) -> None:
        """A request waits and no replica is ready: a service at zero replicas wants one again (the serving task,
        on whichever server runs it, starts one at its next run)."""
        with self.db.transaction() as s:
            service = s.get(Service, service_id)
            if service is not None and service.state != ServiceState.DELETING:
                # The request, as the serving task on whichever server runs it sees it: not idle.
                service.last_request_at = utcnow()
                if service.desired_replicas == 0:
                    service.desired_replicas = 1
                    service.updated_at = utcnow()
        self.wake()

    # ---- service tokens

    def create_token(self, principal: Principal, name: str) -> ServiceToken:
        principal.require("services:write")
        secret = secrets.token_urlsafe(32)
        with self.db.transaction() as s:
            service = self.load(s, principal, name)
            key = ServiceKey(
                id=new_id("stk"),
                service_id=service.id,
                secret_sha256=hashlib.sha256(secret.encode()).hexdigest(),
                created_by=principal.user_id,
                created_at=utcnow(),
            )
            s.add(key)
        return ServiceToken(
            id=key.id, service=name, token=f"{TOKEN_PREFIX}.{key.id}.{secret}", created_at=key.created_at
        )

    def authenticate_token(self, token: str) -> Principal:
        """A ``kst.<id>.<secret>`` bearer token: it may predict on its service, nothing else."""
        parts = token.split(".")
        if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
            raise AuthFailure("malformed", message="the service token is malformed")
        with self.db.read() as s:
            row = s.execute(
                select(ServiceKey, Service, User, Organization)
                .join(Service, Service.id == ServiceKey.service_id)
                .join(User, User.id == ServiceKey.created_by)
                .join(Organization, Organization.id == Service.org_id)
                .where(ServiceKey.id == parts[1])
            ).first()
        digest = hashlib.sha256(parts[2].encode()).hexdigest()
        if row is None or not hmac.compare_digest(row[0].secret_sha256, digest):
            raise AuthFailure(
                "signature",
                f"service token {parts[1][:40]}: unknown or wrong secret",
                message="the service token is not valid",
            )
        key, service, user, org = row
        return Principal(
            user_id=user.id,
            user_name=user.name,
            org_id=org.id,
            org_name=org.name,
            key_id=f"service:{key.id}"[:64],
            role="service",
            platform_admin=False,
            service_id=service.id,
        )

    def id_for(self, principal: Principal, name: str) -> str:
        """The id of the caller's service ``name``, or a new one for a service not deployed yet (a preview)."""
        with self.db.read() as s:
            existing = s.scalar(select(Service.id).where(Service.org_id == principal.org_id, Service.name == name))
        return str(existing) if existing is not None else new_id("svc")

    def replica_job(self, principal: Principal, name: str, replica_id: str | None) -> str:
        """The job of a replica of the service (the newest one without ``replica_id``), for its log."""
        principal.require("services:read")
        with self.db.read() as s:
            service = self.load(s, principal, name)
            query = select(ServiceReplica.job_id).where(
                ServiceReplica.service_id == service.id, ServiceReplica.job_id.is_not(None)
            )
            if replica_id is not None:
                query = query.where(ServiceReplica.id == replica_id)
            job_id = s.scalar(query.order_by(ServiceReplica.created_at.desc()).limit(1))
        if job_id is None:
            raise NotFound(
                f"service {name} has no replica {replica_id}" if replica_id else f"service {name} has no replica yet"
            )
        return str(job_id)

"""A canary's moves, written in the caller's transaction: its share advanced, the canary promoted (its replicas become
the new stable revision's) or rolled back (its replicas drain), each recorded as a service event (the service's
``rollout_events``, the newest ``EVENTS_KEPT``) and a notification event. The API's promote and rollback
(kiln.usecases.models.serving) and the rollout policy's (kiln.tasks.serving_rollout) make the same moves."""

from __future__ import annotations

from typing import Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from kiln.db.tables import Service, ServiceReplica, utcnow
from kiln.domain.serving import ReplicaState, RolloutEvent, ServiceSpec
from kiln.usecases.notifications import notification_events

EVENTS_KEPT = 20
By = Literal["policy", "hand"]
Move = Literal["advanced", "promoted", "rolled_back"]


def record(s: Session, service: Service, move: Move, version: int, weight: int, message: str, by: By) -> None:
    """Append a move to the service's events and record its notification event."""
    event = RolloutEvent(at=utcnow(), move=move, version=version, weight=weight, by=by, message=message[:1000])
    events = [*(service.rollout_events or []), event.model_dump(mode="json")]
    service.rollout_events = events[-EVENTS_KEPT:]
    details: dict[str, object] = {"version": version, "weight": weight, "by": by}
    notification_events.canary_moved(
        s,
        service,
        move,
        f"canary {service.model_name}@{version} {move.replace('_', ' ')} at {weight}%: {message}"[:1000],
        details,
    )


def advance(s: Session, service: Service, weight: int, why: str, by: By = "policy") -> None:
    assert service.canary_version is not None
    service.canary_weight = weight
    service.canary_step_at = service.updated_at = utcnow()
    record(s, service, "advanced", service.canary_version, weight, why, by)


def promote(s: Session, service: Service, why: str, by: By) -> None:
    """The canary becomes the stable version: a new revision whose first replicas are the canary's (they go on
    answering, now with every predict's share), the old version's replicas rolled over one at a time."""
    version = service.canary_version
    assert version is not None
    spec = ServiceSpec.model_validate(service.spec)
    spec = spec.model_copy(update={"model": f"{service.model_name}@{version}"})
    service.spec = spec.model_dump(mode="json", by_alias=True)
    service.model_version, service.revision = version, service.revision + 1
    for replica in s.scalars(
        select(ServiceReplica).where(
            ServiceReplica.service_id == service.id,
            ServiceReplica.canary.is_(True),
            ServiceReplica.model_version == version,  # not a replaced canary's, draining
            ServiceReplica.state.in_([str(ReplicaState.STARTING), str(ReplicaState.READY)]),
        )
    ):
        replica.canary, replica.revision = False, service.revision
    _end(service)
    record(s, service, "promoted", version, 100, why, by)


def roll_back(s: Session, service: Service, why: str, by: By) -> None:
    """The canary ends: no predict is sent to it any more, and its replicas drain (those in flight finish)."""
    version, weight = service.canary_version, service.canary_weight
    assert version is not None
    _end(service)
    record(s, service, "rolled_back", version, weight, why, by)


def _end(service: Service) -> None:
    service.canary_version, service.canary_weight = None, 0
    service.canary_policy, service.canary_step_at = None, None
    service.updated_at = utcnow()

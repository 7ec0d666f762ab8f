"""What removing a model version involves besides its rows: the refusals (a service serves it, a job that has not
ended reads it) and the blobs nothing else references any more. Used by ``ModelRegistry.remove`` inside its
transaction, under the organisation's lock."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from kiln.db.tables import DataBlob, DatasetFile, ModelFile, Service, ServiceReplica
from kiln.domain.serving import ReplicaState, ServiceState
from kiln.errors import Conflict
from kiln.usecases.data.input_access import pinning_job

SERVING_REPLICAS = [ReplicaState.STARTING.value, ReplicaState.READY.value, ReplicaState.DRAINING.value]
_CHUNK = 500


def drop_orphans(s: Session, org: str, shas: set[str]) -> tuple[list[str], int]:
    """Delete the blob records of ``shas`` that no model file and no dataset file of ``org`` references."""
    still: set[str] = set()
    for chunk in chunks(sorted(shas)):
        for table in (ModelFile, DatasetFile):
            still.update(s.scalars(select(table.sha256).where(table.org_id == org, table.sha256.in_(chunk))))
    orphans = sorted(shas - still)
    freed = 0
    for chunk in chunks(orphans):
        where = (DataBlob.org_id == org, DataBlob.sha256.in_(chunk))
        freed += int(s.scalar(select(func.coalesce(func.sum(DataBlob.size), 0)).where(*where)) or 0)
        s.execute(delete(DataBlob).where(*where))
    return orphans, freed


def refuse_served(s: Session, org: str, name: str, numbers: set[int] | None) -> None:
    """409 while a service (or a replica still serving during an update) serves the model: any version when
    ``numbers`` is None, else one of them."""
    served = list(
        s.execute(
            select(Service.name, Service.model_version).where(
                Service.org_id == org, Service.model_name == name, Service.state != ServiceState.DELETING.value
            )
        )
    )
    served += s.execute(
        select(Service.name, ServiceReplica.model_version)
        .join(Service, Service.id == ServiceReplica.service_id)
        .where(Service.org_id == org, Service.model_name == name, ServiceReplica.state.in_(SERVING_REPLICAS))
    ).all()
    for service, number in served:
        if numbers is None or number in numbers:
            raise Conflict(
                f"model {name}@{number} is served by service {service}; delete the service or update it to "
                "another version first",
                details={"service": service, "version": number},
            )


def refuse_pinned(s: Session, org: str, name: str, numbers: set[int], existing: list[int]) -> None:
    """409 while a job that has not ended reads one of these versions (``spec.inputs``: ``model: NAME@V``,
    pinned at submit)."""
    latest = existing[-1] if existing else None
    found = pinning_job(s, org, "model", name, numbers, latest)
    if found is not None:
        job_id, state, pinned = found
        raise Conflict(
            f"model {name}@{pinned} is an input of job {job_id} ({state}); remove it once the job has "
            "ended (or cancel the job)",
            details={"job_id": job_id, "version": pinned},
        )


def chunks(items: list[str]) -> Iterable[list[str]]:
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]

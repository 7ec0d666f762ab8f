"""Who may read a dataset or model version: a user with the permission, or the token of a job that pinned that
version as an input (a Kubernetes pod's init container stages its inputs with its job token, which reads nothing
else of its organisation)."""

from __future__ import annotations

from typing import Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from kiln.db.models import Job
from kiln.domain.stored_spec import StoredSpec
from kiln.errors import Forbidden
from kiln.usecases.identity import Principal


def require_input_read(
    s: Session, principal: Principal, permission: str, kind: Literal["dataset", "model"], name: str, version: object
) -> None:
    """``permission`` for a user; for a job token, ``name@version`` among its job's pinned ``kind`` inputs."""
    if principal.job_id is None:
        principal.require(permission)
        return
    spec = s.scalar(select(Job.spec).where(Job.id == principal.job_id, Job.org_id == principal.org_id))
    pinned = set(StoredSpec(spec).input_refs(kind))
    if f"{name}@{version}" not in pinned:
        raise Forbidden(
            f"{principal.describe()} may read only the {kind} versions its job reads (not {name}@{version})"
        )

"""Who may read a dataset or model version: a user with the permission, or the token of a job that pinned that
version as an input (a Kubernetes pod's init container stages its inputs with its job token, which reads nothing
else of its organisation); and which job, not ended, reads a version that is to be removed."""

from __future__ import annotations

from typing import Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from kiln.db.tables import Job
from kiln.domain.states import JobState
from kiln.domain.stored_spec import StoredSpec
from kiln.errors import Forbidden
from kiln.usecases.access.identity import Principal


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


PINNING_STATES = [s.value for s in JobState if not s.terminal]


def pinning_job(
    s: Session, org_id: str, kind: Literal["dataset", "model"], name: str, numbers: set[int], latest: int | None
) -> tuple[str, str, int] | None:
    """(job id, state, version) of a job that has not ended and reads one of these versions of ``name`` (its
    ``spec.inputs``: ``NAME@V``, or ``NAME`` for the latest one, ``latest``), or None."""
    jobs = s.execute(select(Job.id, Job.state, Job.spec).where(Job.org_id == org_id, Job.state.in_(PINNING_STATES)))
    for job_id, state, spec in jobs:
        for ref in StoredSpec(spec).input_refs(kind):
            ref_name, _, ref_version = ref.partition("@")
            if ref_name != name:
                continue
            pinned = int(ref_version) if ref_version.isascii() and ref_version.isdigit() else latest
            if pinned is not None and pinned in numbers:
                return job_id, state, pinned
    return None

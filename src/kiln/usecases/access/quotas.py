"""Quotas: limits per organisation and category, usage as users see it, and atomic admission.

Usage counts jobs that hold resources (STARTING, RUNNING). Admission (``Admission``) runs inside the transaction
that moves jobs to STARTING, after locking their organisations' rows (``FOR UPDATE`` on PostgreSQL; SQLite's
``BEGIN IMMEDIATE`` already serialises writers), so concurrent schedulers can never push usage past a limit.

The arithmetic (kiln.domain.quota) counts CPUs in whole millicores; this is the edge where the CPUs stored as
users wrote them (quota rows, jobs' ``cpus``) become millicores and the report turns them back.
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from typing import Any

from sqlalchemy import Select, bindparam, func, select
from sqlalchemy.orm import Session

from kiln.db.session import Database
from kiln.db.tables import Blob, DataBlob, DataUpload, Job, LoggedModel, Notebook, Organization, Quota, Run, utcnow
from kiln.domain.quantities import MILLI, format_bytes, millicores
from kiln.domain.quota import CATEGORIES, FIELDS, TOTAL, Limits, OrgUsage, blocked_by, never_fits
from kiln.domain.schemas import QuotaCategory, QuotaFields, QuotaReport, QuotaSet, StorageUse
from kiln.domain.states import JobState
from kiln.errors import Forbidden, InvalidInput
from kiln.storage.logs import LogStore
from kiln.usecases.access.accounts import find_org
from kiln.usecases.access.identity import Principal

ACTIVE = [JobState.STARTING, JobState.RUNNING]


def _limits(row: Any) -> Limits:
    """From a quota row (or a row of its columns)."""
    cpus = millicores(row.cpus) if row.cpus is not None else None
    return Limits(gpus=row.gpus, millicores=cpus, memory=row.memory, count=row.count, storage=row.storage)


def job_millicores(cpus: float, workers: int) -> int:
    """A job's stored ``cpus`` (its whole gang's) in millicores, rounded per worker as the scheduler rounds each
    worker's share (kiln.domain.quantities.millicores), so quota and placement count a job alike."""
    workers = max(workers or 1, 1)
    return millicores(cpus / workers) * workers


_LIMITS = select(Quota.org_id, Quota.category, Quota.gpus, Quota.cpus, Quota.memory, Quota.count, Quota.storage).where(
    Quota.org_id.in_(bindparam("org_ids", expanding=True))
)
_LIMITS_READ = "kiln.quotas.limits"  # session.info: org id → its limits by category, as this transaction read them


def load_limits(s: Session, org_ids: list[str] | None = None) -> dict[str, dict[str, Limits]]:
    """The organisations' limits by category (all organisations': None). Each organisation's are read once per
    transaction (a submit checks them, decides and admits in one): limits change only by ``QuotaService.set``,
    whose transaction reads none before it writes."""
    if org_ids is None:
        out: dict[str, dict[str, Limits]] = {}
        for quota in s.scalars(select(Quota)):
            out.setdefault(quota.org_id, {})[quota.category] = _limits(quota)
        return out
    known: dict[str, dict[str, Limits]] = s.info.setdefault(_LIMITS_READ, {})
    missing = sorted({o for o in org_ids if o not in known})
    if missing:
        for org_id in missing:
            known[org_id] = {}
        for row in s.execute(_LIMITS, {"org_ids": missing}):
            known[row.org_id][row.category] = _limits(row)
    return {o: known[o] for o in org_ids if known.get(o)}


_USAGE_COLUMNS: tuple[Any, ...] = (Job.org_id, Job.category, Job.gpus, Job.cpus, Job.workers, Job.memory)


@functools.cache
def _usage_statement(released: bool) -> Select[Any]:
    query = select(*_USAGE_COLUMNS).where(
        Job.state.in_([str(x) for x in ACTIVE]), Job.org_id.in_(bindparam("org_ids", expanding=True))
    )
    return query.where(Job.id.not_in(bindparam("released", expanding=True))) if released else query


def load_usage(s: Session, org_ids: list[str] | None = None, released: Collection[str] = ()) -> dict[str, OrgUsage]:
    """What the organisations' active jobs hold, leaving out ``released`` (jobs whose attempts are known to have
    ended, their transitions not yet written)."""
    if org_ids is not None and not org_ids:
        return {}
    if org_ids is None:
        query = select(*_USAGE_COLUMNS).where(Job.state.in_(ACTIVE))
        if released:
            query = query.where(Job.id.not_in(sorted(released)))
        rows = s.execute(query)
    else:
        params: dict[str, Any] = {"org_ids": list(org_ids)}
        if released:
            params["released"] = sorted(released)
        rows = s.execute(_usage_statement(bool(released)), params)
    out: dict[str, OrgUsage] = {}
    for org_id, category, gpus, cpus, workers, memory in rows:
        out.setdefault(org_id, OrgUsage()).add(category, gpus, job_millicores(cpus, workers), memory)
    return out


def lock_org(s: Session, org_id: str) -> None:
    """Serialise the organisation's dataset writes (SQLite's BEGIN IMMEDIATE already does); FOR NO KEY UPDATE, as
    in ``Admission``."""
    if s.get_bind().dialect.name == "postgresql":
        s.execute(select(Organization.id).where(Organization.id == org_id).with_for_update(key_share=True))


def storage_use(s: Session, org_id: str, logs: LogStore | None = None) -> StorageUse:
    """Bytes the organisation stores, by kind: code bundles, job outputs, job logs, checkpoints and TensorBoard
    event files (what the store holds of each job's: a checkpoint written again counts once), dataset blobs (each
    stored once however many versions share it) with the full size of every open dataset upload (reserved when it
    is opened), notebook homes, the artifacts of runs logged from outside Kiln and of logged models. A log counts
    its size when the job's latest attempt ended; with ``logs``, a running job's counts its size now (a look at the
    files of the organisation's running jobs only)."""

    def total(column: Any, table: Any) -> int:
        return int(s.scalar(select(func.coalesce(func.sum(column), 0)).where(table.org_id == org_id)) or 0)

    logged = total(Job.log_bytes, Job)
    if logs is not None:
        running = select(Job.id, Job.log_bytes).where(Job.org_id == org_id, Job.state.in_(ACTIVE))
        logged += sum(max(0, logs.size(job_id) - (recorded or 0)) for job_id, recorded in s.execute(running))
    return StorageUse(
        code=total(Blob.size, Blob),
        outputs=total(Job.output_bytes, Job),
        logs=logged,
        checkpoints=total(Job.checkpoint_bytes, Job),
        tensorboard=total(Job.event_bytes, Job),
        datasets=total(DataBlob.size, DataBlob) + total(DataUpload.size, DataUpload),
        homes=total(Notebook.home_size, Notebook),
        artifacts=total(Run.artifact_bytes, Run) + total(LoggedModel.artifact_bytes, LoggedModel),
    )


def storage_used(s: Session, org_id: str, logs: LogStore | None = None) -> int:
    """Bytes the organisation stores in all (``storage_use``'s sum), what its storage limit is checked against."""
    return storage_use(s, org_id, logs).total


class Admission:
    """Admission of many jobs inside one transaction (the reconcile pass that moves them to STARTING): each
    organisation is locked (``FOR UPDATE`` on PostgreSQL, in id order; SQLite's ``BEGIN IMMEDIATE`` already holds
    the write lock) and its limits and usage are read once; every admitted job is then added to the count, so the
    next one is judged as if the ones before it were already STARTING."""

    def __init__(self, s: Session, dialect: str, org_ids: list[str]) -> None:
        orgs = sorted(set(org_ids))
        if dialect == "postgresql" and orgs:
            # FOR NO KEY UPDATE: it serialises admissions as FOR UPDATE did, but does not conflict with the KEY
            # SHARE lock a row referencing the organisation takes (a job, an event, an audit record written
            # earlier in the same transaction). Two servers' passes that had each written such a row and then
            # asked FOR UPDATE waited for each other: PostgreSQL reported a deadlock in the chaos test.
            s.execute(
                select(Organization.id)
                .where(Organization.id.in_(orgs))
                .order_by(Organization.id)
                .with_for_update(key_share=True)
            )
        self.limits = load_limits(s, orgs) if orgs else {}
        self.usage = load_usage(s, [o for o in orgs if o in self.limits]) if self.limits else {}

    def admit(self, job: Job, org_name: str) -> str | None:
        """Why ``job`` must wait, or None: it is admitted and counted (the caller moves it to STARTING in the same
        transaction)."""
        limits = self.limits.get(job.org_id)
        if not limits:
            return None
        usage = self.usage.setdefault(job.org_id, OrgUsage())
        cpus = job_millicores(job.cpus, job.workers)
        why = blocked_by(org_name, job.category, limits, usage, job.gpus, cpus, job.memory)
        if why is None:
            usage.add(job.category, job.gpus, cpus, job.memory)
        return why


class QuotaService:
    def __init__(self, db: Database, logs: LogStore | None = None) -> None:
        self.db = db
        self.logs = logs  # the job logs, whose running jobs' sizes count in storage_used

    def set(self, principal: Principal, org_ref: str, body: QuotaSet) -> QuotaReport:
        principal.require("quota:set")
        changes = {name: getattr(body, name) for name in body.model_fields_set if name != "category"}
        if "storage" in changes and body.category != TOTAL:
            raise InvalidInput("storage: a storage limit applies to the whole organisation (category total)")
        with self.db.transaction() as s:
            org = find_org(s, principal, org_ref)
            row = s.get(Quota, (org.id, body.category))
            if row is None:
                row = Quota(org_id=org.id, category=body.category)
                s.add(row)
            for name, value in changes.items():
                setattr(row, name, value)
            row.updated_at = utcnow()
        return self.report(principal, org_ref)

    def report(self, principal: Principal, org_ref: str | None = None) -> QuotaReport:
        principal.require("quota:read")
        with self.db.read() as s:
            org = find_org(s, principal, org_ref or principal.org_id)
            limits = load_limits(s, [org.id]).get(org.id, {})
            usage = load_usage(s, [org.id]).get(org.id, OrgUsage())
            categories = []
            storage = StorageUse()
            for category in (*CATEGORIES, TOTAL):
                limit = limits.get(category, Limits())
                used = usage.of(category)
                used_fields: dict[str, float] = {name: getattr(used, attr) for name, attr in FIELDS.items()}
                used_fields["cpus"] = used.millicores / MILLI
                if category == TOTAL:
                    storage = storage_use(s, org.id, self.logs)
                    used_fields["storage"] = storage.total
                categories.append(
                    QuotaCategory(
                        category=category,
                        limits=QuotaFields(
                            gpus=limit.gpus,
                            cpus=limit.millicores / MILLI if limit.millicores is not None else None,
                            memory=limit.memory,
                            count=limit.count,
                            storage=limit.storage,
                        ),
                        used=QuotaFields(**used_fields),
                    )
                )
            return QuotaReport(org_id=org.id, org_name=org.name, categories=categories, storage=storage)

    def check_submit(
        self,
        principal: Principal,
        category: str,
        gpus: int,
        cpus: float,
        memory: int | None,
        session: Session | None = None,
    ) -> None:
        """403 with the numbers when the job asks more than its organisation may ever use. With ``session``, read
        in that transaction (the submit's own) rather than in one of its own."""
        if session is not None:
            limits = load_limits(session, [principal.org_id]).get(principal.org_id)
        else:
            with self.db.read() as s:
                limits = load_limits(s, [principal.org_id]).get(principal.org_id)
        if limits:
            why = never_fits(principal.org_name, category, limits, gpus, millicores(cpus), memory)
            if why:
                raise Forbidden(why)

    def check_storage(self, s: Session, org_id: str, org_name: str, adding: int) -> None:
        """403 when ``adding`` bytes would take the organisation past its storage limit."""
        total = load_limits(s, [org_id]).get(org_id, {}).get(TOTAL)
        if total is None or total.storage is None:
            return
        used = storage_used(s, org_id, self.logs)
        if used + adding > total.storage:
            raise Forbidden(
                f"quota: storage {format_bytes(used)} in use + {format_bytes(adding)} would exceed the limit of "
                f"{format_bytes(total.storage)} (org {org_name})",
                details={"used": used, "adding": adding, "limit": total.storage},  # exact, in bytes
            )

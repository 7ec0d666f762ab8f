"""The organisation's storage quota, checked before a running job's checkpoints or TensorBoard event files are
written to the store (issue 43: checkpoints counted nothing, and an organisation's jobs piled them up past its
quota; event files counted only once the job had ended).

Each kind is one column of the job (``checkpoint_bytes``, ``event_bytes``) holding what the store holds of it:
the net size, so a checkpoint written again under its name counts once, at its latest size, however many syncs
copied it. Before a sync writes, the size the store will hold once it is done is checked against the limit and
reserved in one transaction under the organisation's lock (as the outputs gate does, kiln.scheduler.outputs_gate),
so two servers syncing at once never pass it together. Past the limit nothing of that sync is written, the job
runs on, and it gets one event naming the quota, the use and the size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import InstrumentedAttribute, Session

from kiln.backends.capabilities import CheckpointSyncer, EventSyncer, OutputsNotKept
from kiln.db.session import Database
from kiln.db.tables import Job, JobEvent, Organization
from kiln.domain.quantities import format_bytes
from kiln.domain.quota import TOTAL
from kiln.domain.states import Reason
from kiln.storage.keys import checkpoints_prefix, events_prefix
from kiln.storage.logs import LogStore
from kiln.usecases.access.quotas import load_limits, lock_org, storage_used
from kiln.usecases.jobs.lifecycle import record

KINDS: dict[str, InstrumentedAttribute[int]] = {
    "checkpoints": Job.checkpoint_bytes,
    "TensorBoard event files": Job.event_bytes,
}


class StorageGate:
    """Admits what a sync is about to write of a job's checkpoints or event files, or refuses it whole."""

    def __init__(self, db: Database, logs: LogStore | None = None) -> None:
        self.db = db
        self.logs = logs  # running jobs' logs count in the organisation's storage, as the quota report counts them

    def admit(self, job_id: str, what: str, size: int) -> None:
        """Reserve ``size`` bytes, what the store will hold of the job's ``what`` (a key of ``KINDS``) once the
        sync is done, or raise ``OutputsNotKept`` when that would take its organisation past its storage limit.
        The first refusal puts an event on the job (it is committed; the refusal is raised after)."""
        column = KINDS[what].key
        refused: str | None = None
        with self.db.transaction() as s:
            job = s.get(Job, job_id)
            if job is None:
                return
            current = getattr(job, column) or 0
            if size > current:  # a sync that leaves the store holding less needs no room
                lock_org(s, job.org_id)
                total = load_limits(s, [job.org_id]).get(job.org_id, {}).get(TOTAL)
                limit = total.storage if total is not None else None
                # What the job's kept ``what`` counts now is what this sync replaces: not counted twice.
                used = storage_used(s, job.org_id, self.logs) - current if limit is not None else 0
                if limit is not None and used + size > limit:
                    org = s.get(Organization, job.org_id)
                    refused = (
                        f"{what} not kept: storage quota of org {org.name if org else job.org_id}: "
                        f"{format_bytes(used)} in use + {format_bytes(size)} of {what} would exceed the limit of "
                        f"{format_bytes(limit)}"
                    )
                    if not _said(s, job_id, what):
                        record(s, job, Reason.STORAGE_QUOTA_EXCEEDED, f"{refused}; the job runs on")
            if refused is None:
                setattr(job, column, size)
        if refused is not None:
            raise OutputsNotKept(refused)

    def settle(self, job_id: str, what: str, size: int) -> None:
        """What the store holds of the job's ``what`` after a sync, where it differs from what was admitted (a
        file rewritten in place while it was copied, a copy cut short)."""
        with self.db.transaction() as s:
            job = s.get(Job, job_id)
            if job is not None:
                setattr(job, KINDS[what].key, size)


def _said(s: Session, job_id: str, what: str) -> bool:
    """Whether the job already has its one event saying its ``what`` are not kept."""
    query = select(JobEvent.id).where(
        JobEvent.job_id == job_id,
        JobEvent.reason == Reason.STORAGE_QUOTA_EXCEEDED,
        JobEvent.message.startswith(f"{what} not kept:", autoescape=True),
    )
    return s.scalar(query.limit(1)) is not None


Admit = Callable[[int], None]


def sync_checkpoints(
    backend: CheckpointSyncer, gate: StorageGate | None, handle: dict[str, Any], org_id: str, job_id: str
) -> int:
    """The job's changed checkpoints into the store, admitted by ``gate`` (None: not checked); files copied. A
    sync the quota refuses copies nothing (the job's event says so)."""
    prefix = checkpoints_prefix(org_id, job_id)
    return _gated(gate, job_id, "checkpoints", lambda admit: backend.sync_checkpoints(handle, prefix, admit))


def sync_events(
    backend: EventSyncer, gate: StorageGate | None, handle: dict[str, Any], org_id: str, job_id: str
) -> int:
    """The job's changed TensorBoard event files into the store, each admitted by ``gate``; files copied."""
    prefix = events_prefix(org_id, job_id)
    return _gated(gate, job_id, "TensorBoard event files", lambda admit: backend.sync_events(handle, prefix, admit))


def _gated(gate: StorageGate | None, job_id: str, what: str, sync: Callable[[Admit | None], tuple[int, int]]) -> int:
    """Run ``sync`` with the gate's admission, then write what the store holds where it differs from the last
    size admitted. A sync that fails after an admission leaves that reservation (it may have written part of
    what it reserved): the next sync that writes sets the count again."""
    reserved: list[int] = []

    def admit(size: int) -> None:
        assert gate is not None
        gate.admit(job_id, what, size)
        reserved.append(size)

    try:
        files, held = sync(admit if gate is not None else None)
    except OutputsNotKept:
        return 0  # nothing of this sync was written; the job's event says why
    if gate is not None and (files or reserved) and (not reserved or held != reserved[-1]):
        gate.settle(job_id, what, held)
    return files

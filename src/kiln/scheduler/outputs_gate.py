"""The organisation's storage quota, checked before an ended attempt's outputs are copied into the store.

The outputs are counted at their apparent size (a sparse file of 95 MiB costs the store 95 MiB: a local store
copies its holes as zeros, and S3 keeps no holes), which is what ``storage_used`` then counts for the job. The
check and a reservation of the bytes (the job's ``output_bytes``) are one transaction under the organisation's
lock, so outputs collected at the same time by another server's reconciler count them, and the two together
never pass the limit (issue 43: a job's sparse outputs took its organisation to 4 GiB of a 2.4 GiB quota).
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from kiln.backends.capabilities import OutputsNotKept
from kiln.db.session import Database
from kiln.db.tables import Job, Organization
from kiln.domain.quantities import format_bytes
from kiln.domain.quota import TOTAL
from kiln.storage.logs import LogStore
from kiln.usecases.access.quotas import load_limits, lock_org, storage_used


class OutputsGate:
    """Admits an ended attempt's outputs into the store, or refuses them whole."""

    def __init__(self, db: Database, logs: LogStore | None) -> None:
        self.db = db
        self.logs = logs  # running jobs' logs count in the organisation's storage, as the quota report counts them

    def admit(self, job_id: str, size: int) -> None:
        """Reserve ``size`` bytes of outputs for the job, or raise ``OutputsNotKept`` naming the quota, what is
        in use and the outputs' size when they would take its organisation past its storage limit."""
        with self.db.transaction() as s:
            job = s.get(Job, job_id)
            if job is None:
                return
            lock_org(s, job.org_id)
            limit = _storage_limit(s, job.org_id)
            if limit is None:
                return
            # What is in use counts the outputs of the job's earlier attempt (``output_bytes``), which this
            # collection replaces in the count but may not replace in the store (other names): counted, to be safe.
            used = storage_used(s, job.org_id, self.logs)
            if used + size > limit:
                org = s.get(Organization, job.org_id)
                name = org.name if org is not None else job.org_id
                raise OutputsNotKept(
                    f"storage quota of org {name}: {format_bytes(used)} in use + {format_bytes(size)} of outputs "
                    f"would exceed the limit of {format_bytes(limit)}"
                )
            job.output_bytes = size  # reserved; the pass that records the attempt's end writes what was copied

    def release(self, job_id: str, previous: int) -> None:
        """Undo ``admit``'s reservation of outputs that were then not copied: the job counts ``previous`` again."""
        with self.db.transaction() as s:
            job = s.get(Job, job_id)
            if job is not None:
                job.output_bytes = previous


def _storage_limit(s: Session, org_id: str) -> int | None:
    total = load_limits(s, [org_id]).get(org_id, {}).get(TOTAL)
    return total.storage if total is not None else None

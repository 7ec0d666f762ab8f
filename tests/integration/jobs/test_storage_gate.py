"""The storage quota's gate before a running job's checkpoints and TensorBoard event files are written to the store
(kiln.usecases.data.storage_gate), on SQLite and PostgreSQL, driving the local executor's syncs (kiln.backends.local
.jobfiles) against a local store: what the store holds is reserved before a byte is written, a checkpoint written
again counts once, what would pass the limit is not written at all, and the job gets one event saying so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import select

from kiln.backends.capabilities import CheckpointSyncer, EventSyncer
from kiln.backends.local import jobfiles
from kiln.db.tables import Job, JobEvent, Quota
from kiln.domain.states import JobState
from kiln.storage.store import ObjectStore
from kiln.usecases.access.quotas import storage_use
from kiln.usecases.data.storage_gate import StorageGate, sync_checkpoints, sync_events
from tests.helpers import acme_database

MiB = 2**20


class Syncer(CheckpointSyncer, EventSyncer):
    """The local executor's syncs of one job directory."""

    def __init__(self, store: ObjectStore, job_dir: Path) -> None:
        self.store, self.job_dir = store, job_dir

    def sync_checkpoints(self, handle: dict[str, Any], dest_prefix: str, admit: Any = None) -> tuple[int, int]:
        return jobfiles.sync_checkpoints(self.store, self.job_dir, dest_prefix, admit)

    def sync_events(self, handle: dict[str, Any], dest_prefix: str, admit: Any = None) -> tuple[int, int]:
        return jobfiles.sync_events(self.store, self.job_dir, "tensorboard", dest_prefix, 100 * MiB, admit)


def sparse(path: Path, mib: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"1")
        f.truncate(mib * MiB)


def test_checkpoints_and_event_files_are_reserved_counted_once_and_refused(database_url: str, tmp_path: Path) -> None:
    db = acme_database(database_url)
    try:
        with db.transaction() as s:
            s.add(Quota(org_id="org-1", category="total", storage=20 * MiB))
            s.add(Job(id="job-a", org_id="org-1", user_id="usr-1", name="a", spec={}, state=JobState.RUNNING))
        store = ObjectStore(str(tmp_path / "store"))
        job_dir = tmp_path / "job"
        syncer, gate = Syncer(store, job_dir), StorageGate(db)
        stored = store.local_path("orgs/org-1/jobs/job-a")
        assert stored is not None

        def counted() -> tuple[int, int, int]:
            with db.read() as s:
                use = storage_use(s, "org-1")
                return use.checkpoints, use.tensorboard, use.total

        sparse(job_dir / "checkpoints" / "latest.pt", 8)
        assert sync_checkpoints(syncer, gate, {}, "org-1", "job-a") == 1
        assert counted() == (8 * MiB, 0, 8 * MiB)
        sparse(job_dir / "checkpoints" / "latest.pt", 9)  # the same name again: counted once, at its new size
        assert sync_checkpoints(syncer, gate, {}, "org-1", "job-a") == 1
        assert counted() == (9 * MiB, 0, 9 * MiB)

        sparse(job_dir / "tensorboard" / "run" / "events.out.tfevents.1", 6)  # event files count too
        assert sync_events(syncer, gate, {}, "org-1", "job-a") == 1
        assert counted() == (9 * MiB, 6 * MiB, 15 * MiB)
        sparse(job_dir / "tensorboard" / "run" / "events.out.tfevents.2", 6)  # 21 MiB: not written
        assert sync_events(syncer, gate, {}, "org-1", "job-a") == 0
        assert not (stored / "events" / "run" / "events.out.tfevents.2").exists()

        sparse(job_dir / "checkpoints" / "more.pt", 7)  # 9 + 7 + 6 MiB would pass 20 MiB: nothing of it written
        for _ in range(2):  # refused each time, said once
            assert sync_checkpoints(syncer, gate, {}, "org-1", "job-a") == 0
        assert sorted(p.name for p in (stored / "checkpoints").iterdir()) == ["latest.pt"]
        assert counted() == (9 * MiB, 6 * MiB, 15 * MiB)
        with db.read() as s:
            said = sorted(s.scalars(select(JobEvent.message).where(JobEvent.reason == "StorageQuotaExceeded")))
        assert said == [
            "TensorBoard event files not kept: storage quota of org acme: 9 MiB in use + 12 MiB of TensorBoard event "
            "files would exceed the limit of 20 MiB; the job runs on",
            "checkpoints not kept: storage quota of org acme: 6 MiB in use + 16 MiB of checkpoints would exceed the "
            "limit of 20 MiB; the job runs on",
        ]
    finally:
        db.engine.dispose()

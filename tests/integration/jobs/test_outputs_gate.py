"""The storage quota's gate before an ended attempt's outputs go to the store (kiln.scheduler.outputs_gate), on
SQLite and PostgreSQL: what it admits is reserved at once (a second collection counts it), what it refuses leaves
the count alone, and outputs admitted but then not copied (the store failed) give their reservation back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select

from kiln.backends.capabilities import OutputCollector, OutputsNotKept
from kiln.db.tables import Job, Quota
from kiln.domain.states import JobState
from kiln.scheduler.observe import Observer
from kiln.scheduler.outputs_gate import OutputsGate
from kiln.scheduler.passes import Seen
from tests.helpers import acme_database

MiB = 2**20


class Collector(OutputCollector):
    """Outputs of ``size`` bytes: admitted first, then copied, or (``fails``) lost to a store that went away."""

    def __init__(self, size: int, fails: bool = False) -> None:
        self.size, self.fails = size, fails

    def collect_outputs(
        self, handle: dict[str, Any], dest_prefix: str, admit: Callable[[int], None] | None = None
    ) -> tuple[int, int]:
        assert admit is not None
        admit(self.size)
        if self.fails:
            raise OSError("the object store is unavailable")
        return 1, self.size


def test_outputs_are_reserved_refused_and_given_back(database_url: str) -> None:
    db = acme_database(database_url)
    try:
        with db.transaction() as s:
            s.add(Quota(org_id="org-1", category="total", storage=10 * MiB))
            for job_id in ("job-a", "job-b", "job-c"):
                s.add(Job(id=job_id, org_id="org-1", user_id="usr-1", name=job_id, spec={}, state=JobState.RUNNING))
        observer = Observer(None, None, None, OutputsGate(db, None))  # type: ignore[arg-type]

        def collect(job_id: str, collector: Collector) -> Seen:
            with db.read() as s:
                job = s.get(Job, job_id)
                assert job is not None
                s.expunge(job)
            seen = Seen(job, {})
            observer.collect_outputs(collector, job, {}, seen)
            return seen

        def counted() -> dict[str, int]:
            with db.read() as s:
                return {j: n for j, n in s.execute(select(Job.id, Job.output_bytes).order_by(Job.id))}

        assert collect("job-a", Collector(6 * MiB)).copied_bytes == 6 * MiB
        assert counted() == {"job-a": 6 * MiB, "job-b": 0, "job-c": 0}  # reserved before the pass records it
        refused = collect("job-b", Collector(6 * MiB))
        assert refused.copied == 0 and refused.copy_error == (
            "; outputs not kept: storage quota of org acme: 6 MiB in use + 6 MiB of outputs would exceed the limit "
            "of 10 MiB"
        )
        assert counted() == {"job-a": 6 * MiB, "job-b": 0, "job-c": 0}
        failed = collect("job-c", Collector(3 * MiB, fails=True))
        assert "collecting outputs failed: OSError" in failed.copy_error
        assert counted() == {"job-a": 6 * MiB, "job-b": 0, "job-c": 0}  # its reservation was given back
        with pytest.raises(OutputsNotKept):
            OutputsGate(db, None).admit("job-c", 5 * MiB)
    finally:
        db.engine.dispose()

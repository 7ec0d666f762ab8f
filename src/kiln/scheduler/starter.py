"""Starting attempts: ``backend.start`` for each attempt a reconcile pass committed STARTING, after that commit.

STARTING is committed first: after a crash between the commit and the start the attempt is found by its handle
and never started twice (the next observation finds it never started: lost, and the job's restart policy
applies). A pass therefore commits no more than it starts before the next one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from sqlalchemy import select

from kiln.backends.base import Backend, Launch, ResolvedInput
from kiln.db.models import Job
from kiln.db.session import Database
from kiln.domain.spec import JobSpec
from kiln.domain.states import JobState, Reason
from kiln.errors import BackendError, KilnError
from kiln.services.lifecycle import transition

log = logging.getLogger(__name__)

Attempt = tuple[str, int]  # (job id, attempt number)


def start_failure(exc: KilnError) -> tuple[str, str]:
    """The reason and message a job fails with when its start is refused."""
    if not isinstance(exc, BackendError):
        return Reason.INPUT_ERROR, exc.message
    return (Reason.RUNTIME_ERROR if "runtime" in exc.message else Reason.BACKEND_ERROR), exc.message


class Starter:
    def __init__(
        self, db: Database, backend: Backend, inputs: Callable[[str, JobSpec], tuple[ResolvedInput, ...]]
    ) -> None:
        self.db = db
        self.backend = backend
        self.inputs = inputs  # (org id, spec) → the spec's inputs resolved to files
        self.seconds = 0.01  # what one start took lately (moving average): how many a pass takes on

    def start(self, launches: list[Launch]) -> None:
        """Start the attempts in order. A start the backend refuses fails its job (one transaction for all of
        them); one that raises anything else is left STARTING, and the next observation finds it never started
        (lost), as after a crash between the commit and the start."""
        if not launches:
            return
        failed: dict[Attempt, tuple[str, str]] = {}
        began = time.perf_counter()
        for launch in launches:
            try:
                if launch.spec.inputs:
                    launch = replace(launch, inputs=self.inputs(launch.org_id, launch.spec))
                self.backend.start(launch)
            except KilnError as exc:
                failed[(launch.job_id, launch.attempt)] = start_failure(exc)
            except Exception:
                log.exception("job %s: starting attempt %d failed", launch.job_id, launch.attempt)
        self.seconds = 0.7 * self.seconds + 0.3 * (time.perf_counter() - began) / len(launches)
        if failed:
            self._fail(failed)

    def _fail(self, failed: dict[Attempt, tuple[str, str]]) -> None:
        """Fail the jobs whose attempts could not be started (where that attempt is still STARTING)."""
        with self.db.transaction() as s:
            for row in s.scalars(select(Job).where(Job.id.in_(sorted({job_id for job_id, _ in failed})))):
                why = failed.get((row.id, row.attempt))
                if why is not None and row.state == JobState.STARTING:
                    transition(s, row, JobState.FAILED, why[0], why[1])

"""The reconciler's starts (kiln.scheduler.starter): a backend whose start is a round trip to a remote scheduler
(``start_concurrency`` above one: Slurm's sbatch) has a pass's starts made side by side, each refusal still failing
its own job; any other backend's starts are made one after the other."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from kiln.backends.base import Launch
from kiln.domain.spec import JobSpec
from kiln.errors import BackendError
from kiln.scheduler.starter import Starter

SIDE_BY_SIDE = 4


class Remote:
    """start() blocks until ``wanted`` starts are in flight at once (or 10 s pass: then it says how many were)."""

    def __init__(self, concurrency: int, wanted: int) -> None:
        self.start_concurrency = concurrency
        self.barrier = threading.Barrier(wanted)
        self.lock = threading.Lock()
        self.in_flight = self.most = 0
        self.started: list[str] = []

    def start(self, launch: Launch) -> dict[str, Any]:
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        try:
            self.barrier.wait(timeout=10 if self.barrier.parties > 1 else None)
        except threading.BrokenBarrierError:
            pass
        finally:
            with self.lock:
                self.in_flight -= 1
        if launch.job_id == "job-refused":
            raise BackendError("Slurm refused the job: no such partition", retryable=False)
        with self.lock:
            self.started.append(launch.job_id)
        return {}


def _launch(job_id: str) -> Launch:
    return Launch(job_id, "org-1", 1, JobSpec(command=["true"]), 1.0, None, (), None)


def _starter(backend: Remote, failed: dict[tuple[str, int], tuple[str, str]]) -> Starter:
    starter = Starter(db=None, backend=backend, inputs=lambda org, spec: ())  # type: ignore[arg-type]
    starter._fail = failed.update  # type: ignore[method-assign]
    return starter


def test_a_remote_schedulers_starts_are_made_side_by_side() -> None:
    backend = Remote(concurrency=8, wanted=SIDE_BY_SIDE)
    failed: dict[tuple[str, int], tuple[str, str]] = {}
    launches = [_launch(f"job-{i}") for i in range(SIDE_BY_SIDE - 1)] + [_launch("job-refused")]
    _starter(backend, failed).start(launches)
    assert backend.most == SIDE_BY_SIDE  # none waited for another's round trip
    assert sorted(backend.started) == [f"job-{i}" for i in range(SIDE_BY_SIDE - 1)]
    assert failed == {("job-refused", 1): ("BackendError", "Slurm refused the job: no such partition")}


@pytest.mark.parametrize("concurrency", [1, 0])
def test_a_local_backends_starts_are_made_one_after_the_other(concurrency: int) -> None:
    backend = Remote(concurrency=concurrency, wanted=1)
    _starter(backend, {}).start([_launch(f"job-{i}") for i in range(5)])
    assert backend.most == 1
    assert backend.started == [f"job-{i}" for i in range(5)]  # in order

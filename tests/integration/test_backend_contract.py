"""The backend contract (kiln.backends.base), checked the same way on every backend: the local executor (real
processes) and the Kubernetes controller (against the FAKE API server of tests/fakes/kube_api.py, whose pods a
driver moves as a kubelet would)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from kiln.backends.base import AttemptStatus, Backend, Launch, Phase
from kiln.backends.kubernetes.backend import KubernetesBackend
from kiln.backends.kubernetes.render import KubeConfig, main_job_name
from kiln.backends.local.executor import LocalBackend
from kiln.backends.local.runtimes import RuntimeManager
from kiln.domain.catalog import DEFAULT_CATALOG
from kiln.domain.spec import JobSpec
from kiln.settings import Settings
from kiln.storage.logs import LogStore
from kiln.storage.store import ObjectStore
from tests.fakes.kube_api import FakeKubeAPI

ORG = "org-1"


class Harness(Protocol):
    backend: Backend

    def launch(self, job_id: str, exit_code: int, seconds: float) -> Launch: ...

    def drive(self, launch: Launch, exit_code: int) -> None:
        """What the outside world does for the attempt to run and end with ``exit_code``."""

    def runs(self, launch: Launch) -> int:
        """How many executions of the attempt exist (supervisors, Jobs)."""


class LocalHarness:
    def __init__(self, home: Path) -> None:
        settings = Settings(home=home, instance_id="contract", cpus=1)
        runtimes = RuntimeManager(DEFAULT_CATALOG, home / "runtimes")
        self.backend = LocalBackend(settings, ObjectStore(str(home / "store")), LogStore(home / "logs"), runtimes)

    def launch(self, job_id: str, exit_code: int, seconds: float) -> Launch:
        code = f"import sys, time; time.sleep({seconds}); sys.exit({exit_code})"
        spec = JobSpec.model_validate({"command": ["python", "-c", code], "runtime": {"python": sys.executable}})
        return Launch(job_id, ORG, 1, spec, cpus=1, memory=None, gpus=(), code_key=None)

    def drive(self, launch: Launch, exit_code: int) -> None:
        pass  # the process runs and exits by itself

    def runs(self, launch: Launch) -> int:
        attempt_dir = Path(self.backend.handle_for(launch.job_id, launch.attempt)["dir"])
        return 1 if json.loads((attempt_dir / "shim.pid").read_text()).get("pid") else 0


class KubernetesHarness:
    def __init__(self, fake: FakeKubeAPI, home: Path) -> None:
        self.fake = fake
        self.backend = KubernetesBackend(
            fake.api_client(),
            KubeConfig(namespace="kiln"),
            endpoint="http://kiln:8080",
            logs=LogStore(home / "logs"),
            state_dir=home / "state",
            watch_timeout=2,
        )

    def launch(self, job_id: str, exit_code: int, seconds: float) -> Launch:
        spec = JobSpec.model_validate({"command": "python train.py", "runtime": {"image": "python:3.11-slim"}})
        return Launch(job_id, ORG, 1, spec, cpus=1, memory=None, gpus=(), code_key=None, job_token="tok")

    def drive(self, launch: Launch, exit_code: int) -> None:
        pod = self.fake.pod(main_job_name(launch.job_id, launch.attempt, False))
        self.fake.set_running(pod)
        time.sleep(0.2)
        self.fake.set_terminated(pod, exit_code)

    def runs(self, launch: Launch) -> int:
        return len(self.fake.jobs(f"kiln.io/job={launch.job_id},kiln.io/attempt={launch.attempt}"))


@pytest.fixture(params=["local", "kubernetes"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    if request.param == "local":
        local = LocalHarness(tmp_path / "home")
        yield local
        local.backend.close()
        return
    with FakeKubeAPI() as fake:
        kube = KubernetesHarness(fake, tmp_path / "home")
        yield kube
        kube.backend.close()


def wait_status(backend: Backend, handle: dict[str, Any], done: Callable[[AttemptStatus], bool]) -> AttemptStatus:
    deadline = time.monotonic() + 15
    while True:
        status = backend.poll(handle)
        if done(status):
            return status
        assert time.monotonic() < deadline, f"still {status}"
        time.sleep(0.05)


def ended(status: AttemptStatus) -> bool:
    return status.phase in (Phase.EXITED, Phase.LOST)


def test_start_is_idempotent_and_the_handle_is_json(harness: Harness) -> None:
    launch = harness.launch("job-idem", 0, 0.5)
    handle = harness.backend.start(launch)
    assert harness.backend.start(launch) == handle  # after a crash the scheduler may call it again
    assert handle == harness.backend.handle_for("job-idem", 1)
    assert json.loads(json.dumps(handle)) == handle
    assert harness.runs(launch) == 1
    harness.drive(launch, 0)
    wait_status(harness.backend, handle, ended)


@pytest.mark.parametrize("code", [0, 3])
def test_an_attempt_ends_with_its_exit_code(harness: Harness, code: int) -> None:
    launch = harness.launch(f"job-exit-{code}", code, 0.2)
    handle = harness.backend.start(launch)
    assert harness.backend.poll(handle).phase in (Phase.STARTING, Phase.RUNNING)
    harness.drive(launch, code)
    status = wait_status(harness.backend, handle, ended)
    assert status.phase is Phase.EXITED and status.exit_code == code
    assert (status.reason == "Completed") is (code == 0)
    assert status.finished_at is not None
    assert harness.backend.poll(handle) == status  # an ended attempt stays ended


def test_cancel_is_idempotent(harness: Harness) -> None:
    launch = harness.launch("job-cancel", 0, 60)
    handle = harness.backend.start(launch)
    if isinstance(harness, KubernetesHarness):
        harness.fake.set_running(harness.fake.pod(main_job_name("job-cancel", 1, False)))
    wait_status(harness.backend, handle, lambda s: s.phase is Phase.RUNNING)
    harness.backend.cancel(handle, 1.0)
    harness.backend.cancel(handle, 1.0)
    status = wait_status(harness.backend, handle, ended)
    assert status.reason != "Completed"
    harness.backend.cancel(handle, 1.0)  # after the end too
    harness.backend.cleanup(handle)
    harness.backend.cleanup(handle)

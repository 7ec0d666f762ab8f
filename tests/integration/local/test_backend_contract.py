"""The backend contract (kiln.backends.base and the capabilities of kiln.backends.capabilities), one suite for every
registered backend: the local executor (real processes in its sandbox) and the Kubernetes controller (against the
FAKE API server of tests/fakes/kube_api.py, whose pods a driver moves as a kubelet would).

Each backend's declared capabilities are asserted explicitly (``DECLARED``); a test of a capability runs on the
backends that declare it and is left out, by parametrization, for those that do not: a backend without
``Preemptible`` is never asked to preempt, one without ``OutputCollector`` never to collect outputs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from kiln.backends import registry
from kiln.backends.base import AttemptStatus, Backend, Launch, Phase
from kiln.backends.capabilities import (
    CheckpointSyncer,
    EventSyncer,
    OutputCollector,
    Preemptible,
    declared,
)
from kiln.backends.kubernetes.backend import KubernetesBackend
from kiln.backends.kubernetes.render import KubeConfig, main_job_name
from kiln.backends.local.executor import LocalBackend
from kiln.backends.local.runtimes import RuntimeManager
from kiln.domain.catalog import DEFAULT_CATALOG
from kiln.domain.spec import JobSpec
from kiln.settings import Settings
from kiln.storage.logs import LogStore
from kiln.storage.store import ObjectStore
from kiln.tasks.runner import TaskRunner
from tests.fakes.kube_api import FakeKubeAPI
from tests.helpers import run_background_work
from tests.kilnserver import TEST_PYTHON_ROOTS

ORG = "org-1"

# What each backend declares, by design. A change here is a change of the contract: say why in the commit.
DECLARED = {
    "local": {
        "SpecValidator",
        "Preemptible",
        "OutputCollector",
        "CheckpointSyncer",
        "EventSyncer",
        "JobFiles",
        "ExtractsMetrics",
        "RuntimeBuilder",
        "NotebookHost",
    },
    "kubernetes": {"SpecValidator", "Preemptible", "ServiceDeployer", "NotebookHost"},
    "slurm": {"SpecValidator", "Preemptible"},
}
# Backends whose harness needs a machine-wide fixture: their run of this suite is in another module, with the tests
# that share that fixture (one unit of work under pytest-xdist, so one worker starts it).
ELSEWHERE = {"slurm": "tests/integration/slurm/test_contract.py (on the two-node Slurm cluster)"}
HERE = sorted(set(DECLARED) - set(ELSEWHERE))

# The local job: appends its attempt to a checkpoint, writes an output, then waits for the test's word (the
# file ``go`` in its work dir, holding the exit code) or a preemption (it records the notice it was given, then
# exits 0 on SIGTERM, as a job that checkpoints and obeys does).
LOCAL_JOB = """
import os, signal, sys, time
if "CONTRACT_DIR" in os.environ:  # where the test reads and writes the job's files (a Slurm node's scratch is not)
    os.chdir(os.environ["CONTRACT_DIR"])
ck, out = os.environ["KILN_CHECKPOINT_DIR"], os.environ["KILN_OUTPUT_DIR"]
with open(os.path.join(ck, "attempts.txt"), "a") as f:
    f.write(os.environ["KILN_ATTEMPT"] + "\\n")
with open(os.path.join(out, "result.txt"), "w") as f:
    f.write("attempt " + os.environ["KILN_ATTEMPT"])
if os.environ.get("KILN_TENSORBOARD_DIR"):  # what a TensorBoard reads (EventSyncer)
    tb = os.path.join(os.environ["KILN_TENSORBOARD_DIR"], "train")
    os.makedirs(tb, exist_ok=True)
    with open(os.path.join(tb, "events.out.tfevents.1.contract"), "a") as f:
        f.write("attempt " + os.environ["KILN_ATTEMPT"])
def obey(*_):
    notice = os.environ["KILN_NOTICE_FILE"]
    with open("obeyed", "w") as f:
        f.write(open(notice).read() if os.path.exists(notice) else "no notice")
    sys.exit(0)
signal.signal(signal.SIGTERM, obey)
open("ready", "w").close()
while not os.path.exists("go"):
    time.sleep(0.05)
sys.exit(int(open("go").read()))
"""


class Harness(Protocol):
    name: str
    backend: Backend
    lost_reason: str  # the reason of an attempt whose process/pod vanished
    never_started_reason: str  # the reason of an attempt a crash kept from starting (Phase.UNLAUNCHED)

    def launch(self, job_id: str, attempt: int = 1) -> Launch: ...

    def drive(self, launch: Launch, exit_code: int) -> None:
        """What the outside world does for the attempt to run and end with ``exit_code``."""

    def running(self, launch: Launch) -> None:
        """What the outside world does for the attempt to run (no-op where it runs by itself)."""

    def runs(self, launch: Launch) -> int:
        """How many executions of the attempt exist (supervisors, Jobs)."""

    def vanish(self, launch: Launch) -> None:
        """The attempt's process or pod disappears without a trace of how it ended."""

    def restarted(self) -> Backend:
        """A new backend on the same state, as a server that restarted builds it."""


class LocalHarness:
    name = "local"
    lost_reason = "ShimLost"
    never_started_reason = "NotLaunched"

    def __init__(self, home: Path) -> None:
        self.home = home
        self.settings = Settings(
            home=home, instance_id="contract", cpus=1, allowed_python_roots=[Path(p) for p in TEST_PYTHON_ROOTS]
        )
        self.store = ObjectStore(str(home / "store"))
        self.backends: list[LocalBackend] = []
        self.backend = self.restarted()

    def restarted(self) -> LocalBackend:
        runtimes = RuntimeManager(DEFAULT_CATALOG, self.home / "runtimes")
        backend = LocalBackend(self.settings, self.store, LogStore(self.home / "logs"), runtimes)
        self.backends.append(backend)
        return backend

    def launch(self, job_id: str, attempt: int = 1) -> Launch:
        spec = JobSpec.model_validate({"command": ["python", "-c", LOCAL_JOB], "runtime": {"python": sys.executable}})
        return Launch(job_id, ORG, attempt, spec, cpus=1, memory=None, gpus=(), code_key=None)

    def work(self, launch: Launch) -> Path:
        return self.settings.jobs_dir / launch.job_id / "work"

    def running(self, launch: Launch) -> None:
        """Waits until the job is past its set-up (its checkpoint and output written, SIGTERM handled)."""
        ready = self.work(launch) / "ready"
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert time.monotonic() < deadline, f"job {launch.job_id} never got ready"
            time.sleep(0.05)

    def drive(self, launch: Launch, exit_code: int) -> None:
        self.running(launch)
        _go(self.work(launch), exit_code)

    def _pid(self, launch: Launch) -> int:
        attempt_dir = Path(self.backend.handle_for(launch.job_id, launch.attempt)["dir"])
        return int(json.loads((attempt_dir / "shim.pid").read_text())["pid"])

    def runs(self, launch: Launch) -> int:
        """How many times the job's command ran for this attempt (each run appends the attempt's number to its
        checkpoint before anything else)."""
        try:
            lines = (self.settings.jobs_dir / launch.job_id / "checkpoints" / "attempts.txt").read_text().split()
        except FileNotFoundError:
            return 0
        return lines.count(str(launch.attempt))

    def vanish(self, launch: Launch) -> None:
        os.killpg(self._pid(launch), signal.SIGKILL)  # the shim leads its session: it and its job, at once

    def close(self) -> None:
        for backend in self.backends:
            backend.close()
        for work in self.settings.jobs_dir.glob("*/work"):  # a job a failed test left waiting ends now
            _go(work, 0)


def _go(work: Path, exit_code: int) -> None:
    """The job's signal to exit, whole when it appears: a job that polls for ``go`` and found it created but
    still empty read int("") and ended with exit code 1 (seen under load)."""
    (work / "go.tmp").write_text(str(exit_code))
    (work / "go.tmp").rename(work / "go")


def read(store: ObjectStore, key: str) -> bytes:
    with store.open(key) as fh:
        return fh.read()


class KubernetesHarness:
    name = "kubernetes"
    lost_reason = "NodeLost"
    never_started_reason = "JobMissing"

    def __init__(self, fake: FakeKubeAPI, home: Path) -> None:
        self.fake = fake
        self.home = home
        self.backends: list[KubernetesBackend] = []
        self.runners: list[TaskRunner] = []
        self.backend = self.restarted()

    def restarted(self) -> KubernetesBackend:
        backend = KubernetesBackend(
            self.fake.api_client(),
            KubeConfig(namespace="kiln"),
            endpoint="http://kiln:8080",
            logs=LogStore(self.home / "logs"),
            state_dir=self.home / "state",
            watch_timeout=2,
        )
        self.backends.append(backend)
        self.runners.append(run_background_work(backend))  # its informers, as a server's task runner runs them
        return backend

    def launch(self, job_id: str, attempt: int = 1) -> Launch:
        spec = JobSpec.model_validate({"command": "python train.py", "runtime": {"image": "python:3.11-slim"}})
        return Launch(job_id, ORG, attempt, spec, cpus=1, memory=None, gpus=(), code_key=None, job_token="tok")

    def _pod(self, launch: Launch) -> str:
        return self.fake.pod(main_job_name(launch.job_id, launch.attempt, False))

    def running(self, launch: Launch) -> None:
        self.fake.set_running(self._pod(launch))

    def drive(self, launch: Launch, exit_code: int) -> None:
        pod = self._pod(launch)
        self.fake.set_running(pod)
        time.sleep(0.2)
        self.fake.set_terminated(pod, exit_code)

    def runs(self, launch: Launch) -> int:
        return len(self.fake.jobs(f"kiln.io/job={launch.job_id},kiln.io/attempt={launch.attempt}"))

    def vanish(self, launch: Launch) -> None:
        self.fake.delete_pod(self._pod(launch))

    def close(self) -> None:
        for runner in self.runners:
            runner.stop()
        for backend in self.backends:
            backend.close()


def _harness(name: str, tmp_path: Path) -> Iterator[Harness]:
    if name == "local":
        local = LocalHarness(tmp_path / "home")
        try:
            yield local
        finally:
            local.close()
        return
    with FakeKubeAPI() as fake:
        kube = KubernetesHarness(fake, tmp_path / "home")
        try:
            yield kube
        finally:
            kube.close()


@pytest.fixture(params=HERE)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    yield from _harness(request.param, tmp_path)


def declaring(capability: type) -> list[Any]:
    """The backends that declare ``capability``, as the parameters of a test of it."""
    return [name for name in HERE if capability.__name__ in DECLARED[name]]


@pytest.fixture
def capable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    yield from _harness(request.param, tmp_path)


def wait_status(backend: Backend, handle: dict[str, Any], done: Callable[[AttemptStatus], bool]) -> AttemptStatus:
    deadline = time.monotonic() + 20
    while True:
        status = backend.poll(handle)
        if done(status):
            return status
        assert time.monotonic() < deadline, f"still {status}"
        time.sleep(0.05)


def ended(status: AttemptStatus) -> bool:
    return status.phase in (Phase.EXITED, Phase.LOST)


def is_running(status: AttemptStatus) -> bool:
    return status.phase is Phase.RUNNING


def test_every_registered_backend_loads_and_declares_its_capabilities() -> None:
    found = {info.name: info for info in registry.listing()}
    assert set(found) == set(DECLARED)  # every registered backend is in this suite
    for name, info in found.items():
        assert info.loaded, info.error
        assert set(info.capabilities) == DECLARED[name], name


def test_the_backend_declares_what_the_suite_expects(harness: Harness) -> None:
    assert set(declared(harness.backend)) == DECLARED[harness.name]


def test_start_is_idempotent_and_the_handle_is_json(harness: Harness) -> None:
    launch = harness.launch("job-idem")
    handle = harness.backend.start(launch)
    assert harness.backend.start(launch) == handle  # after a crash the scheduler may call it again
    assert handle == harness.backend.handle_for(launch.job_id, 1)
    assert json.loads(json.dumps(handle)) == handle
    harness.running(launch)
    assert harness.runs(launch) == 1
    harness.drive(launch, 0)
    wait_status(harness.backend, handle, ended)
    assert harness.runs(launch) == 1


@pytest.mark.parametrize("code", [0, 3])
def test_an_attempt_runs_then_ends_with_its_exit_code(harness: Harness, code: int) -> None:
    launch = harness.launch(f"job-exit-{code}")
    handle = harness.backend.start(launch)
    assert harness.backend.poll(handle).phase in (Phase.STARTING, Phase.RUNNING)
    harness.running(launch)
    running = wait_status(harness.backend, handle, is_running)
    assert running.running_at is not None
    harness.drive(launch, code)
    status = wait_status(harness.backend, handle, ended)
    assert status.phase is Phase.EXITED and status.exit_code == code
    assert (status.reason == "Completed") is (code == 0)
    assert status.finished_at is not None
    assert harness.backend.poll(handle) == status  # an ended attempt stays ended


def test_cancel_is_idempotent(harness: Harness) -> None:
    launch = harness.launch("job-cancel")
    handle = harness.backend.start(launch)
    harness.running(launch)
    wait_status(harness.backend, handle, is_running)
    harness.backend.cancel(handle, 1.0)
    harness.backend.cancel(handle, 1.0)
    status = wait_status(harness.backend, handle, ended)
    assert status.reason != "Completed"
    harness.backend.cancel(handle, 1.0)  # after the end too
    harness.backend.cleanup(handle)
    harness.backend.cleanup(handle)


def test_local_cleanup_spares_a_session_that_took_a_dead_shims_pid(tmp_path: Path) -> None:
    """Cleaning up an ended attempt kills what its shim's session left running. Pids wrap (32,768 here, many
    times during the test suite): once that session is empty its id may be another job's shim's, and that job
    was killed by this cleanup (make test saw a job end ShimLost before it ran)."""
    local = LocalHarness(tmp_path / "home")
    other: subprocess.Popen[bytes] | None = None
    try:
        launch = local.launch("job-reused")
        handle = local.backend.start(launch)
        local.running(launch)
        _go(local.work(launch), 0)
        assert wait_status(local.backend, handle, ended).reason == "Completed"
        other = subprocess.Popen(["sleep", "60"], start_new_session=True)  # the session that got the pid
        pid_file = Path(handle["dir"]) / "shim.pid"
        record = json.loads(pid_file.read_text())
        pid_file.write_text(json.dumps(dict(record, pid=other.pid)))  # the shim's start time, another's pid
        local.backend.cleanup(handle)
        time.sleep(0.2)
        assert other.poll() is None, "the cleanup killed a session the dead shim's pid now names"
    finally:
        if other is not None:
            other.kill()
            other.wait()
        local.close()


def test_local_job_files_follow_the_attempt_into_the_home_that_started_it(tmp_path: Path) -> None:
    """Servers on one machine adopt each other's attempts (one died): the adopter keeps the attempt's checkpoints
    and frees its files where the attempt's server put them, as it collects its outputs. Before, it looked in its
    own home: an adopted job's checkpoints never reached the store and its files stayed."""
    started, adopter = LocalHarness(tmp_path / "first"), LocalHarness(tmp_path / "second")
    try:
        launch = started.launch("job-adopted")
        handle = started.backend.start(launch)
        started.running(launch)
        assert adopter.backend.sync_checkpoints(handle, "checkpoints/job-adopted")[0] == 1
        assert read(adopter.store, "checkpoints/job-adopted/attempts.txt") == b"1\n"
        started.drive(launch, 0)
        assert wait_status(adopter.backend, handle, ended).exit_code == 0
        work = started.work(launch)
        assert work.is_dir()
        adopter.backend.release(handle, keep=False)
        assert not work.exists()
    finally:
        started.close()
        adopter.close()


def test_a_vanished_attempt_is_lost_with_the_reason(harness: Harness) -> None:
    launch = harness.launch("job-gone")
    handle = harness.backend.start(launch)
    harness.running(launch)
    wait_status(harness.backend, handle, is_running)
    harness.vanish(launch)
    status = wait_status(harness.backend, handle, ended)
    assert (status.phase, status.reason) == (Phase.LOST, harness.lost_reason)
    assert status.message
    harness.backend.cleanup(handle)
    assert harness.backend.poll(handle).phase is Phase.LOST


def test_a_restarted_server_reattaches_to_an_attempt_it_started(harness: Harness) -> None:
    """The server started the attempt and died before it saw it run: a new backend on the same state finds it
    by ``handle_for`` (the handle the database holds may be from before ``start``), and starting it again
    (the scheduler may) starts nothing new."""
    launch = harness.launch("job-crash")
    harness.backend.start(launch)
    harness.backend.close()
    again = harness.restarted()
    handle = again.handle_for(launch.job_id, 1)
    harness.running(launch)
    wait_status(again, handle, is_running)
    assert again.start(launch) == handle
    assert harness.runs(launch) == 1
    harness.drive(launch, 0)
    status = wait_status(again, handle, ended)
    assert (status.phase, status.exit_code, status.reason) == (Phase.EXITED, 0, "Completed")


def test_a_restarted_server_finds_an_attempt_it_never_started_unlaunched_and_starts_it(harness: Harness) -> None:
    """The server committed the attempt (its handle, from ``handle_for``) and died before ``start``: polling it
    says so, at once and for as long as nothing launches it (never LOST: the job did nothing wrong), and
    starting it then runs it, once."""
    launch = harness.launch("job-never")
    harness.backend.close()
    again = harness.restarted()
    handle = again.handle_for(launch.job_id, 1)
    for _ in range(3):
        status = again.poll(handle)
        assert (status.phase, status.reason) == (Phase.UNLAUNCHED, harness.never_started_reason)
        assert status.message
    assert again.start(launch) == handle
    harness.running(launch)
    wait_status(again, handle, is_running)
    assert again.start(launch) == handle  # adopted, not launched again
    harness.drive(launch, 0)
    status = wait_status(again, handle, ended)
    assert (status.phase, status.exit_code, status.reason) == (Phase.EXITED, 0, "Completed")
    assert harness.runs(launch) == 1


def test_cancelling_an_attempt_never_launched_ends_it(harness: Harness) -> None:
    """A job cancelled while its attempt was recorded STARTING but never launched: the cancel ends the attempt
    (the reconciler then ends the job as cancelled) and nothing of it runs."""
    launch = harness.launch("job-cancel-unlaunched")
    handle = harness.backend.handle_for(launch.job_id, launch.attempt)
    assert harness.backend.poll(handle).phase is Phase.UNLAUNCHED
    harness.backend.cancel(handle, 1.0)
    status = wait_status(harness.backend, handle, ended)
    assert status.phase is Phase.EXITED and status.reason != "Completed"
    assert harness.runs(launch) == 0


@pytest.mark.parametrize("capable", declaring(Preemptible), indirect=True)
def test_preemption_warns_then_stops_the_attempt(capable: Harness) -> None:
    backend = capable.backend
    assert isinstance(backend, Preemptible)
    launch = capable.launch("job-preempt")
    handle = backend.start(launch)
    capable.running(launch)
    wait_status(backend, handle, is_running)
    backend.preempt(handle, "job-high needs the GPU", 5.0)
    backend.preempt(handle, "job-high needs the GPU", 5.0)  # idempotent
    status = wait_status(backend, handle, ended)
    assert status.reason == "Preempted"
    assert "job-high needs the GPU" in status.message
    if isinstance(capable, LocalHarness):  # the notice came before the signal, and the job could read it
        obeyed = json.loads((capable.work(launch) / "obeyed").read_text())
        assert obeyed == {"reason": "Preempted", "message": "job-high needs the GPU", "grace_seconds": 5.0}


@pytest.mark.parametrize("capable", declaring(OutputCollector), indirect=True)
def test_outputs_are_collected_into_the_store(capable: Harness) -> None:
    backend = capable.backend
    assert isinstance(backend, OutputCollector)
    launch = capable.launch("job-out")
    handle = backend.start(launch)
    capable.drive(launch, 0)
    wait_status(backend, handle, ended)
    files, size = backend.collect_outputs(handle, "outputs/job-out")
    assert (files, size) == (1, len("attempt 1"))
    assert backend.collect_outputs(handle, "outputs/job-out") == (files, size)  # idempotent
    assert isinstance(capable, LocalHarness)
    assert read(capable.store, "outputs/job-out/result.txt") == b"attempt 1"


@pytest.mark.parametrize("capable", declaring(EventSyncer), indirect=True)
def test_event_files_reach_the_store_while_the_job_runs_and_once_more_at_its_end(capable: Harness) -> None:
    backend = capable.backend
    assert isinstance(backend, EventSyncer) and isinstance(capable, LocalHarness)
    first = capable.launch("job-ev", attempt=1)
    handle = backend.start(first)
    capable.running(first)
    assert backend.sync_events(handle, "tensorboard/job-ev") == (1, len("attempt 1"))  # while it runs
    assert read(capable.store, "tensorboard/job-ev/train/events.out.tfevents.1.contract") == b"attempt 1"
    assert backend.sync_events(handle, "tensorboard/job-ev") == (0, len("attempt 1"))  # only what changed
    capable.drive(first, 0)
    assert wait_status(backend, handle, ended).exit_code == 0
    assert backend.sync_events(handle, "tensorboard/job-ev") == (0, len("attempt 1"))


@pytest.mark.parametrize("capable", declaring(CheckpointSyncer), indirect=True)
def test_checkpoints_are_kept_across_attempts_and_in_the_store(capable: Harness) -> None:
    backend = capable.backend
    assert isinstance(backend, CheckpointSyncer) and isinstance(capable, LocalHarness)
    first = capable.launch("job-ck", attempt=1)
    handle = backend.start(first)
    capable.running(first)
    assert backend.sync_checkpoints(handle, "checkpoints/job-ck")[0] == 1  # while it runs
    assert read(capable.store, "checkpoints/job-ck/attempts.txt") == b"1\n"
    assert backend.sync_checkpoints(handle, "checkpoints/job-ck") == (0, 0)  # only what changed
    capable.drive(first, 3)
    wait_status(backend, handle, ended)
    (capable.work(first) / "go").unlink()
    (capable.work(first) / "ready").unlink()
    second = capable.launch("job-ck", attempt=2)
    handle = backend.start(second)
    capable.running(second)
    capable.drive(second, 0)
    assert wait_status(backend, handle, ended).exit_code == 0
    backend.sync_checkpoints(handle, "checkpoints/job-ck")
    assert read(capable.store, "checkpoints/job-ck/attempts.txt") == b"1\n2\n"  # the second saw the first's

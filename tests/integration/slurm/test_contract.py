"""The backend contract suite (tests/integration/local/test_backend_contract.py) run against the Slurm backend on the
real
two-node cluster: the same tests, imported, with a harness whose attempts are real Slurm jobs.

An attempt's members reach Kiln's API with the job token (code, checkpoints, outputs, logs), so each contract
"job" is backed by a real job of a real Kiln server listening on the cluster's bridge (a holder: a local job
that hands the test its token and waits): the Slurm attempt runs as that job. The job's files the test reads and
writes (``ready``, ``go``, ``obeyed``) are in a directory of the test's (``CONTRACT_DIR``), which every node sees.
What vanishes an attempt here is a node failing: ``scontrol update state=down`` ends its jobs as NODE_FAIL."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln.backends.base import Launch, Phase
from kiln.backends.capabilities import Preemptible
from kiln.backends.slurm.backend import SlurmBackend
from kiln.backends.slurm.settings import slurm_commands
from kiln.domain.spec import JobSpec
from kiln.settings import SlurmSettings
from kiln.tasks.runner import TaskRunner
from tests.helpers import run_background_work
from tests.integration.local.test_backend_contract import (
    DECLARED,
    LOCAL_JOB,
    _go,
    ended,
    is_running,
    test_a_restarted_server_finds_an_attempt_it_never_started_unlaunched_and_starts_it,
    test_a_restarted_server_reattaches_to_an_attempt_it_started,
    test_a_vanished_attempt_is_lost_with_the_reason,
    test_an_attempt_runs_then_ends_with_its_exit_code,
    test_cancel_is_idempotent,
    test_cancelling_an_attempt_never_launched_ends_it,
    test_start_is_idempotent_and_the_handle_is_json,
    test_the_backend_declares_what_the_suite_expects,
    wait_status,
)
from tests.kilnserver import KilnServer
from tests.slurm_cluster import SlurmCluster

__all__ = [  # the contract's tests, collected here for the Slurm backend
    "test_a_restarted_server_finds_an_attempt_it_never_started_unlaunched_and_starts_it",
    "test_a_restarted_server_reattaches_to_an_attempt_it_started",
    "test_a_vanished_attempt_is_lost_with_the_reason",
    "test_an_attempt_runs_then_ends_with_its_exit_code",
    "test_cancel_is_idempotent",
    "test_cancelling_an_attempt_never_launched_ends_it",
    "test_start_is_idempotent_and_the_handle_is_json",
    "test_the_backend_declares_what_the_suite_expects",
]

HOLDER = "import os, sys, time; open(sys.argv[1], 'w').write(os.environ['KILN_JOB_TOKEN']); time.sleep(600)"
WAIT = 120


class ApiServer(KilnServer):
    """The Kiln server the attempts' members talk to, on the bridge (local backend: it runs the holders)."""

    @property
    def url(self) -> str:
        return f"http://{SlurmCluster.bridge_address}:{self.port}"


@pytest.fixture(scope="module")
def api_server(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    server = ApiServer(tmp_path_factory.mktemp("contract-api") / "home", host=SlurmCluster.bridge_address)
    server.env["KILN_PUBLIC_ENDPOINT"] = server.url
    server.start()
    yield server
    server.stop()


class SlurmHarness:
    name = "slurm"
    lost_reason = "NodeLost"
    never_started_reason = "NotSubmitted"

    def __init__(self, cluster: SlurmCluster, api: ApiServer, root: Path) -> None:
        self.cluster = cluster
        self.api = api
        self.client = api.client()
        self.root = root
        (root / "scratch").mkdir(parents=True)
        self.settings = SlurmSettings(python=sys.executable, scratch_dir=str(root / "scratch"), log_dir=str(root))
        self.holders: dict[str, tuple[str, str]] = {}  # name → (job id, token)
        self.backends: list[SlurmBackend] = []
        self.runners: list[TaskRunner] = []
        self.backend = self.restarted()

    def restarted(self) -> SlurmBackend:
        backend = SlurmBackend(
            self.settings, slurm_commands(self.settings), endpoint=self.api.url, env=self.cluster.env
        )
        self.backends.append(backend)
        self.runners.append(run_background_work(backend))
        return backend

    def _holder(self, name: str) -> tuple[str, str]:
        if name not in self.holders:
            job = self.client.submit(
                {"command": [sys.executable, "-c", HOLDER, "token"], "runtime": {"python": sys.executable},
                 "resources": {"cpus": 0.1}}
            )  # fmt: skip
            token_file = self.api.home / "jobs" / job.id / "work" / "token"  # its work dir: the sandbox lets it write
            deadline = time.monotonic() + WAIT
            while not (token_file.exists() and token_file.stat().st_size):
                assert time.monotonic() < deadline, f"the holder job {job.id} never gave its token"
                time.sleep(0.1)
            self.holders[name] = (job.id, token_file.read_text())
        return self.holders[name]

    def launch(self, name: str, attempt: int = 1) -> Launch:
        job_id, token = self._holder(name)
        files = self.root / job_id
        files.mkdir(exist_ok=True)
        spec = JobSpec.model_validate(
            {"command": ["python", "-c", LOCAL_JOB], "runtime": {"python": sys.executable},
             "env": {"CONTRACT_DIR": str(files)}}
        )  # fmt: skip
        return Launch(
            job_id, "org", attempt, spec, cpus=1, memory=None, gpus=(), code_key=None,
            job_token=token, api_endpoint=self.api.url,
        )  # fmt: skip

    def work(self, launch: Launch) -> Path:
        return self.root / launch.job_id

    def running(self, launch: Launch) -> None:
        ready = self.work(launch) / "ready"
        deadline = time.monotonic() + WAIT
        while not ready.exists():
            assert time.monotonic() < deadline, f"job {launch.job_id} never got ready"
            time.sleep(0.1)

    def drive(self, launch: Launch, exit_code: int) -> None:
        self.running(launch)
        _go(self.work(launch), exit_code)

    def _slurm(self, launch: Launch) -> list[tuple[str, str]]:
        """(Slurm id, node) of every Slurm job of the attempt, whatever its state."""
        done = self.cluster.run(
            "squeue", "-h", "--states=all", f"--name=kiln-{launch.job_id}-a{launch.attempt}", "-O", "JobID:|,NodeList:|"
        )
        return [tuple(p.strip() for p in line.split("|")[:2]) for line in done.stdout.splitlines()]  # type: ignore[misc]

    def runs(self, launch: Launch) -> int:
        return len(self._slurm(launch))

    def vanish(self, launch: Launch) -> None:
        """Its node fails: set DOWN, Slurm ends the job as NODE_FAIL; the node comes back for the next tests."""
        [(_, node)] = self._slurm(launch)
        self.cluster.run("scontrol", "update", f"nodename={node}", "state=down", "reason=kiln-contract-test")
        self.downed = node

    def close(self) -> None:
        for runner in self.runners:
            runner.stop()
        for backend in self.backends:
            backend.close()
        for files in self.root.iterdir():
            if files.is_dir() and files.name.startswith("job-"):
                _go(files, 0)
        for job_id, _ in self.holders.values():
            self.client.cancel(job_id)
        node = getattr(self, "downed", None)
        if node:
            self.cluster.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
            deadline = time.monotonic() + WAIT
            while self.cluster.node_states(check=False).get(node) not in ("idle", "mixed", "allocated"):
                assert time.monotonic() < deadline, f"node {node} did not come back: {self.cluster.node_states()}"
                time.sleep(0.5)


@pytest.fixture
def harness(slurm_cluster: SlurmCluster, api_server: ApiServer, tmp_path: Path) -> Iterator[SlurmHarness]:
    found = SlurmHarness(slurm_cluster, api_server, tmp_path / "harness")
    try:
        yield found
    finally:
        found.close()


def test_the_suite_declares_slurm() -> None:
    assert DECLARED["slurm"] == {"SpecValidator", "Preemptible"}


def test_preemption_writes_the_notice_then_stops_the_attempt(harness: SlurmHarness) -> None:
    """The contract's preemption test, and what only a node's members can show: the notice file was there, with
    the reason Preempted, when the job got SIGTERM (the job records what it read, then exits 0)."""
    backend = harness.backend
    assert isinstance(backend, Preemptible)
    launch = harness.launch("job-preempt")
    handle = backend.start(launch)
    harness.running(launch)
    wait_status(backend, handle, is_running)
    backend.preempt(handle, "job-high needs the GPU", 30.0)
    backend.preempt(handle, "job-high needs the GPU", 30.0)  # idempotent
    status = wait_status(backend, handle, ended)
    assert status.reason == "Preempted" and "job-high needs the GPU" in status.message
    obeyed = (harness.work(launch) / "obeyed").read_text()
    assert '"reason": "Preempted"' in obeyed, obeyed


def test_a_preempted_job_that_ignores_sigterm_is_cancelled_after_the_grace(harness: SlurmHarness) -> None:
    """preempt's grace, then scancel: a job that never exits is ended all the same."""
    backend = harness.backend
    launch = harness.launch("job-stubborn")
    spec = JobSpec.model_validate(
        {"command": ["python", "-c", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                     "open('ready', 'w').close()\ntime.sleep(600)"],
         "runtime": {"python": sys.executable}, "env": {"CONTRACT_DIR": str(harness.work(launch))}}
    )  # fmt: skip
    stubborn = Launch(**{**launch.__dict__, "spec": spec})
    handle = backend.start(stubborn)
    wait_status(backend, handle, is_running)
    backend.preempt(handle, "make room", 2.0)
    status = wait_status(backend, handle, ended)
    assert (status.phase, status.reason) == (Phase.EXITED, "Preempted")

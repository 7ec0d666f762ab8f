"""An attempt of the local executor runs at most once, whoever launches it and whenever: the claim
(kiln.injob.claim) against the launches a crash leaves behind — a second server's start racing the first's, a
shim forked from a dead server's launcher after the attempt was cancelled."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from kiln.backends.base import Phase
from kiln.backends.local.runtime_builder import SHIM_PATH
from kiln.injob import claim
from tests.integration.local.test_backend_contract import LocalHarness, ended, is_running, wait_status


@pytest.fixture
def local(tmp_path: Path):  # type: ignore[no-untyped-def]
    harness = LocalHarness(tmp_path / "home")
    try:
        yield harness
    finally:
        harness.close()


def test_shims_racing_for_one_attempt_run_it_once(local: LocalHarness) -> None:
    """The server's launch and three more shims of the same attempt at once (a dead server's launcher still
    forking, a restarted server's own launch): one claims the attempt, every other runs nothing, writes nothing
    and exits EXIT_NOT_CLAIMED."""
    backend = local.backend
    launch = local.launch("job-race")
    handle = backend.start(launch)
    attempt_dir = str(handle["dir"])
    extra = [
        subprocess.Popen([sys.executable, "-I", "-S", str(SHIM_PATH), attempt_dir], stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    codes = [proc.wait(30) for proc in extra]
    assert codes == [claim.EXIT_NOT_CLAIMED] * 3, [proc.stderr.read() for proc in extra if proc.stderr]
    local.running(launch)
    wait_status(backend, handle, is_running)
    local.drive(launch, 0)
    status = wait_status(backend, handle, ended)
    assert (status.phase, status.exit_code, status.reason) == (Phase.EXITED, 0, "Completed")
    assert local.runs(launch) == 1
    for proc in extra:
        assert proc.stderr is not None
        proc.stderr.close()


def test_a_shim_holding_its_claim_is_not_lost_when_its_pid_file_seems_stale(local: LocalHarness) -> None:
    """The claim is the shim's life: a pid file whose start time no longer matches (the machine's clock stepped,
    which moves the boot time both sides compute start times from) does not make a running attempt ShimLost."""
    backend = local.backend
    launch = local.launch("job-stale")
    handle = backend.start(launch)
    attempt_dir = Path(str(handle["dir"]))
    local.running(launch)
    wait_status(backend, handle, is_running)
    record = json.loads((attempt_dir / claim.PID).read_text())
    (attempt_dir / claim.PID).write_text(json.dumps({**record, "create_time": record["create_time"] - 1.0}))
    assert not backend.shims.alive(attempt_dir / claim.PID)
    assert backend.poll(handle).phase is Phase.RUNNING
    local.drive(launch, 0)
    status = wait_status(backend, handle, ended)
    assert (status.phase, status.exit_code, status.reason) == (Phase.EXITED, 0, "Completed")


def test_a_late_shim_of_a_cancelled_unlaunched_attempt_runs_nothing(local: LocalHarness) -> None:
    """A launch request still in a dead server's launcher pipe forks a shim after the restarted server cancelled
    the attempt it had never seen launched: that shim finds the exit record under the claim and runs nothing."""
    backend = local.backend
    launch = local.launch("job-late")
    handle = backend.handle_for(launch.job_id, launch.attempt)
    attempt_dir = Path(str(handle["dir"]))
    launched = backend.shims.launch
    backend.shims.launch = lambda member_dir, token, asked: 0  # type: ignore[method-assign]
    try:
        backend.start(launch)  # the attempt's files made as the dead server had, its launch request unanswered
    finally:
        backend.shims.launch = launched  # type: ignore[method-assign]
    assert (attempt_dir / "shim.json").exists()
    assert backend.poll(handle).phase is Phase.UNLAUNCHED
    backend.cancel(handle, 1.0)
    record = json.loads((attempt_dir / claim.EXIT).read_text())
    assert record["reason"] == "Cancelled" and record["message"] == "cancelled before it started"
    late = subprocess.run(
        [sys.executable, "-I", "-S", str(SHIM_PATH), str(attempt_dir)], capture_output=True, text=True, timeout=30
    )
    assert late.returncode == claim.EXIT_NOT_CLAIMED, late.stderr
    assert "runs nothing" in late.stderr
    assert not (attempt_dir / claim.PID).exists()
    assert json.loads((attempt_dir / claim.EXIT).read_text()) == record
    assert local.runs(launch) == 0


def test_a_probe_never_makes_a_starting_shim_give_up(tmp_path: Path) -> None:
    """The server's probe (``held``) takes the lock for an instant; a shim claiming in that instant tries
    again rather than take the probe for another shim."""
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            claim.held(str(tmp_path))

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        taken = [claim.take(str(tmp_path)) for _ in range(1)]
    finally:
        stop.set()
        prober.join()
    assert taken[0] is not None
    assert claim.held(str(tmp_path))
    record = json.loads((tmp_path / claim.PID).read_text())
    assert abs(record["create_time"] - psutil.Process().create_time()) < 0.05
    assert claim.take(str(tmp_path)) is None  # held: a second claim in this process is refused too
    assert not claim.void(str(tmp_path), {"reason": "Cancelled"})


def test_a_claim_dies_with_its_shim(tmp_path: Path) -> None:
    """The kernel lets go of a dead shim's claim: the attempt reads as not held (then lost or relaunched)."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from kiln.injob import claim; "
            "assert claim.take(sys.argv[1]) is not None; print('held', flush=True); time.sleep(60)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert claim.held(str(tmp_path))
    finally:
        holder.kill()
        holder.wait(10)
    deadline = time.monotonic() + 5
    while claim.held(str(tmp_path)):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert claim.void(str(tmp_path), {"reason": "Cancelled"})


def test_a_server_that_takes_a_job_over_launches_it_where_its_row_says(tmp_path: Path) -> None:
    """Issue 27's chaos test (three servers on one machine): server A committed a job STARTING and, slow under
    load, had not started it when its lease ran out; server B took the job over, found the attempt never launched
    (nothing in the directory A's handle names) and launched it, in its own home. Observed through the recorded
    handle it was still never launched: B launched it again at every pass until the job failed after five
    launches, and A's start, coming after all, ran it a second time. B now launches it in the directory the row
    records, where A's late start finds it launched and the recorded handle sees it run, once."""
    a, b = LocalHarness(tmp_path / "a"), LocalHarness(tmp_path / "b")
    try:
        recorded = a.backend.handle_for("job-taken-over", 1)  # what A committed with STARTING
        launch = replace(a.launch("job-taken-over"), handle=recorded)
        assert b.backend.poll(recorded).phase is Phase.UNLAUNCHED
        b.backend.start(launch)
        a.backend.start(launch)  # A's start, after all
        a.running(launch)
        assert b.backend.poll(recorded).phase in (Phase.STARTING, Phase.RUNNING)
        a.drive(launch, 0)
        status = wait_status(b.backend, recorded, ended)
        assert (status.phase, status.exit_code, status.reason) == (Phase.EXITED, 0, "Completed")
        assert (a.runs(launch), b.runs(launch)) == (1, 0)
        assert not (b.settings.jobs_dir / "job-taken-over").exists()
    finally:
        a.close()
        b.close()

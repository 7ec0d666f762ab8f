"""A distributed job's log through `kiln logs` (a real subprocess) and the SDK's records, against a real server."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from kiln.sdk.logs import LogLine, LogSource
from tests.e2e.test_cli import base_env, kiln
from tests.helpers import wait_for
from tests.kilnserver import KilnServer

PY = sys.executable


@pytest.fixture(scope="module")
def gang_job(shared_server: KilnServer) -> str:
    """A finished two-worker job whose workers each print one line to stdout and one to stderr."""
    client = shared_server.client()
    script = "import os, sys; w = os.environ['KILN_WORKER_INDEX']; print('out', w); print('err', w, file=sys.stderr)"
    job = client.submit(
        {
            "command": [PY, "-c", script],
            "runtime": {"python": PY},
            "resources": {"cpus": 0.25},
            "distributed": {"framework": "pytorch", "workers": 2},
        }
    )
    done = wait_for(client, job.id, timeout=90)
    assert done.state == "SUCCEEDED", done.message
    return job.id


def test_one_worker_shows_each_of_its_kiln_lines_once_marked(
    shared_server: KilnServer, gang_job: str, tmp_path: Path
) -> None:
    env = {**base_env(tmp_path), **shared_server.credentials(), "KILN_ENDPOINT": shared_server.url}
    one = kiln(env, "logs", gang_job, "--worker", "1")
    assert one.returncode == 0, one.stderr
    assert one.stdout.splitlines() == ["out 1", "err 1"] or one.stdout.splitlines() == ["err 1", "out 1"]
    kiln_lines = one.stderr.splitlines()
    # Worker 1's own start and end, once each, marked as Kiln's like a single-worker job's (worker 0's are not
    # shown: they used to be, unmarked, so every line of Kiln's appeared twice).
    assert kiln_lines == ["[kiln] attempt 1 starting", "[kiln] attempt 1 ended: Completed (exit code 0)"], one.stderr

    every = kiln(env, "logs", gang_job)
    assert every.returncode == 0, every.stderr
    assert sorted(every.stdout.splitlines()) == [
        "[worker 0] err 0",
        "[worker 0] out 0",
        "[worker 1] err 1",
        "[worker 1] out 1",
    ]
    assert sorted(every.stderr.splitlines()) == [
        "[worker 0] [kiln] attempt 1 ended: Completed (exit code 0)",
        "[worker 0] [kiln] attempt 1 starting",
        "[worker 1] [kiln] attempt 1 ended: Completed (exit code 0)",
        "[worker 1] [kiln] attempt 1 starting",
    ]


def test_the_sdk_streams_records_that_print_as_people_read_them(shared_server: KilnServer, gang_job: str) -> None:
    records = list(shared_server.client().stream_logs(gang_job, follow=False))
    assert records and all(isinstance(r, LogLine) for r in records)
    now = datetime.now(UTC)
    assert all(r.time is not None and now - timedelta(minutes=10) < r.time <= now for r in records)
    assert all(r.attempt == 1 for r in records), records
    mine = [r for r in records if r.worker == "worker1"]
    assert {(r.source, r.text) for r in mine} == {
        (LogSource.KILN, "attempt 1 starting"),
        (LogSource.STDOUT, "out 1"),
        (LogSource.STDERR, "err 1"),
        (LogSource.KILN, "attempt 1 ended: Completed (exit code 0)"),
    }
    printed = {str(r) for r in mine}
    assert "[worker 1] out 1" in printed and "[worker 1] [kiln] attempt 1 starting" in printed
    assert all(r.source == "kiln" for r in records if r.text.startswith("attempt "))  # a str enum: "kiln" works


def test_a_single_worker_jobs_lines_print_bare(shared_server: KilnServer) -> None:
    client = shared_server.client()
    job = client.submit({"command": [PY, "-c", "print('hello')"], "runtime": {"python": PY}})
    assert wait_for(client, job.id, timeout=60).state == "SUCCEEDED"
    printed = [str(line) for line in client.stream_logs(job.id, follow=True)]  # follow: to the job's end
    assert "hello" in printed and "[kiln] attempt 1 starting" in printed, printed

"""A job's whole life on the local executor, on SQLite and on PostgreSQL."""

from __future__ import annotations

import re

import pytest

from kiln.errors import Conflict, InvalidInput, NotFound
from tests.helpers import log_text, spec, transitions, wait_for


def test_job_runs_to_success_with_events_and_logs(make_server, database_url):
    client = make_server(database_url).client()
    job = client.submit(spec("echo hello; echo oops >&2; echo bye", name="hello"))
    # STARTING where the submit placed it at once (free capacity, nothing of its organisation waiting), else QUEUED
    assert job.state in ("QUEUED", "STARTING") and job.name == "hello"
    done = wait_for(client, job.id)
    assert done.state == "SUCCEEDED", done.message
    assert done.exit_code == 0 and done.attempt == 1
    assert transitions(client, job.id) == [
        (None, "QUEUED"),
        ("QUEUED", "STARTING"),
        ("STARTING", "RUNNING"),
        ("RUNNING", "SUCCEEDED"),
    ]
    # stdout and stderr are separate pipes: order holds within each stream, not across them.
    lines = list(client.stream_logs(job.id, follow=False))
    assert [line.text for line in lines if line.source == "stdout"] == ["hello", "bye"]
    assert [line.text for line in lines if line.source == "stderr"] == ["oops"]
    assert done.started_at and done.running_at and done.finished_at
    assert done.started_at <= done.running_at <= done.finished_at


@pytest.mark.parametrize("command", ["no-such-command-kiln --x", ["no-such-command-kiln", "--x"]])
def test_missing_command_fails_with_reason(shared_server, command):
    client = shared_server.client()
    job = wait_for(client, client.submit(spec(command)).id)
    assert job.state == "FAILED"
    assert job.reason == "CommandNotFound"
    assert "no-such-command-kiln" in (job.message or "")
    last = client.events(job.id)[-1]
    assert last.to_state == "FAILED" and last.reason == "CommandNotFound"


def test_failure_restarts_then_fails(make_server, database_url):
    client = make_server(database_url, restart_backoff_seconds="0.1").client()
    job = client.submit(spec("echo try; exit 3", max_restarts=2, restart_on_exit_codes=[3]))
    done = wait_for(client, job.id)
    assert (done.state, done.reason, done.exit_code) == ("FAILED", "Error", 3)
    assert done.restarts == 2 and done.attempt == 3
    moves = transitions(client, job.id)
    assert moves.count(("RUNNING", "RESTARTING")) == 2
    assert moves.count(("RESTARTING", "STARTING")) == 2
    assert log_text(client, job.id) == ["try", "try", "try"]


def test_exit_code_outside_restart_list_is_not_retried(shared_server):
    client = shared_server.client()
    done = wait_for(client, client.submit(spec("exit 4", max_restarts=3, restart_on_exit_codes=[3])).id)
    assert (done.state, done.exit_code, done.restarts) == ("FAILED", 4, 0)


def test_restart_resumes_from_checkpoint_dir(shared_server):
    # The first attempt leaves a marker in $KILN_CHECKPOINT_DIR and fails; the second finds it and succeeds.
    script = (
        'if [ -f "$KILN_CHECKPOINT_DIR/mark" ]; then echo resumed; else touch "$KILN_CHECKPOINT_DIR/mark"; exit 1; fi'
    )
    client = shared_server.client()
    done = wait_for(client, client.submit(spec(script, max_restarts=1)).id)
    assert done.state == "SUCCEEDED" and done.restarts == 1
    assert log_text(client, done.id) == ["resumed"]


def test_timeout_fails_the_run(shared_server):
    client = shared_server.client()
    done = wait_for(client, client.submit(spec(["sleep", "30"], timeout="1s")).id, timeout=30)
    assert (done.state, done.reason) == ("FAILED", "Timeout")


def test_memory_limit_is_enforced(shared_server):
    hog = "import time; b = bytearray(300 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); time.sleep(30)"
    client = shared_server.client()
    job = client.submit(spec(["python", "-c", hog], resources={"memory": "100M"}))
    done = wait_for(client, job.id, timeout=30)
    assert (done.state, done.reason) == ("FAILED", "OOMKilled")
    # Sizes in the event a person reads are in binary units (the limit is 100 MiB), never raw byte counts.
    assert re.fullmatch(r"memory limit exceeded: \d+(\.\d)? MiB in use > limit 100 MiB", done.message or ""), (
        done.message
    )
    events = client.events(job.id)
    assert any(e.reason == "OOMKilled" and e.message == done.message for e in events), events


def test_prepare_and_finish_commands(shared_server):
    client = shared_server.client()
    job = client.submit(
        spec(
            "cat prepared.txt",
            prepare_command="echo from-prepare > prepared.txt",
            finish_command='echo "finish saw $KILN_EXIT_CODE"',
        )
    )
    done = wait_for(client, job.id)
    assert done.state == "SUCCEEDED"
    assert log_text(client, job.id) == ["from-prepare", "finish saw 0"]


def test_failed_prepare_fails_job(shared_server):
    client = shared_server.client()
    done = wait_for(client, client.submit(spec("echo never", prepare_command="exit 5")).id)
    assert (done.state, done.reason) == ("FAILED", "PrepareFailed")
    assert "never" not in log_text(client, done.id)


def test_environment_given_to_jobs(shared_server):
    client = shared_server.client()
    script = 'echo "$KILN_JOB_ID|$KILN_ATTEMPT|$MY_VAR|$CUDA_VISIBLE_DEVICES|${KILN_SECRET_KEY:-none}"'
    job = client.submit(spec(script, env={"MY_VAR": "42"}))
    wait_for(client, job.id, "SUCCEEDED")
    assert log_text(client, job.id) == [f"{job.id}|1|42||none"]


def test_cancel_queued_and_finished_jobs(make_server):
    client = make_server(cpus="1").client()
    blocker = client.submit(spec(["sleep", "30"], resources={"cpus": 1}))
    waiting = client.submit(spec(["sleep", "30"], resources={"cpus": 1}))
    wait_for(client, blocker.id, "RUNNING")
    queued = wait_for(client, waiting.id, "QUEUED")
    assert queued.state == "QUEUED"
    cancelled = client.cancel(waiting.id)
    assert cancelled.state == "CANCELLED"
    assert client.cancel(waiting.id).state == "CANCELLED"  # idempotent
    client.cancel(blocker.id)
    assert wait_for(client, blocker.id).state == "CANCELLED"
    done = client.submit(spec("true"))
    wait_for(client, done.id, "SUCCEEDED")
    with pytest.raises(Conflict):
        client.cancel(done.id)


def test_bad_input_is_refused_and_nothing_is_written(shared_server):
    client = shared_server.client()
    before = len(client.list_jobs(limit=500))
    with pytest.raises(InvalidInput) as err:
        client.request("POST", "/jobs", json_body={"spec": {"command": "true", "resorces": {}}})
    assert "resorces" in err.value.message
    with pytest.raises(InvalidInput) as err:
        client.request("POST", "/jobs", json_body={"spec": {"command": "true", "resources": {"cpus": 10_000}}})
    assert "cpus" in err.value.message
    with pytest.raises(InvalidInput) as err:
        client.request("POST", "/jobs", json_body={"spec": {"command": "true", "runtime": {"framework": "cobol"}}})
    assert "cobol" in err.value.message
    with pytest.raises(InvalidInput) as err:
        client.request("POST", "/jobs", json_body={"spec": {"command": "true", "runtime": {"image": "x/y:1"}}})
    assert "runtime.image" in err.value.message
    with pytest.raises(InvalidInput) as err:
        client.request("POST", "/jobs", json_body={"spec": {"command": "true", "runtime": {"python": "/no/python"}}})
    assert "/no/python" in err.value.message
    with pytest.raises(InvalidInput) as err:
        client.request("POST", "/jobs", json_body={"spec": {"command": "true"}, "code_sha256": "a" * 64})
    assert "code_sha256" in err.value.message
    with pytest.raises(InvalidInput) as err:  # Kiln's own mark of a notebook's job (it changes how it renders)
        client.request("POST", "/jobs", json_body={"spec": {"command": "true", "labels": {"kiln-notebook": "nb-x"}}})
    assert "kiln-notebook" in err.value.message
    assert len(client.list_jobs(limit=500)) == before
    with pytest.raises(NotFound):
        client.get_job("job-doesnotexist")
    with pytest.raises(NotFound):
        client.events("job-doesnotexist")

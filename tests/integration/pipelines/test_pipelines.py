"""Pipelines on a real server with real jobs: steps in dependency order with an upstream step's outputs staged
for the next, ``when`` over upstream metrics, the cache (a second run starts no job; a changed step re-runs with
the steps after it only), retries, fail-fast with an independent branch finishing, resume, cancel, a server killed
mid-run (no step runs twice), bad input refused naming the field, and another organisation seeing none of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kiln.errors import Conflict, InvalidInput, NotFound
from kiln.sdk.client import Client
from kiln.sdk.packaging import DEFAULT_MAX_CODE_BYTES, build_bundle
from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Api, create_tenant

PY = {"runtime": {"python": sys.executable}}

PREP = """
import os, pathlib
out = pathlib.Path(os.environ["KILN_OUTPUT_DIR"])
(out / "rows.txt").write_text("1200\\n")
print("prep wrote rows")
"""

TRAIN = """
import os, pathlib, kiln
rows = int((pathlib.Path(os.environ["KILN_INPUT_PREP"]) / "rows.txt").read_text())
kiln.log({"val_acc": 0.97 if rows == 1200 else 0.1}, step=1)
kiln.flush()
(pathlib.Path(os.environ["KILN_OUTPUT_DIR"]) / "model.txt").write_text(f"trained on {rows}\\n")
print("train read", rows)
"""

# Fails until its job is the step's third (a label the pipeline sets), read through the job's own token.
FLAKY = """
import json, os, sys, urllib.request
request = urllib.request.Request(
    os.environ["KILN_ENDPOINT"] + "/api/v1/jobs/" + os.environ["KILN_JOB_ID"],
    headers={"Authorization": "Bearer " + os.environ["KILN_JOB_TOKEN"]},
)
try_number = int(json.load(urllib.request.urlopen(request))["spec"]["labels"]["pipeline-try"])
print("try", try_number)
sys.exit(0 if try_number >= int(sys.argv[1]) else 3)
"""


def job(code: str, *args: str, **extra: Any) -> dict[str, Any]:
    return {"command": [sys.executable, "-c", code, *args], **PY, **extra}


def flow(train_extra: str = "") -> dict[str, Any]:
    return {
        "name": "digits-flow",
        "steps": {
            "prep": job(PREP),
            "train": {**job(TRAIN + train_extra), "depends_on": ["prep"], "inputs": [{"step": "prep"}]},
            "report": {**job("print('report')"), "depends_on": ["train"]},
            "gated": {
                **job("print('good enough')"),
                "depends_on": ["train"],
                "when": "steps.train.metrics.val_acc >= 0.95 and steps.train.params.lr == 0.1",
            },
            "never": {**job("print('never')"), "depends_on": ["train"], "when": "steps.train.metrics.val_acc < 0.5"},
        },
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    kiln = KilnServer(tmp_path_factory.mktemp("pipelines") / "home", rate_limit_per_second="0").start()
    try:
        yield kiln
    finally:
        kiln.stop()


def _states(run: Any) -> dict[str, str]:
    return {step.name: step.state for step in run.steps}


def _jobs(client: Client) -> int:
    return len(client.list_jobs(limit=500))


def test_a_pipeline_runs_its_steps_passes_outputs_gates_and_caches(server: KilnServer) -> None:
    client = server.client()
    spec = flow()
    spec["steps"]["train"]["params"] = {"lr": 0.1}
    run = client.run_pipeline(spec)
    assert run.state == "RUNNING" and [s.name for s in run.steps] == ["prep", "train", "report", "gated", "never"]
    done = client.wait_pipeline(run.id, timeout=180)
    assert done.state == "SUCCEEDED", done
    states = _states(done)
    assert states == {
        "prep": "SUCCEEDED",
        "train": "SUCCEEDED",
        "report": "SUCCEEDED",
        "gated": "SUCCEEDED",
        "never": "SKIPPED",
    }, done
    never = next(s for s in done.steps if s.name == "never")
    assert "when is false" in never.message and never.job_id is None
    train = next(s for s in done.steps if s.name == "train")
    assert [ln.text for ln in client.stream_logs(train.job_id, follow=False) if ln.source != "kiln"] == [
        "train read 1200"
    ]  # prep's outputs, staged at $KILN_INPUT_PREP
    assert client.get_job(train.job_id).spec.labels["pipeline-step"] == "train"

    jobs_before = _jobs(client)
    again = client.wait_pipeline(client.run_pipeline(spec).id, timeout=60)
    assert again.state == "SUCCEEDED"
    assert {s.name: (s.state, s.cached) for s in again.steps if s.state != "SKIPPED"} == {
        name: ("CACHED", True) for name in ("prep", "train", "report", "gated")
    }
    assert {s.name: s.job_id for s in again.steps} == {s.name: s.job_id for s in done.steps}  # the earlier jobs
    assert _jobs(client) == jobs_before  # no job started

    changed = client.wait_pipeline(client.run_pipeline(flow("print('v2')")).id, timeout=180)
    by_name = {s.name: s for s in changed.steps}
    assert by_name["prep"].state == "CACHED"  # unchanged, upstream of the change
    assert by_name["train"].state == "SUCCEEDED" and not by_name["train"].cached  # changed: runs again
    assert by_name["report"].state == "SUCCEEDED" and not by_name["report"].cached  # after it: runs again
    assert by_name["gated"].state == "SKIPPED"  # no lr param this time: the when is false

    no_cache = client.run_pipeline(spec, use_cache=False)
    assert client.wait_pipeline(no_cache.id, timeout=180).state == "SUCCEEDED"
    assert not any(s.cached for s in client.get_pipeline_run(no_cache.id).steps)


def test_retries_fail_fast_resume_and_cancel(server: KilnServer) -> None:
    client = server.client()
    spec = {
        "name": "flaky",
        "steps": {
            "flaky": {**job(FLAKY, "3"), "retries": 2, "retry_backoff": 0.5, "cache": False},
            "broken": {**job(FLAKY, "2"), "cache": False},  # fails its first job, succeeds on a resume
            "after": {**job("print('after')"), "depends_on": ["broken"]},
            "last": {**job("print('last')"), "depends_on": ["after"]},
        },
    }
    run = client.wait_pipeline(client.run_pipeline(spec).id, timeout=180)
    by_name = {s.name: s for s in run.steps}
    assert run.state == "FAILED" and "broken" in run.message
    assert (by_name["flaky"].state, by_name["flaky"].tries) == ("SUCCEEDED", 3)  # failed twice, then succeeded
    assert by_name["broken"].state == "FAILED" and "FAILED" in by_name["broken"].message
    assert by_name["after"].state == "SKIPPED" and "upstream step broken failed" in by_name["after"].message
    assert by_name["last"].state == "SKIPPED"  # and what depends on that
    flaky_job = by_name["flaky"].job_id

    resumed = client.resume_pipeline_run(run.id)
    assert resumed.state == "RUNNING"
    done = client.wait_pipeline(run.id, timeout=180)
    by_name = {s.name: s for s in done.steps}
    assert done.state == "SUCCEEDED", done
    assert by_name["flaky"].job_id == flaky_job  # kept: it succeeded
    assert by_name["broken"].state == "SUCCEEDED" and by_name["after"].state == "SUCCEEDED"
    with pytest.raises(Conflict):
        client.resume_pipeline_run(run.id)  # nothing to resume

    slow = client.run_pipeline(
        {
            "name": "slow",
            "steps": {
                "sleep": job("import time; time.sleep(60)"),
                "next": {**job("print(1)"), "depends_on": ["sleep"]},
            },
        }
    )
    deadline = time.monotonic() + 30
    while client.get_pipeline_run(slow.id).steps[0].state != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.1)
    cancelled = client.cancel_pipeline_run(slow.id)
    assert cancelled.state == "CANCELLED"
    assert {s.name: s.state for s in cancelled.steps}["next"] == "CANCELLED"
    sleeper = cancelled.steps[0].job_id
    deadline = time.monotonic() + 30
    while client.get_job(sleeper).state != "CANCELLED" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.get_job(sleeper).state == "CANCELLED"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"prep": {"command": "true", "depends_on": ["report"]}}, "spec.steps.prep.depends_on"),
        ({"train": {"command": "true", "inputs": [{"step": "ghost"}]}}, "spec.steps.train.inputs[0].step"),
        ({"gated": {"command": "true", "depends_on": ["train"], "when": "val_acc > 1"}}, "spec.steps.gated.when"),
        ({"report": {"command": "true", "resources": {"cpus": 10_000}}}, "spec.steps.report"),
        ({"report": {"command": "true", "inputs": [{"dataset": "nope"}]}}, "spec.steps.report.inputs[0].dataset"),
    ],
)
def test_bad_pipelines_are_refused_before_anything_runs(
    server: KilnServer, change: dict, field: str, tmp_path: Path
) -> None:
    client = server.client()
    spec = flow()
    spec["steps"].update(change)
    code = tmp_path / "code"  # code of its own (a new bundle): a refused pipeline uploads none of it
    code.mkdir()
    (code / "main.py").write_text(f"print({field!r})\n")
    bundle = build_bundle(code, DEFAULT_MAX_CODE_BYTES)
    bundle.path.unlink()
    before = (len(client.list_pipeline_runs(limit=200)), _jobs(client))
    with pytest.raises(InvalidInput) as caught:
        client.run_pipeline(spec, code)
    assert str((caught.value.details or {}).get("field", "")).startswith(field), caught.value
    assert (len(client.list_pipeline_runs(limit=200)), _jobs(client)) == before
    assert not client.has_blob(bundle.sha256), "the code was uploaded before the pipeline was checked"


def test_another_organisation_sees_resumes_and_reuses_nothing(server: KilnServer) -> None:
    client = server.client()
    run = client.wait_pipeline(client.run_pipeline({"name": "mine", "steps": {"one": job(PREP)}}).id, timeout=120)
    assert run.state == "SUCCEEDED"
    stranger = create_tenant(Api.admin(server), "pipeline-strangers", ("member",))["member"]
    other = Client(server.url, stranger.key_id, stranger.secret)
    assert other.list_pipeline_runs() == []
    for call in (other.get_pipeline_run, other.resume_pipeline_run, other.cancel_pipeline_run):
        with pytest.raises(NotFound):
            call(run.id)
    theirs = other.wait_pipeline(other.run_pipeline({"name": "mine", "steps": {"one": job(PREP)}}).id, timeout=120)
    assert [(s.state, s.cached) for s in theirs.steps] == [("SUCCEEDED", False)]  # the same step: their own job
    assert theirs.steps[0].job_id != run.steps[0].job_id


def test_a_server_killed_mid_run_runs_no_step_twice(make_server) -> None:  # type: ignore[no-untyped-def]
    server = make_server()
    client = server.client()
    spec = {
        "name": "crash",
        "steps": {
            "a": job("import time; time.sleep(2); print('a')"),
            "b": {**job("print('b')"), "depends_on": ["a"]},
            "c": {**job("print('c')"), "depends_on": ["b"]},
        },
    }
    run = client.run_pipeline(spec)
    deadline = time.monotonic() + 30
    while client.get_pipeline_run(run.id).steps[0].state != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.05)
    server.kill()
    server.start()
    client = server.client()
    done = client.wait_pipeline(run.id, timeout=180)
    assert done.state == "SUCCEEDED", done
    steps = {label: 0 for label in ("a", "b", "c")}
    for item in client.list_jobs(limit=100):
        step = item.spec.labels.get("pipeline-step") if item.spec.labels.get("pipeline-run") == run.id else None
        if step:
            steps[step] += 1
    assert steps == {"a": 1, "b": 1, "c": 1}


@pytest.mark.timeout(600)
def test_the_cli_runs_a_pipeline_file_with_each_steps_own_code(server: KilnServer, tmp_path: Path) -> None:
    """``kiln pipelines run -f pipeline.yaml --follow``: the run id first on stdout; each step's ``code:`` directory
    is its own bundle, so that changing one step's code re-runs that step and the steps after it only."""
    member = create_tenant(Api.admin(server), "pipeline-cli", ("member",))["member"]
    flow_dir = tmp_path / "flow"
    for name, code in (("prep", PREP), ("train", TRAIN), ("report", "print('report')")):
        (flow_dir / name).mkdir(parents=True)
        (flow_dir / name / f"{name}.py").write_text(code)
    steps = {
        "prep": {"command": "python prep.py", "code": "prep", **PY},
        "train": {"command": "python train.py", "code": "train", "depends_on": ["prep"], "inputs": [{"step": "prep"}]},
        "report": {"command": "python report.py", "code": "report", "depends_on": ["train"]},
    }
    steps["train"].update(PY)
    steps["report"].update(PY)
    (flow_dir / "pipeline.yaml").write_text(yaml.safe_dump({"name": "cli-flow", "steps": steps}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env.update(KILN_CONFIG=str(tmp_path / "cfg"), KILN_ENDPOINT=server.url, COLUMNS="200")
    env.update(KILN_ACCESS_KEY=member.key_id, KILN_SECRET_KEY=member.secret)

    def kiln(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "kiln", *args], env=env, capture_output=True, text=True, timeout=300
        )

    def run_flow() -> dict[str, Any]:
        done = kiln("pipelines", "run", "-f", str(flow_dir / "pipeline.yaml"), "--follow", "-o", "json")
        assert done.returncode == 0, done.stderr
        run_id, _, body = done.stdout.partition("\n")
        assert run_id.startswith("prun-"), done.stdout
        shown = json.loads(body)
        assert shown["id"] == run_id and shown["state"] == "SUCCEEDED", shown
        return {step["name"]: step for step in shown["steps"]}

    first = run_flow()
    assert [first[name]["state"] for name in ("prep", "train", "report")] == ["SUCCEEDED"] * 3
    (flow_dir / "train" / "train.py").write_text(TRAIN + "print('a change')\n")
    second = run_flow()
    assert second["prep"]["state"] == "CACHED" and second["prep"]["job_id"] == first["prep"]["job_id"]
    assert second["train"]["state"] == "SUCCEEDED" and second["train"]["job_id"] != first["train"]["job_id"]
    assert second["report"]["state"] == "SUCCEEDED" and second["report"]["job_id"] != first["report"]["job_id"]
    listed = kiln("pipelines", "runs", "cli-flow")
    assert listed.returncode == 0 and listed.stdout.count("cli-flow") == 2, listed.stdout
    pipelines = kiln("pipelines", "list", "-o", "json")
    assert pipelines.returncode == 0, pipelines.stderr
    assert [(p["name"], p["runs"]) for p in json.loads(pipelines.stdout)] == [("cli-flow", 2)]
    scheduled = kiln("pipelines", "schedule", "-f", str(flow_dir / "pipeline.yaml"), "--cron", "0 3 * * *")
    assert scheduled.returncode == 0 and scheduled.stdout.startswith("psch-"), scheduled.stdout + scheduled.stderr
    schedule_id = scheduled.stdout.split()[0]
    shown = kiln("pipelines", "schedules")
    assert schedule_id in shown.stdout and "0 3 * * *" in shown.stdout, shown.stdout
    assert kiln("pipelines", "unschedule", schedule_id).returncode == 0
    assert schedule_id not in kiln("pipelines", "schedules").stdout


def test_a_schedule_starts_runs_makes_up_a_missed_time_once_and_stops(server: KilnServer) -> None:
    """Every two seconds: runs start; a schedule whose time passed ten times while nothing ran (its next time
    put ten days back, as a server down that long would find it) starts one run, not ten; another organisation
    sees and removes none of it; a bad cron is refused naming the field."""
    import sqlite3

    from kiln.db.tables import utcnow

    client = server.client()
    spec = {"name": "ticking", "steps": {"tick": {**job("print('tick')"), "cache": False}}}
    with pytest.raises(InvalidInput, match="cron") as caught:
        client.schedule_pipeline(spec, "every day")
    assert (caught.value.details or {}).get("field") == "cron"
    ticking = client.schedule_pipeline(spec, "* * * * * */2")
    deadline = time.monotonic() + 30
    while len(client.list_pipeline_runs(name="ticking")) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(client.list_pipeline_runs(name="ticking")) >= 2
    assert next(s for s in client.list_pipeline_schedules() if s.id == ticking.id).last_run_id is not None

    stranger = create_tenant(Api.admin(server), "schedule-strangers", ("member",))["member"]
    other = Client(server.url, stranger.key_id, stranger.secret)
    assert other.list_pipeline_schedules() == []
    with pytest.raises(NotFound):
        other.unschedule_pipeline(ticking.id)
    client.unschedule_pipeline(ticking.id)
    time.sleep(0.5)  # a pass under way when it went may still have started one
    count = len(client.list_pipeline_runs(name="ticking"))
    time.sleep(3)
    assert len(client.list_pipeline_runs(name="ticking")) == count  # stopped

    nightly = client.schedule_pipeline({**spec, "name": "nightly"}, "0 3 * * *")
    assert nightly.next_at > utcnow()
    with sqlite3.connect(server.home / "kiln.db") as conn:  # the server's own file: it holds it, so no Database
        conn.execute(
            "UPDATE pipeline_schedules SET next_at = datetime(next_at, '-10 days') WHERE id = ?", (nightly.id,)
        )
    deadline = time.monotonic() + 30
    while not client.list_pipeline_runs(name="nightly") and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.5)  # what a second pass would start, if the next time were not after now
    assert len(client.list_pipeline_runs(name="nightly")) == 1
    after = next(s for s in client.list_pipeline_schedules() if s.id == nightly.id)
    assert after.next_at > utcnow() and after.last_run_id == client.list_pipeline_runs(name="nightly")[0].id
    client.unschedule_pipeline(nightly.id)

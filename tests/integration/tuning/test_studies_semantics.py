"""What a tuning study does with its trials, on real servers running real trial jobs: a pruned trial's job is
cancelled within one metric report of the pruner's decision and the next trial takes its place; stopping a study
cancels its trials' jobs; a study outlives a ``kill -9`` of its server without losing or repeating a trial; grid
search runs every point of the grid once; failed trials end a study past ``max_failed_trials``; and the Optuna
storage works on PostgreSQL too.

The trials run ``trial.py`` from a code bundle with the plain interpreter: it prints ``step=N score=X`` lines,
which Kiln extracts as the metric ``score`` (the objective), sleeping between steps like a training loop.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from itertools import product
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kiln.sdk.client import Client
from tests.helpers import log_text
from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Api

PY = sys.executable
TRIAL = """
import sys, time
x, steps, pause = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
for step in range(steps):
    print(f"step={step} score={x}", flush=True)
    time.sleep(pause)
"""
STEP = re.compile(r"^step=(\d+) score=")
ENDED = {"SUCCEEDED", "FAILED", "STOPPED"}


def upload_trial(server: KilnServer, directory: Path) -> str:
    """The code bundle holding ``trial.py``, uploaded to ``server``: its sha256."""
    directory.mkdir(exist_ok=True)
    (directory / "trial.py").write_text(TRIAL)
    with server.client() as client:
        return client.upload_code(directory)


def study(steps: int, pause: float, **extra: Any) -> dict[str, Any]:
    """A study of ``trial.py`` (``steps`` reports, ``pause`` seconds apart) over ``x`` in [0, 1], maximising
    ``score`` (= x at every step); one CPU a trial."""
    spec: dict[str, Any] = {
        "trial": {
            "command": ["python", "trial.py", "{x}", str(steps), str(pause)],
            "runtime": {"python": PY},
            "resources": {"cpus": 1},
        },
        "parameters": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        "objective": {"metric": "score", "direction": "maximize"},
        "algorithm": "random",
        "seed": 11,
    }
    spec.update(extra)
    return spec


def create(api: Api, spec: dict[str, Any], code: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"spec": spec} | ({"code_sha256": code} if code else {})
    return api.ok("POST", "/studies", json_body=body)  # type: ignore[no-any-return]


def wait_study(api: Api, study_id: str, timeout: float = 90) -> dict[str, Any]:
    """The study once it has ended."""
    deadline = time.monotonic() + timeout
    while True:
        found = api.ok("GET", f"/studies/{study_id}")
        if found["state"] in ENDED:
            return found  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, f"study {study_id} still {found['state']} after {timeout}s: {found}"
        time.sleep(0.25)


def trials(api: Api, study_id: str) -> list[dict[str, Any]]:
    return api.ok("GET", f"/studies/{study_id}/trials", params={"order": "number"})["items"]  # type: ignore[no-any-return]


def study_events(api: Api, study_id: str) -> list[dict[str, Any]]:
    return api.ok("GET", f"/studies/{study_id}/events")["items"]  # type: ignore[no-any-return]


def labelled_jobs(api: Api, study_id: str) -> list[dict[str, Any]]:
    """Every job labelled as a trial of the study."""
    items = api.ok("GET", "/jobs", params={"limit": 500})["items"]
    return [j for j in items if j["spec"]["labels"].get("kiln-study") == study_id]


def event_time(api: Api, job_id: str, to_state: str) -> datetime:
    """When the job first moved to ``to_state`` (from its events)."""
    times = [e["time"] for e in api.events(job_id) if e["to_state"] == to_state]
    assert times, (job_id, to_state, api.events(job_id))
    return datetime.fromisoformat(times[0])


def printed_steps(client: Client, job_id: str) -> list[int]:
    """The steps the job printed (its log, which holds every line the job wrote before it was stopped)."""
    return [int(m.group(1)) for line in log_text(client, job_id) if (m := STEP.match(line))]


def check_one_of_each(api: Api, study_id: str, expected: int) -> list[dict[str, Any]]:
    """Exactly ``expected`` trials, numbered 0.., each with its own job labelled with its number, and no other job
    labelled with the study; the trials."""
    found = trials(api, study_id)
    assert [t["number"] for t in found] == list(range(expected)), found
    jobs = labelled_jobs(api, study_id)
    assert sorted(j["spec"]["labels"]["kiln-trial"] for j in jobs) == sorted(str(n) for n in range(expected)), jobs
    assert {j["id"] for j in jobs} == {t["job_id"] for t in found}
    for trial in found:
        job = next(j for j in jobs if j["id"] == trial["job_id"])
        assert job["spec"]["labels"]["kiln-trial"] == str(trial["number"]) and job["spec"]["params"] == trial["params"]
    started = [e["trial"] for e in study_events(api, study_id) if e["reason"] == "TrialStarted"]
    assert sorted(started) == list(range(expected)), started
    return found


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    """Room for exactly two one-CPU trials at once: a trial waits for another's CPUs."""
    server = KilnServer(tmp_path_factory.mktemp("studies") / "home", cpus="2").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def admin(server: KilnServer) -> Iterator[Api]:
    api = Api.admin(server)
    yield api
    api.close()


@pytest.fixture(scope="module")
def code(server: KilnServer, tmp_path_factory: pytest.TempPathFactory) -> str:
    return upload_trial(server, tmp_path_factory.mktemp("trial-code"))


def test_a_pruned_trial_stops_at_once_and_frees_its_cpus_for_the_next(
    server: KilnServer, admin: Api, code: str
) -> None:
    """ASHA (halving at steps 1, 2, 4) over six trials, two asked for at a time, each taking both CPUs: the next
    trial's job waits for a running one's CPUs, so the trials reach each step one after another (two trials racing
    to a step made which one was pruned a matter of timing) and a trial below the median of those before it is
    pruned (a verdict on one other trial's value: ``bootstrap_count`` 1)."""
    pause = 1.0  # between two reports: more than the server takes from a report to the pruned job's cancel
    asha = {"type": "asha", "min_resource": 1, "reduction_factor": 2, "bootstrap_count": 1}
    spec = study(6, pause, early_stopping=asha, max_trials=6, parallelism=2)
    spec["trial"]["resources"] = {"cpus": 2}
    created = create(admin, spec, code)
    done = wait_study(admin, created["id"])
    assert (done["state"], done["reason"]) == ("SUCCEEDED", "Completed"), done
    found = check_one_of_each(admin, created["id"], 6)
    pruned = [t for t in found if t["state"] == "PRUNED"]
    assert pruned, f"no trial was pruned: {found}"
    assert done["trials"]["pruned"] == len(pruned) and done["trials"]["total"] == 6, done

    client = server.client()
    pruned_events = {e["trial"] for e in study_events(admin, created["id"]) if e["reason"] == "TrialPruned"}
    assert pruned_events == {t["number"] for t in pruned}
    starts = {t["number"]: event_time(admin, t["job_id"], "STARTING") for t in found}
    followed = []
    for trial in pruned:
        k = trial["pruned_step"]
        assert isinstance(k, int) and k >= 1, trial  # ASHA's first rung is step 1
        job = admin.job(trial["job_id"])
        assert job["state"] == "CANCELLED", job
        # The job went on for at most one more report after the one the pruner judged.
        steps = printed_steps(client, trial["job_id"])
        assert k in steps and max(steps) <= k + 1, (trial, steps)
        (series,) = [s for s in client.metrics(trial["job_id"], names=["score"]) if s.name == "score"]
        recorded = [p[0] for p in series.points]
        assert k in recorded and max(recorded) <= k + 1, (trial, recorded)
        # Its CPUs went to a trial that started after its job was cancelled.
        cancelled = event_time(admin, trial["job_id"], "CANCELLED")
        followed += [n for n, started in starts.items() if started >= cancelled]
    assert followed, f"no trial started after a pruned trial's job was cancelled: {starts}"
    best = admin.ok("GET", f"/studies/{created['id']}/best")
    succeeded = [t for t in found if t["state"] == "SUCCEEDED"]
    assert best["value"] == max(t["value"] for t in succeeded) == max(t["params"]["x"] for t in succeeded)
    assert all(best["value"] > t["last_value"] for t in pruned), (best, pruned)
    client.close()


OVERTAKER = """
import sys, time
kind = sys.argv[1]
# fast: good at once; poor: worse throughout; slow: behind the fast one until epoch 30, best after; late: the
# poorest, and the last to reach rung 5 (its start waits), where three others are there to judge it by.
wait = {"fast": 0, "poor": 0, "slow": 3, "late": 6}[kind]
time.sleep(wait)
for epoch in range(1, 41):
    score = {"fast": 0.9, "poor": 0.6, "slow": 0.85 if epoch < 30 else 0.95, "late": 0.5}[kind]
    print(f"step={epoch} score={score}", flush=True)
    time.sleep(0.05)
"""


def test_a_slow_starter_that_overtakes_at_epoch_30_is_the_best_trial(
    server: KilnServer, admin: Api, tmp_path: Path
) -> None:
    """Issue 50: ASHA (rungs 5 and 15) stopped the trial that would have ended best, on one other trial's value
    (with fewer than reduction_factor trials at a rung only the best went on). The slow starter reaches each rung
    after the fast one and the poor one, behind the fast one: it is judged by the percentile rule, goes on, and
    overtakes at epoch 30. The last trial to reach rung 5, the poorest, is stopped there, with its reasons."""
    (tmp_path / "trial.py").write_text(OVERTAKER)
    with server.client() as client:
        code = client.upload_code(tmp_path)
    asha = {"type": "asha", "min_resource": 5, "reduction_factor": 3}
    spec = study(0, 0, algorithm="grid", early_stopping=asha, max_trials=4, parallelism=4)
    spec["parameters"] = {"kind": {"type": "categorical", "choices": ["fast", "poor", "slow", "late"]}}
    spec["trial"]["command"] = ["python", "trial.py", "{kind}"]
    spec["trial"]["resources"] = {"cpus": 0.5}
    created = create(admin, spec, code)
    done = wait_study(admin, created["id"], timeout=120)
    assert (done["state"], done["reason"]) == ("SUCCEEDED", "Completed"), done
    found = {t["params"]["kind"]: t for t in trials(admin, created["id"])}
    best = admin.ok("GET", f"/studies/{created['id']}/best")
    assert (best["params"]["kind"], best["value"]) == ("slow", 0.95), (best, found)
    assert [found[k]["state"] for k in ("fast", "poor", "slow")] == ["SUCCEEDED"] * 3, found
    late = found["late"]
    assert (late["state"], late["pruned_step"]) == ("PRUNED", 5), late
    report = late["pruning"]
    assert (report["rule"], report["rung"], report["step"], report["value"]) == ("asha", 5, 5, 0.5), report
    assert (report["compared"], report["needed"]) == (3, 2), report
    assert report["cutoff"] == pytest.approx(0.85 + (0.9 - 0.85) / 3), report
    assert "below the cutoff 0.866667 of 3 other trials" in late["message"], late
    assert all(found[k]["pruning"] is None for k in ("fast", "poor", "slow")), found


def test_stopping_a_study_cancels_its_running_trials(admin: Api, code: str) -> None:
    created = create(admin, study(300, 0.5, max_trials=4, parallelism=2), code)
    study_id = created["id"]
    deadline = time.monotonic() + 60
    while True:
        running = [t for t in trials(admin, study_id) if t["job_state"] == "RUNNING"]
        if len(running) == 2:
            break
        assert time.monotonic() < deadline, trials(admin, study_id)
        time.sleep(0.2)
    stopped = admin.ok("POST", f"/studies/{study_id}/stop")
    assert (stopped["state"], stopped["reason"]) == ("STOPPED", "Stopped"), stopped
    for trial in running:
        assert admin.wait(trial["job_id"], timeout=30)["state"] == "CANCELLED"
    found = trials(admin, study_id)
    assert [(t["number"], t["state"]) for t in found] == [(0, "CANCELLED"), (1, "CANCELLED")], found
    assert [j["state"] for j in labelled_jobs(admin, study_id)] == ["CANCELLED", "CANCELLED"]
    assert admin.ok("POST", f"/studies/{study_id}/stop")["state"] == "STOPPED"  # idempotent
    events = study_events(admin, study_id)
    assert [(e["from_state"], e["to_state"]) for e in events if e["reason"] == "Stopped"] == [("RUNNING", "STOPPED")]
    assert sorted(e["trial"] for e in events if e["reason"] == "TrialCancelled") == [0, 1], events
    final = admin.ok("GET", f"/studies/{study_id}")
    assert final["state"] == "STOPPED" and final["finished_at"] and final["trials"]["cancelled"] == 2, final


def test_grid_search_runs_every_point_once(admin: Api) -> None:
    spec = study(1, 0, algorithm="grid", max_trials=20, parallelism=2)
    spec["trial"]["command"] = "echo step=0 score={a}; echo {b}"
    spec["parameters"] = {
        "a": {"type": "int", "low": 0, "high": 2},
        "b": {"type": "categorical", "choices": ["u", "v"]},
    }
    created = create(admin, spec, None)
    assert created["planned_trials"] == 6, created
    done = wait_study(admin, created["id"])
    assert (done["state"], done["reason"]) == ("SUCCEEDED", "Completed"), done
    found = check_one_of_each(admin, created["id"], 6)
    points = [(t["params"]["a"], t["params"]["b"]) for t in found]
    assert sorted(points) == sorted(product([0, 1, 2], ["u", "v"])), points
    assert all(t["state"] == "SUCCEEDED" for t in found), found
    assert admin.ok("GET", f"/studies/{created['id']}/best")["value"] == 2.0


def test_failed_trials_past_the_limit_fail_the_study(admin: Api) -> None:
    spec = study(1, 0, max_trials=5, parallelism=1, max_failed_trials=1)
    spec["trial"]["command"] = "echo step=0 score={x}; exit 3"
    created = create(admin, spec, None)
    done = wait_study(admin, created["id"])
    assert (done["state"], done["reason"]) == ("FAILED", "TooManyFailedTrials"), done
    assert "failed" in done["message"].lower() and "1" in done["message"], done["message"]
    found = check_one_of_each(admin, created["id"], 2)  # one at a time: none started after the second failed
    assert [t["state"] for t in found] == ["FAILED", "FAILED"], found
    assert [admin.job(t["job_id"])["exit_code"] for t in found] == [3, 3]
    assert done["trials"]["failed"] == 2
    last = study_events(admin, created["id"])[-1]
    assert (last["reason"], last["to_state"]) == ("TooManyFailedTrials", "FAILED"), last
    assert admin.get(f"/studies/{created['id']}/best").status_code == 404


def test_a_study_survives_kill_9_of_its_server(make_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = make_server(cpus="2")
    code = upload_trial(server, tmp_path / "code")
    admin = Api.admin(server)
    created = create(admin, study(4, 0.5, max_trials=5, parallelism=2), code)
    deadline = time.monotonic() + 60
    while True:  # mid-study: a trial has ended and the next one has started
        counts = admin.ok("GET", f"/studies/{created['id']}")["trials"]
        if counts["total"] >= 3 and counts["running"] >= 1:
            break
        assert time.monotonic() < deadline, counts
        time.sleep(0.1)
    server.kill()
    server.start()
    done = wait_study(admin, created["id"])
    assert (done["state"], done["reason"]) == ("SUCCEEDED", "Completed"), done
    found = check_one_of_each(admin, created["id"], 5)
    failed = [
        (t["number"], admin.job(t["job_id"]), admin.events(t["job_id"])) for t in found if t["state"] != "SUCCEEDED"
    ]
    assert not failed, failed
    assert done["trials"] == {"total": 5, "running": 0, "succeeded": 5, "pruned": 0, "failed": 0, "cancelled": 0}
    admin.close()


def test_a_study_on_postgresql(make_server, postgres_url: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = make_server(postgres_url, cpus="2")
    code = upload_trial(server, tmp_path / "code")
    admin = Api.admin(server)
    median = {"type": "median", "startup_trials": 1}
    created = create(admin, study(3, 0.3, algorithm="tpe", early_stopping=median, max_trials=3, parallelism=1), code)
    done = wait_study(admin, created["id"])
    assert (done["state"], done["reason"]) == ("SUCCEEDED", "Completed"), done
    found = check_one_of_each(admin, created["id"], 3)
    assert {t["state"] for t in found} <= {"SUCCEEDED", "PRUNED"} and found[0]["state"] == "SUCCEEDED", found
    best = admin.ok("GET", f"/studies/{created['id']}/best")
    assert best["value"] == max(t["value"] for t in found if t["state"] == "SUCCEEDED")
    admin.close()
    # Optuna kept its trials, and every report it judged, in Kiln's PostgreSQL database (its own schema).
    with psycopg.connect(postgres_url.replace("+psycopg", ""), autocommit=True) as conn:
        (trials_kept,) = conn.execute("SELECT count(*) FROM kiln_optuna.trials").fetchone() or (0,)
        (reports,) = conn.execute("SELECT count(*) FROM kiln_optuna.trial_intermediate_values").fetchone() or (0,)
    assert trials_kept == 3 and reports >= 3, (trials_kept, reports)


SDK_TRIAL = """
import sys, time
import kiln
x = float(sys.argv[1])
for epoch in range(1, 13):
    kiln.log({"score": x * (1 - 0.5 ** epoch)}, step=epoch)
    if kiln.should_prune(wait=10):
        print(f"pruned at epoch {epoch}: stopping", flush=True)
        sys.exit(0)
    print(f"epoch {epoch} goes on", flush=True)
    time.sleep(0.02)
"""


def test_a_trial_that_asks_should_prune_trains_no_epoch_past_its_verdict(
    server: KilnServer, admin: Api, tmp_path: Path
) -> None:
    """``kiln.should_prune()`` after each ``kiln.log`` of the objective waits for the pruner's verdict on that
    epoch (issue 26: pruned trials ran 5-39 epochs past it): a pruned trial reports no epoch after the one it was
    pruned at; the others run every epoch."""
    (tmp_path / "trial.py").write_text(SDK_TRIAL)
    with server.client() as client:
        sdk_code = client.upload_code(tmp_path)
    asha = {"type": "asha", "min_resource": 1, "reduction_factor": 3}
    spec = study(0, 0, early_stopping=asha, max_trials=6, parallelism=2)
    spec["trial"]["command"] = ["python", "trial.py", "{x}"]
    spec["trial"]["resources"] = {"cpus": 0.5}
    created = create(admin, spec, sdk_code)
    done = wait_study(admin, created["id"], timeout=120)
    assert done["state"] == "SUCCEEDED", done
    found = trials(admin, created["id"])
    pruned = [t for t in found if t["state"] == "PRUNED"]
    assert pruned, f"no trial was pruned: {found}"
    client = server.client()
    for trial in found:
        (series,) = client.metrics(trial["job_id"], names=["score"])
        steps = [int(p[0]) for p in series.points]
        text = "\n".join(log_text(client, trial["job_id"]))
        if trial["state"] == "PRUNED":
            k = trial["pruned_step"]
            assert steps == list(range(1, k + 1)), (trial, steps)
            # should_prune() answered True at epoch k (the cancel's SIGTERM may end it before it prints so).
            assert f"epoch {k} goes on" not in text, text
        else:
            assert trial["state"] == "SUCCEEDED" and steps == list(range(1, 13)), (trial, steps)
            assert "pruned at" not in text, text


def test_should_prune_outside_a_study_answers_false_and_says_why(server: KilnServer, admin: Api) -> None:
    script = "import kiln; print('verdict', kiln.should_prune(wait=0.5), flush=True)"
    job = admin.submit([PY, "-c", script], runtime={"python": PY}, resources={"cpus": 0.5})
    assert admin.wait(job["id"], "SUCCEEDED", "FAILED", timeout=60)["state"] == "SUCCEEDED"
    with server.client() as client:
        text = "\n".join(log_text(client, job["id"]))
    assert "verdict False" in text and "this job is not a trial of a tuning study" in text, text

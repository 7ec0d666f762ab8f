"""Quotas against real servers and real databases (SQLite and PostgreSQL): atomic admission across two
schedulers, refusal at submit, waiting and starting by itself, usage as members see it, and no head-of-line
blocking across organisations."""

from __future__ import annotations

import sys
import threading
import time
import warnings
from datetime import datetime
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet

from tests.tenancy_helpers import Api, close_all, create_tenant

LIMIT = 3
THREADS = 20
JOBS_PER_THREAD = 2
# Sleep about a second, ending on a shared 0.75 s tick of the wall clock: jobs admitted by both servers end at
# the same instant, so both reconcilers are woken together and race to admit the next ones.
TICK_SLEEP = "python -c 'import time; time.sleep(1.5 - (time.time() + 0.75) % 0.75)'"


def wait_for_file(name: str) -> list[str]:
    """A job command that runs until ``name`` exists in its work dir (the test, root outside the job's sandbox,
    creates it there when the job is to end)."""
    script = f"import os, time\nwhile not os.path.exists({name!r}):\n    time.sleep(0.05)\n"
    return [sys.executable, "-c", script]


def category(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in report["categories"] if c["category"] == name)


def max_overlap(jobs: list[dict[str, Any]]) -> int:
    """Most jobs that held quota (from STARTING to their end) at one instant, from their own timestamps."""
    edges = []
    for job in jobs:
        edges.append((datetime.fromisoformat(job["started_at"]), 1))
        edges.append((datetime.fromisoformat(job["finished_at"]), -1))
    level = peak = 0
    for _, step in sorted(edges):  # at equal times an end (-1) sorts before a start (+1)
        level += step
        peak = max(peak, level)
    return peak


def test_two_schedulers_never_admit_past_the_quota(database_url: str, make_server) -> None:  # type: ignore[no-untyped-def]
    key = Fernet.generate_key().decode()  # both servers must open the same stored secrets
    first = make_server(database_url, cpus="16", server_key=key, reconcile_interval="0.02")
    second = make_server(database_url, cpus="16", server_key=key, reconcile_interval="0.02")
    assert not (second.home / "admin.env").exists()  # one bootstrap for the shared database
    admin = Api.admin(first)
    alpha = create_tenant(admin, "race-alpha", ("member",))
    admin.ok("PUT", f"/orgs/{alpha.id}/quota", json_body={"category": "train", "count": LIMIT})
    member = alpha["member"]
    urls = [first.url, second.url]
    assert Api(second.url, member.key_id, member.secret).ok("GET", "/whoami")["org_id"] == alpha.id

    submitted: list[str] = []
    errors: list[str] = []
    samples: list[int] = []
    over: list[list[str]] = []
    done = threading.Event()

    def sample() -> None:
        watcher = Api.admin(first)
        while not done.is_set():
            items = watcher.ok("GET", "/jobs", params={"state": ["STARTING", "RUNNING"], "limit": 500})["items"]
            active = [j["id"] for j in items if j["org_id"] == alpha.id]
            samples.append(len(active))
            if len(active) > LIMIT:
                over.append(active)
            time.sleep(0.05)
        watcher.close()

    def submit(index: int) -> None:
        api = Api(urls[index % 2], member.key_id, member.secret)
        try:
            for _ in range(JOBS_PER_THREAD):
                submitted.append(api.submit(TICK_SLEEP)["id"])
        except Exception as exc:  # reported below, with every other thread's
            errors.append(f"thread {index}: {exc}")
        finally:
            api.close()

    sampler = threading.Thread(target=sample)
    sampler.start()
    threads = [threading.Thread(target=submit, args=(i,)) for i in range(THREADS)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        assert len(submitted) == THREADS * JOBS_PER_THREAD
        deadline = time.monotonic() + 90
        while True:
            jobs = [j for j in admin.ok("GET", "/jobs", params={"limit": 500})["items"] if j["org_id"] == alpha.id]
            if all(j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") for j in jobs):
                break
            assert time.monotonic() < deadline, [(j["id"], j["state"], j["message"]) for j in jobs]
            time.sleep(0.2)
    finally:
        done.set()
        sampler.join()

    assert not over, f"more than {LIMIT} jobs of the organisation held quota at once: {over}"
    assert max(samples) == LIMIT, f"never saw the limit reached (samples: {sorted(set(samples))})"
    assert sorted(j["id"] for j in jobs) == sorted(submitted)
    # Regression test (found by this suite, since fixed):
    # (src/kiln/backends/local/executor.py, LocalBackend.poll): poll reads exit.json, finds none, and only then asks
    # whether the shim is alive; a shim that writes exit.json and exits between those two steps is reported LOST,
    # and the job ends FAILED "ShimLost: the job's supervisor (shim) died without recording an exit status" although
    # its exit.json says exit code 0. Seen here now and then on a loaded machine (jobs ending together while two
    # reconcilers poll every 20 ms). Expected: SUCCEEDED (re-read exit.json once the shim is found dead, before
    # declaring the attempt lost).
    bad = [j for j in jobs if j["state"] != "SUCCEEDED"]
    assert not bad, [(j["id"], j["state"], j["reason"], j["message"], admin.events(j["id"])) for j in bad]
    assert max_overlap(jobs) <= LIMIT, f"job timestamps show {max_overlap(jobs)} holding quota at once"
    waits = [e["message"] for job_id in submitted for e in admin.events(job_id) if e["reason"] == "Waiting"]
    prefix = f"quota: count {LIMIT} of {LIMIT} in use (org race-alpha"
    assert any(w.startswith(prefix) for w in waits), sorted(set(waits))
    # Was the race real? Both servers admitted and ran jobs (each runs its own under its $KILN_HOME/jobs).
    # On a starved machine one server can take every job (SQLite's lock is not fair): then the limit was
    # checked but not the race, which must not pass unnoticed.
    per_server = [len(list((s.home / "jobs").glob("job-*"))) for s in (first, second)]
    if not all(per_server):
        warnings.warn(f"only one server admitted jobs (per server: {per_server}); no race this run", stacklevel=1)
    close_all(alpha)
    admin.close()


def test_a_job_asking_more_than_the_limit_is_refused_at_submit(make_server) -> None:  # type: ignore[no-untyped-def]
    server = make_server(cpus="8", gpus="0,1,2,3")
    admin = Api.admin(server)
    alpha = create_tenant(admin, "limit-alpha", ("member",))
    admin.ok("PUT", f"/orgs/{alpha.id}/quota", json_body={"category": "train", "gpus": 1, "cpus": 2})
    admin.ok("PUT", f"/orgs/{alpha.id}/quota", json_body={"category": "total", "memory": "1G"})
    member = alpha["member"].api
    cases = [
        ({"gpus": 2}, "quota: the job asks gpus 2 but the limit is 1 (org limit-alpha, category train)"),
        ({"cpus": 3}, "quota: the job asks cpus 3 but the limit is 2 (org limit-alpha, category train)"),
        ({"memory": "2G"}, "quota: the job asks memory 2 GiB but the limit is 1 GiB (org limit-alpha, category total)"),
    ]
    for resources, message in cases:
        response = member.post("/jobs", {"spec": {**_spec("true"), "resources": resources}})
        assert response.status_code == 403, response.text
        assert response.json() == {"code": "forbidden", "message": message}
    assert member.ok("GET", "/jobs")["items"] == []  # nothing was created
    fits = member.post("/jobs", {"spec": {**_spec("true"), "resources": {"gpus": 1, "cpus": 2, "memory": "1G"}}})
    assert fits.status_code == 201, fits.text
    # Unlimited again (null): the same request is accepted.
    admin.ok("PUT", f"/orgs/{alpha.id}/quota", json_body={"category": "train", "gpus": None})
    report = admin.ok("GET", f"/orgs/{alpha.id}/quota")
    assert category(report, "train")["limits"] == {
        "gpus": None,
        "cpus": 2.0,
        "memory": None,
        "count": None,
        "storage": None,
    }
    assert member.post("/jobs", {"spec": {**_spec("true"), "resources": {"gpus": 2}}}).status_code == 201
    close_all(alpha)
    admin.close()


def test_waiting_for_quota_usage_and_other_organisations(database_url: str, make_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = make_server(database_url, cpus="8")
    admin = Api.admin(server)
    alpha = create_tenant(admin, "wait-alpha", ("member",))
    bravo = create_tenant(admin, "wait-bravo", ("member",))
    admin.ok("PUT", f"/orgs/{alpha.id}/quota", json_body={"category": "train", "count": 1})
    member = alpha["member"].api
    holder = member.submit(wait_for_file("release"), resources={"cpus": 1.5})
    release = server.home / "jobs" / holder["id"] / "work" / "release"
    member.wait(holder["id"], "RUNNING")

    # (c) The next job of the organisation waits, and says why.
    waiting = member.submit("echo finally")
    reason = "quota: count 1 of 1 in use (org wait-alpha, category train)"
    job = member.wait_message(waiting["id"], reason)
    assert (job["state"], job["message"]) == ("QUEUED", reason)

    # (d) A member sees the limits and what is in use.
    report = member.ok("GET", "/quota")
    assert (report["org_id"], report["org_name"]) == (alpha.id, "wait-alpha")
    train = category(report, "train")
    assert train["limits"] == {"gpus": None, "cpus": None, "memory": None, "count": 1, "storage": None}
    assert (train["used"]["count"], train["used"]["cpus"], train["used"]["gpus"]) == (1, 1.5, 0)
    total = category(report, "total")
    assert (total["used"]["count"], total["used"]["cpus"]) == (1, 1.5)
    holder_log = server.home / "logs" / f"{holder['id']}.log"  # the running job's log: its only storage
    assert 0 < total["used"]["storage"] <= holder_log.stat().st_size
    assert member.ok("GET", f"/orgs/{alpha.id}/quota") == report
    assert category(bravo["member"].api.ok("GET", "/quota"), "train")["used"]["count"] == 0

    # (e) Another organisation's job, submitted later, is not held up behind the quota-blocked one.
    other = bravo["member"].api.submit("echo other org")
    assert bravo["member"].api.wait(other["id"])["state"] == "SUCCEEDED"
    assert member.job(waiting["id"])["state"] == "QUEUED"

    # (c) When the quota frees, the waiting job starts by itself; its events say why it waited.
    release.touch()
    assert member.wait(holder["id"])["state"] == "SUCCEEDED"
    assert member.wait(waiting["id"])["state"] == "SUCCEEDED"
    events = member.events(waiting["id"])
    kinds = [(e["reason"], e["to_state"]) for e in events]
    waited = [i for i, e in enumerate(events) if e["reason"] == "Waiting" and e["message"] == reason]
    started = [i for i, e in enumerate(events) if e["to_state"] == "STARTING"]
    assert waited and started and waited[0] < started[0], kinds
    assert member.job(waiting["id"])["message"] != reason
    after = category(member.ok("GET", "/quota"), "train")
    assert (after["used"]["count"], after["used"]["cpus"]) == (0, 0.0)
    close_all(alpha, bravo)
    admin.close()


def _spec(command: str) -> dict[str, Any]:
    return {"command": command, "runtime": {"python": sys.executable}}

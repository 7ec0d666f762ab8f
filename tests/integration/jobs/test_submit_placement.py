"""A submit that fits free capacity with nothing ahead of it is placed in its own transaction (issue 45): its
answer says STARTING and it runs without a queue pass. What could make it wait still does: its organisation's
queue, a quota, and other placers over the same capacity (two servers on one PostgreSQL)."""

from __future__ import annotations

import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from sqlalchemy import select

from kiln.db.tables import Job, JobEvent, UsageRecord
from kiln.domain.schemas import JobSubmit
from kiln.platform import Platform
from kiln.settings import Settings
from tests.tenancy_helpers import Api, close_all, create_tenant

ENDLESS = "sleep 600"
ENDS = {"SUCCEEDED", "FAILED", "CANCELLED"}


def max_overlap(jobs: list[dict[str, Any]]) -> int:
    """Most jobs that held capacity (from STARTING to their end) at one instant, from their own timestamps."""
    edges = []
    for job in jobs:
        edges.append((datetime.fromisoformat(job["started_at"]), 1))
        edges.append((datetime.fromisoformat(job["finished_at"]), -1))
    level = peak = 0
    for _, step in sorted(edges):  # at equal times an end (-1) sorts before a start (+1)
        level += step
        peak = max(peak, level)
    return peak


def test_a_submit_that_fits_is_placed_by_the_submit_and_runs_without_a_queue_pass(make_server, database_url):
    # No pass but the server's first for an hour: only the submit can have placed the job.
    server = make_server(database_url, cpus="2", reconcile_interval="3600")
    admin = Api.admin(server)
    try:
        job = admin.submit("echo placed", resources={"cpus": 1})
        assert job["state"] == "STARTING", job
        assert job["allocation"]["cpus"] == 1, job
        done = admin.wait(job["id"], timeout=60)
        assert done["state"] == "SUCCEEDED", done
        scheduled = [e for e in admin.events(job["id"]) if e["to_state"] == "STARTING"]
        assert [e["message"] for e in scheduled] == ["attempt 1 placed on 1 CPU(s)"], scheduled
    finally:
        admin.close()


def test_the_switch_off_leaves_every_submit_to_the_queue(make_server):
    server = make_server(cpus="2", submit_fast_path="false")
    admin = Api.admin(server)
    try:
        job = admin.submit("true", resources={"cpus": 1})
        assert job["state"] == "QUEUED", job
        assert admin.wait(job["id"], timeout=60)["state"] == "SUCCEEDED"
    finally:
        admin.close()


def test_a_submit_behind_its_organisations_queue_goes_to_the_queue(make_server, database_url):
    server = make_server(database_url, cpus="2")
    admin = Api.admin(server)
    team = create_tenant(admin, "fifo", ("member",))
    api = team["member"].api
    try:
        holder = api.submit(ENDLESS, resources={"cpus": 1.5})
        assert holder["state"] == "STARTING", holder
        big = api.submit("true", resources={"cpus": 1})
        assert big["state"] == "QUEUED", big  # does not fit
        small = api.submit("true", resources={"cpus": 0.5})
        assert small["state"] == "QUEUED", small  # fits, but its organisation's queue is ahead of it
        api.ok("POST", f"/jobs/{holder['id']}/cancel")
        assert api.wait(big["id"], timeout=60)["state"] == "SUCCEEDED"
        assert api.wait(small["id"], timeout=60)["state"] == "SUCCEEDED"
    finally:
        close_all(team)
        admin.close()


def test_a_quota_in_use_sends_a_submit_that_fits_to_the_queue(make_server, database_url):
    server = make_server(database_url, cpus="4")
    admin = Api.admin(server)
    team = create_tenant(admin, "quota-fast", ("member",))
    admin.ok("PUT", f"/orgs/{team.id}/quota", json_body={"category": "train", "count": 1})
    api = team["member"].api
    try:
        first = api.submit(ENDLESS, resources={"cpus": 1})
        assert first["state"] == "STARTING", first  # admitted at submit
        second = api.submit("true", resources={"cpus": 1})
        assert second["state"] == "QUEUED", second  # capacity is free; the quota is not
        waiting = api.wait_message(second["id"], "quota:")
        assert waiting["message"].startswith("quota: count 1 of 1 in use (org quota-fast"), waiting
        api.ok("POST", f"/jobs/{first['id']}/cancel")
        assert api.wait(second["id"], timeout=60)["state"] == "SUCCEEDED"
    finally:
        close_all(team)
        admin.close()


def test_two_servers_placing_at_submit_never_place_over_the_same_capacity(make_server, postgres_url):
    key = Fernet.generate_key().decode()
    servers = [make_server(postgres_url, cpus="2", server_key=key) for _ in range(2)]
    admin = Api.admin(servers[0])
    member_apis: list[Api] = []
    answers: list[dict[str, Any]] = []
    errors: list[str] = []
    go = threading.Barrier(8, timeout=30)

    def submit(index: int) -> None:
        api = Api.admin(servers[0], url=servers[index % 2].url)
        member_apis.append(api)
        try:
            go.wait()
            answers.append(api.submit("sleep 1", resources={"cpus": 1}))
        except Exception as exc:  # reported below with the others'
            errors.append(f"submit {index}: {exc}")

    try:
        threads = [threading.Thread(target=submit, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors, errors
        assert sum(a["state"] == "STARTING" for a in answers) <= 2, [a["state"] for a in answers]
        jobs = [admin.wait(a["id"], timeout=120) for a in answers]
        assert all(j["state"] == "SUCCEEDED" for j in jobs), [(j["state"], j["message"]) for j in jobs]
        assert max_overlap(jobs) <= 2, [(j["started_at"], j["finished_at"]) for j in jobs]
    finally:
        for api in member_apis:
            api.close()
        admin.close()


def test_a_placement_that_fails_half_way_leaves_the_job_queued_and_written_once(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The submit places its job before any of its rows are written, and writes them in one flush. A placement
    that raises after it began to change the job (here: as the attempt's launch is made) puts the job back as it
    was: the submit answers it QUEUED, with its one Submitted event, no usage hold and no lease, and the queue
    places it."""
    settings = Settings(home=tmp_path / "home", database_url=database_url, instance_id="server-a", cpus=2)
    platform = Platform(settings)
    try:
        creds = platform.identity.bootstrap()
        assert creds is not None
        principal = platform.identity.authenticate_key(creds.access_key, creds.secret_key)
        assert principal is not None

        def broken(*_: Any, **__: Any) -> Any:
            raise RuntimeError("the launch could not be made")

        monkeypatch.setattr(platform.reconciler, "_launch_of", broken)
        spec = {"command": ["true"], "resources": {"cpus": 1}}
        job = platform.jobs.submit(principal, JobSubmit.model_validate({"spec": spec}))
        assert job.state == "QUEUED" and job.attempt == 0 and job.allocation is None, job
        with platform.db.read() as s:
            row = s.get(Job, job.id)
            assert row is not None and row.state == "QUEUED" and row.lease_owner is None and row.handle is None
            events = [(e.from_state, e.to_state) for e in s.scalars(select(JobEvent).where(JobEvent.job_id == job.id))]
            holds = s.scalars(select(UsageRecord).where(UsageRecord.job_id == job.id)).all()
        assert events == [(None, "QUEUED")] and holds == []
        monkeypatch.undo()
        platform.reconciler.starter.start = lambda *_, **__: None  # type: ignore[method-assign]  # (no process)
        platform.reconciler.run_once()
        with platform.db.read() as s:
            row = s.get(Job, job.id)
            assert row is not None and row.state == "STARTING" and row.attempt == 1
    finally:
        platform.close()

"""``GET /api/v1/runs/metrics``: the same metrics of several runs (a job's run, and a run logged with MLflow's
protocol from outside Kiln) in one request, each series downsampled by the server; who may read which runs; the
SDK's ``compare_run_metrics``. On a real server."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln.errors import NotFound
from kiln.sdk.client import Client
from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Api, Tenant, close_all, create_tenant

JOB_POINTS = 5000
RUN_POINTS = 3000

# Inside a job: its token written to its work dir, then it waits for the test to be done with it.
HOLD_TOKEN = r"""
import os, time
open("token.tmp", "w").write(os.environ["KILN_JOB_TOKEN"])
os.rename("token.tmp", "token")
deadline = time.time() + 120
while not os.path.exists("release") and time.time() < deadline:
    time.sleep(0.05)
"""


def loss(step: int) -> float:
    return 2.0 * math.exp(-step / 1000) + 0.1 * math.sin(step / 37)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    srv = KilnServer(tmp_path_factory.mktemp("run-metrics") / "home", rate_limit_per_second="0").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def tenants(server: KilnServer) -> Iterator[tuple[Tenant, Tenant]]:
    admin = Api.admin(server)
    labs, other = (
        create_tenant(admin, "runs-labs", ("member", "viewer")),
        create_tenant(admin, "runs-other", ("member",)),
    )
    yield labs, other
    close_all(labs, other)
    admin.close()


def sdk(server: KilnServer, tenant: Tenant, role: str) -> Client:
    account = tenant.accounts[role]
    return Client(server.url, account.key_id, account.secret)


def job_with_metrics(api: Api) -> str:
    job = api.submit("true", name="curve")
    api.wait(job["id"], timeout=60)
    lines = "".join(
        json.dumps({"t": 1.7e9 + s, "s": s, "m": {"loss": loss(s), **({"acc": s / JOB_POINTS} if s % 50 == 0 else {})}})
        + "\n"
        for s in range(JOB_POINTS)
    )
    api.ok("POST", f"/jobs/{job['id']}/metrics", content=lines.encode(), content_type="application/x-ndjson")
    return str(job["id"])


def outside_run(client: Client) -> str:
    """A run logged with MLflow's protocol (no job), its loss reversed: it rises."""
    run = client._tracking("POST", "runs/create", body={"experiment_id": "0", "run_name": "laptop"})["run"]
    run_id = str(run["info"]["run_id"])
    now = int(time.time() * 1000)
    for start in range(0, RUN_POINTS, 1000):
        metrics = [
            {"key": "loss", "value": -loss(s), "timestamp": now + s, "step": s}
            for s in range(start, min(RUN_POINTS, start + 1000))
        ]
        client._tracking("POST", "runs/log-batch", body={"run_id": run_id, "metrics": metrics})
    return run_id


def test_runs_metrics_are_downsampled_and_read_only_by_their_organisation(
    server: KilnServer, tenants: tuple[Tenant, Tenant], tmp_path: Path
) -> None:
    labs, other = tenants
    member, viewer, stranger = labs["member"].api, labs["viewer"].api, other["member"].api
    job_run = job_with_metrics(member)
    with sdk(server, labs, "member") as client:
        logged = outside_run(client)
    query = [("run", job_run), ("run", logged), ("name", "loss"), ("downsample", "100")]

    answer = member.ok("GET", "/runs/metrics", params=query)
    assert list(answer["runs"]) == [job_run, logged]  # in the order asked
    for run_id, count, sign in ((job_run, JOB_POINTS, 1), (logged, RUN_POINTS, -1)):
        (series,) = answer["runs"][run_id]
        assert (series["name"], series["count"], series["axis"]) == ("loss", count, "step")
        points = series["points"]
        assert 50 <= len(points) <= 100, len(points)  # downsampled, to at most what was asked
        steps = [p[0] for p in points]
        assert steps == sorted(steps) and steps[0] == 0 and steps[-1] == count - 1  # the first and last kept
        assert points[0][2] == pytest.approx(sign * loss(0)) and points[-1][2] == pytest.approx(sign * loss(count - 1))
        values = [sign * loss(s) for s in range(count)]
        assert min(p[2] for p in points) == pytest.approx(min(values))  # and the extremes
        assert max(p[2] for p in points) == pytest.approx(max(values))

    # Every metric unless named; several names repeat the parameter; a viewer reads them too.
    every = viewer.ok("GET", "/runs/metrics", params=[("run", job_run), ("downsample", "20")])
    assert sorted(s["name"] for s in every["runs"][job_run]) == ["acc", "loss"]
    assert all(len(s["points"]) <= 20 for s in every["runs"][job_run])
    named = viewer.ok("GET", "/runs/metrics", params=[("run", job_run), ("name", "acc"), ("name", "loss")])
    assert {s["name"]: s["count"] for s in named["runs"][job_run]} == {"acc": JOB_POINTS // 50, "loss": JOB_POINTS}
    assert len(next(s for s in named["runs"][job_run] if s["name"] == "acc")["points"]) == JOB_POINTS // 50  # raw

    # Another organisation: each run reads like one that does not exist, and so does the whole request.
    with sdk(server, other, "member") as client:
        own = outside_run(client)
    assert stranger.ok("GET", "/runs/metrics", params=[("run", own), ("name", "loss")])["runs"][own]
    nowhere = stranger.get("/runs/metrics", params=[("run", "run-doesnotexist"), ("name", "loss")])
    assert nowhere.status_code == 404
    for runs in ([job_run], [logged], [own, job_run], [job_run, own]):
        refused = stranger.get("/runs/metrics", params=[*(("run", r) for r in runs), ("name", "loss")])
        assert refused.status_code == 404 and refused.json()["code"] == nowhere.json()["code"], refused.text
        assert job_run not in refused.text.replace(f"run {job_run} not found", "") and "curve" not in refused.text
    mixed = member.get("/runs/metrics", params=[("run", job_run), ("run", own)])
    assert mixed.status_code == 404 and own in mixed.json()["message"]

    # Bounds: at most 50 runs, a downsample of 4 to 20,000.
    too_many = member.get("/runs/metrics", params=[("run", f"run-{i}") for i in range(51)])
    assert too_many.status_code == 422
    assert member.get("/runs/metrics", params=[("run", job_run), ("downsample", "2")]).status_code == 422
    assert member.get("/runs/metrics").status_code == 422  # no run

    # The SDK.
    with sdk(server, labs, "viewer") as client:
        got = client.compare_run_metrics([job_run, logged], "loss", downsample=100)
        assert [len(got[job_run]), got[logged][0].count] == [1, RUN_POINTS]
        assert got[job_run][0].points[-1][0] == JOB_POINTS - 1
        with pytest.raises(NotFound):
            client.compare_run_metrics([job_run, own], ["loss"])

    # A job's token reads its own job's run, no other run of its organisation.
    job = member.submit([sys.executable, "-c", HOLD_TOKEN])
    work = server.home / "jobs" / job["id"] / "work"
    try:
        deadline = time.monotonic() + 60
        while not (work / "token").exists():
            assert time.monotonic() < deadline, "the job never wrote its token"
            time.sleep(0.05)
        bearer = Api(server.url, token=(work / "token").read_text())
        try:
            assert bearer.ok("GET", "/runs/metrics", params=[("run", job["id"])])["runs"] == {job["id"]: []}
            for runs in ([job_run], [logged], [job["id"], job_run]):
                refused = bearer.get("/runs/metrics", params=[("run", r) for r in runs])
                assert refused.status_code == 404, refused.text
        finally:
            bearer.close()
    finally:
        (work / "release").write_text("")
        member.wait(job["id"], timeout=60)

"""GET /api/v1/nodes: each node's CPUs, memory and GPUs and what holds them; another organisation's jobs take
their share without an id or a name."""

from __future__ import annotations

import sys

from tests.tenancy_helpers import Api, close_all, create_tenant, job_spec

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def test_nodes_show_what_holds_them_and_hide_other_organisations_jobs(make_server) -> None:  # type: ignore[no-untyped-def]
    server = make_server(cpus="4")
    admin = Api.admin(server)
    a = create_tenant(admin, "nodes-a", ("member", "viewer"))
    b = create_tenant(admin, "nodes-b", ("member",))
    try:
        job = a["member"].api.ok("POST", "/jobs", json_body={"spec": job_spec(SLEEPER, resources={"cpus": 1.5})})
        a["member"].api.wait(job["id"], "RUNNING")
        (mine,) = a["viewer"].api.ok("GET", "/nodes")["items"]
        assert mine["cpus"] == 4 and mine["memory"] > 0
        assert mine["allocated_cpus"] == 1.5
        assert [(j["id"], j["name"], j["other_org"], j["cpus"]) for j in mine["jobs"]] == [
            (job["id"], job["name"], False, 1.5)
        ]
        (theirs,) = b["member"].api.ok("GET", "/nodes")["items"]
        assert theirs["allocated_cpus"] == 1.5
        assert [(j["id"], j["name"], j["other_org"]) for j in theirs["jobs"]] == [(None, None, True)]
        assert job["id"] not in str(theirs) and job["name"] not in str(theirs)
        a["member"].api.ok("POST", f"/jobs/{job['id']}/cancel")
    finally:
        close_all(a, b)

"""GET /api/v1/nodes: each node's CPUs, memory and GPUs and what holds them; another organisation's jobs count
in the totals only."""

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
        # Another organisation's job counts in the totals only: no row of its own, so neither its id and name nor
        # its (or its organisation's) CPUs and memory.
        assert (theirs["allocated_cpus"], theirs["allocated_memory"]) == (1.5, mine["allocated_memory"])
        assert theirs["jobs"] == []
        assert job["id"] not in str(theirs) and job["name"] not in str(theirs)
        (everything,) = admin.ok("GET", "/nodes")["items"]  # the platform admin sees every job
        assert [j["id"] for j in everything["jobs"]] == [job["id"]]
        a["member"].api.ok("POST", f"/jobs/{job['id']}/cancel")
    finally:
        close_all(a, b)

"""Sparse files count what they cost (issue 43): a job writes files of 95 MiB holding one byte each. Allocated,
they are a few KiB; copied into the store (whose local directory gets the holes as zeros, and S3 keeps no holes)
they are their whole length. So the job's disk limit and its organisation's storage quota count their apparent
size, and the store never takes outputs past either."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Api, close_all, create_tenant

MiB = 2**20


def sparse_outputs(count: int, mib: int) -> list[str]:
    """A job command: ``count`` sparse files of ``mib`` MiB in $KILN_OUTPUT_DIR, one byte written to each, then
    exit 0 at once (before the shim's next periodic disk check)."""
    script = (
        "import os\n"
        f"for i in range({count}):\n"
        "    with open(os.path.join(os.environ['KILN_OUTPUT_DIR'], f'sparse-{i}.bin'), 'wb') as f:\n"
        f"        f.write(b'1'); f.truncate({mib} * 2**20)\n"
    )
    return [sys.executable, "-c", script]


def stored_outputs(server: KilnServer, org_id: str, job_id: str) -> list[Path]:
    """The files the store (a local directory) holds of the job's outputs."""
    root = server.home / "store" / "orgs" / org_id / "jobs" / job_id / "outputs"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def storage(api: Api, org_id: str) -> dict[str, Any]:
    report = api.ok("GET", f"/orgs/{org_id}/quota")
    total = next(c for c in report["categories"] if c["category"] == "total")
    return {"used": total["used"]["storage"], "limit": total["limits"]["storage"]}


def test_sparse_files_past_the_disk_limit_fail_the_job_and_are_not_stored(make_server) -> None:  # type: ignore[no-untyped-def]
    server = make_server()
    admin = Api.admin(server)
    team = create_tenant(admin, "sparse-disk", ("member",))
    try:
        job = team["member"].api.submit(sparse_outputs(20, 95), resources={"disk": "100M"})
        done = team["member"].api.wait(job["id"], timeout=60)
        assert (done["state"], done["reason"]) == ("FAILED", "DiskLimitExceeded"), done["message"]
        assert done["message"].startswith("disk limit exceeded: 1.9 GiB"), done["message"]
        # Nor does the store take them: outputs past the job's disk limit are refused whole.
        assert stored_outputs(server, team.id, job["id"]) == []
        assert "outputs not kept: they hold 1.9 GiB, more than the job's disk limit of 100 MiB" in done["message"]
    finally:
        close_all(team)
        admin.close()


def test_sparse_outputs_never_take_the_organisation_past_its_storage_quota(database_url: str, make_server) -> None:  # type: ignore[no-untyped-def]
    server = make_server(database_url)
    admin = Api.admin(server)
    team = create_tenant(admin, "sparse-quota", ("member",))
    member = team["member"].api
    try:
        admin.ok("PUT", f"/orgs/{team.id}/quota", json_body={"category": "total", "storage": "50M"})
        # Within the quota: kept, and counted at the size the store holds (their apparent size).
        kept = member.wait(member.submit(sparse_outputs(2, 10), resources={"disk": "1G"})["id"], timeout=60)
        assert (kept["state"], kept["message"]) == ("SUCCEEDED", "exit code 0; 2 output file(s) kept")
        files = stored_outputs(server, team.id, kept["id"])
        assert [p.stat().st_size for p in files] == [10 * MiB, 10 * MiB]
        before = storage(admin, team.id)
        assert sum(p.stat().st_size for p in files) <= before["used"] <= before["limit"]

        # 3 x 30 MiB more would pass the 50 MiB quota: refused whole, before the store took any of it.
        job = member.submit(sparse_outputs(3, 30), resources={"disk": "1G"})
        done = member.wait(job["id"], timeout=60)
        assert stored_outputs(server, team.id, job["id"]) == []
        after = storage(admin, team.id)
        assert after["used"] <= after["limit"] and after["used"] - before["used"] < MiB, (before, after)
        why = r"outputs not kept: storage quota of org sparse-quota: [\d.]+ [KM]iB in use \+ 90 MiB of outputs "
        assert re.search(why + r"would exceed the limit of 50 MiB", done["message"]), done["message"]
        ended = member.events(job["id"])[-1]
        assert "storage quota of org sparse-quota" in ended["message"] and "90 MiB of outputs" in ended["message"]
    finally:
        close_all(team)
        admin.close()

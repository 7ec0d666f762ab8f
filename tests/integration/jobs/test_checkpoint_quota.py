"""Checkpoints count in their organisation's storage quota (issue 43): a running job's checkpoints, synced to the
store while it runs and when its attempt ends, counted nothing, so an organisation's jobs piled them up past its
quota. What the store holds of a job's checkpoints now counts (a checkpoint written again under its name once, at
its latest size), checked and reserved before a sync writes: past the quota the job's new checkpoints are not
kept, it runs on, and one event says why with the numbers."""

from __future__ import annotations

import re
import sys
import time
from typing import Any

from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Api, close_all, create_tenant

MiB = 2**20

# Sparse checkpoints (a byte written, the rest a hole): they count, and the store holds, their apparent size.
# Each step waits for the test's go-ahead, so the sync sees each state of the checkpoint dir.
SCRIPT = r"""
import os, pathlib, sys, time
ck = pathlib.Path(os.environ["KILN_CHECKPOINT_DIR"])

def checkpoint(name, mib):
    tmp = ck / (name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(b"1"); f.truncate(mib * 2**20)
    os.rename(tmp, ck / name)

def wait(step):
    while not pathlib.Path("step-" + step).exists():  # in its work dir, where the test writes it
        time.sleep(0.05)

checkpoint("latest.pt", 10)
wait("1")
checkpoint("latest.pt", 12)   # the same name again: replaces its older copy in the store
wait("2")
checkpoint("big.pt", 45)      # 12 + 45 MiB would pass the 50 MiB quota
wait("3")
"""


def stored(server: KilnServer, org_id: str, job_id: str) -> dict[str, int]:
    root = server.home / "store" / "orgs" / org_id / "jobs" / job_id / "checkpoints"
    files = root.rglob("*") if root.exists() else []
    return {p.name: p.stat().st_size for p in files if p.is_file() and not p.name.startswith(".upload-")}


def storage(api: Api, org_id: str) -> dict[str, Any]:
    report = api.ok("GET", f"/orgs/{org_id}/quota")
    total = next(c for c in report["categories"] if c["category"] == "total")
    return {"used": total["used"]["storage"], "limit": total["limits"]["storage"], **report["storage"]}


def until(what: str, check: Any, timeout: float = 15) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return found


def test_checkpoints_count_in_the_quota_and_never_take_the_organisation_past_it(
    database_url: str,
    make_server,  # type: ignore[no-untyped-def]
) -> None:
    server = make_server(database_url, checkpoint_sync_seconds="0.3")
    admin = Api.admin(server)
    team = create_tenant(admin, "ckpt-quota", ("member",))
    member = team["member"].api
    try:
        admin.ok("PUT", f"/orgs/{team.id}/quota", json_body={"category": "total", "storage": "50M"})
        job = member.submit(
            [sys.executable, "-c", SCRIPT],
            runtime={"python": sys.executable},
            resources={"disk": "1G"},
        )
        org, job_id = team.id, job["id"]
        work = server.home / "jobs" / job_id / "work"

        # Synced while the job runs, and counted: in storage_used and as the report's checkpoints.
        until(
            "the first checkpoint never reached the store",
            lambda: stored(server, org, job_id) == {"latest.pt": 10 * MiB},
        )
        first = until("the checkpoint was never counted", lambda: (u := storage(admin, org))["checkpoints"] and u)
        assert first["checkpoints"] == 10 * MiB and first["used"] >= 10 * MiB, first
        (work / "step-1").touch()

        # Written again under its name: the store holds it once, and it counts once, at its latest size.
        until(
            "the rewritten checkpoint never reached the store",
            lambda: stored(server, org, job_id) == {"latest.pt": 12 * MiB},
        )
        again = until(
            "the rewrite was never counted", lambda: (u := storage(admin, org))["checkpoints"] == 12 * MiB and u
        )
        assert again["used"] - first["used"] == 2 * MiB, (first, again)
        (work / "step-2").touch()

        # 45 MiB more would pass the quota: not kept, one event naming the quota, the use and the size.
        why = r"checkpoints not kept: storage quota of org ckpt-quota: [\d.]+ (B|KiB|MiB) in use \+ 57 MiB of "
        why += r"checkpoints would exceed the limit of 50 MiB; the job runs on"

        def refused() -> list[dict[str, Any]]:
            return [e for e in member.events(job_id) if e["reason"] == "StorageQuotaExceeded"]

        event = until("no event said the checkpoints were not kept", refused)[0]
        assert re.fullmatch(why, event["message"]), event["message"]
        assert member.job(job_id)["state"] == "RUNNING"  # the job is not killed
        (work / "step-3").touch()
        done = member.wait(job_id, timeout=30)
        assert done["state"] == "SUCCEEDED", done["message"]

        # Nor did the end of the attempt's sync keep it; once said, not said again.
        assert stored(server, org, job_id) == {"latest.pt": 12 * MiB}
        assert len(refused()) == 1
        after = storage(admin, org)
        assert after["checkpoints"] == 12 * MiB and after["used"] <= after["limit"], after
        kinds = ("code", "outputs", "logs", "checkpoints", "tensorboard", "datasets", "homes", "artifacts")
        assert sum(after[k] for k in kinds) == after["used"], after
    finally:
        close_all(team)
        admin.close()

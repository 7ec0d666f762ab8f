"""A running job calls back with its own token ($KILN_JOB_TOKEN, ``Authorization: Bearer``): its own job, log
and artifacts only, and only while that attempt runs."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from tests.tenancy_helpers import Api, close_all, create_tenant

# Runs inside the job: every call with the job's token, the answers written to $OUT_FILE, then it waits for
# $RELEASE_FILE so that the test can use the token while the job still runs.
JOB_SCRIPT = r"""
import json, os, time, urllib.error, urllib.request

endpoint, token, me = os.environ["KILN_ENDPOINT"], os.environ["KILN_JOB_TOKEN"], os.environ["KILN_JOB_ID"]
other, foreign = os.environ["OTHER_JOB"], os.environ["FOREIGN_JOB"]
JSON = {"Content-Type": "application/json"}


def call(method, path, body=None, headers=None):
    request = urllib.request.Request(
        endpoint + "/api/v1" + path, data=body, method=method,
        headers={"Authorization": "Bearer " + token, **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return [response.status, response.read().decode()]
    except urllib.error.HTTPError as error:
        return [error.code, error.read().decode()]


results = {
    "own": call("GET", f"/jobs/{me}"),
    "own_events": call("GET", f"/jobs/{me}/events"),
    "log": call("POST", f"/jobs/{me}/logs", b"a line sent with the job token\n"),
    "artifact": call("PUT", f"/jobs/{me}/artifacts/x.txt", b"uploaded with the job token\n"),
    "artifacts": call("GET", f"/jobs/{me}/artifacts"),
    "whoami": call("GET", "/whoami"),
    "list": call("GET", "/jobs"),
    "other": call("GET", f"/jobs/{other}"),
    "other_log": call("POST", f"/jobs/{other}/logs", b"not mine\n"),
    "other_artifact": call("PUT", f"/jobs/{other}/artifacts/y.txt", b"not mine\n"),
    "other_artifacts": call("GET", f"/jobs/{other}/artifacts"),
    "foreign": call("GET", f"/jobs/{foreign}"),
    "submit": call("POST", "/jobs", json.dumps({"spec": {"command": "echo escaped"}}).encode(), JSON),
    "key": call("POST", "/keys", b"{}", JSON),
    "cancel_self": call("POST", f"/jobs/{me}/cancel"),
    "orgs": call("GET", "/orgs"),
    "quota": call("GET", "/quota"),
    "audit": call("GET", "/audit"),
}
out = os.environ["OUT_FILE"]
with open(out + ".tmp", "w") as fh:
    json.dump({"token": token, "results": results}, fh)
os.rename(out + ".tmp", out)
deadline = time.time() + 60
while not os.path.exists(os.environ["RELEASE_FILE"]) and time.time() < deadline:
    time.sleep(0.05)
"""


def wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def tamper(token: str) -> str:
    return token[:-1] + ("0" if token[-1] != "0" else "1")


def test_a_running_job_uses_its_own_token_and_nothing_else(make_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = make_server(cpus="8")
    admin = Api.admin(server)
    alpha = create_tenant(admin, "token-alpha", ("member",))
    bravo = create_tenant(admin, "token-bravo", ("member",))
    member = alpha["member"].api
    other = member.submit("echo the other job of the same org")
    foreign = bravo["member"].api.submit("echo another org's job")
    member.wait(other["id"])
    # Both files in the job's own work dir: a sandboxed job sees nothing of the test's.
    env = {
        "OTHER_JOB": other["id"],
        "FOREIGN_JOB": foreign["id"],
        "OUT_FILE": "results.json",
        "RELEASE_FILE": "release",
    }
    job = member.submit([sys.executable, "-c", JOB_SCRIPT], env=env)
    work = server.home / "jobs" / job["id"] / "work"
    out, release = work / "results.json", work / "release"
    try:
        wait_for(out)
        data = json.loads(out.read_text())
        token: str = data["token"]
        results: dict[str, list[Any]] = data["results"]
        status = {name: answer[0] for name, answer in results.items()}
        body = {name: answer[1] for name, answer in results.items()}

        # Its own job, events, log and artifacts.
        assert status["own"] == 200 and json.loads(body["own"])["id"] == job["id"], results["own"]
        assert status["own_events"] == 200, results["own_events"]
        assert (status["log"], json.loads(body["log"])) == (200, {"lines": 1}), results["log"]
        assert status["artifact"] == 201, results["artifact"]
        assert json.loads(body["artifact"]) == {"path": "x.txt", "size": len(b"uploaded with the job token\n")}
        assert status["artifacts"] == 200 and "x.txt" in body["artifacts"], results["artifacts"]
        whoami = json.loads(body["whoami"])
        assert (whoami["job_id"], whoami["org_id"], whoami["user_id"]) == (job["id"], alpha.id, job["user_id"])
        assert [j["id"] for j in json.loads(body["list"])["items"]] == [job["id"]], results["list"]

        # Nothing else: other jobs (same organisation or not) do not exist for it; other actions are refused.
        for name in ("other", "other_log", "other_artifact", "other_artifacts", "foreign"):
            assert status[name] == 404, (name, results[name])
            assert json.loads(body[name])["code"] == "not_found"
        assert "the other job of the same org" not in json.dumps(results)
        for name in ("submit", "key", "cancel_self", "orgs", "quota", "audit"):
            assert status[name] in (403, 404), (name, results[name])
        assert [j["id"] for j in member.ok("GET", "/jobs")["items"]] == [job["id"], other["id"]]  # none submitted
        assert [k["user_id"] for k in member.ok("GET", "/keys")["items"]] == [alpha["member"].user_id]

        # While the job runs, the token works from outside too; a tampered or forged one does not.
        bearer = Api(server.url, token=token)
        assert bearer.get(f"/jobs/{job['id']}").status_code == 200
        tampered = Api(server.url, token=tamper(token)).get(f"/jobs/{job['id']}")
        assert tampered.status_code == 401 and tampered.json()["details"]["reason"] == "signature", tampered.text
        forged = Api(server.url, token=token.replace(job["id"], other["id"])).get(f"/jobs/{other['id']}")
        assert forged.status_code == 401, forged.text
        garbage = Api(server.url, token="kjt.not-a-token").get("/whoami")
        assert garbage.status_code == 401 and garbage.json()["details"]["reason"] == "malformed", garbage.text
        assert member.wait(job["id"], "RUNNING")["state"] == "RUNNING"
    finally:
        release.touch()
    assert member.wait(job["id"])["state"] == "SUCCEEDED"

    # The log line and the artifact stay with the job.
    assert "a line sent with the job token" in member.get(f"/jobs/{job['id']}/logs").text
    artifacts = member.ok("GET", f"/jobs/{job['id']}/artifacts")["items"]
    assert {"path": "x.txt", "size": len(b"uploaded with the job token\n")} in artifacts
    assert member.get(f"/jobs/{job['id']}/artifacts/x.txt").content == b"uploaded with the job token\n"
    assert member.ok("GET", f"/jobs/{other['id']}/artifacts")["items"] == []

    # After the attempt ended, the same token is refused.
    ended = bearer.get(f"/jobs/{job['id']}")
    assert ended.status_code == 401, ended.text
    assert ended.json()["details"]["reason"] == "stale"
    assert bearer.request("POST", f"/jobs/{job['id']}/logs", content=b"too late\n").status_code == 401
    assert "too late" not in member.get(f"/jobs/{job['id']}/logs").text

    # The token's writes and its refusals are in the audit trail, as the job (its owner, its organisation).
    key = f"job:{job['id']}"

    def done(records: list[dict[str, Any]]) -> bool:
        mine = [r for r in records if r["key_id"] == key]
        stale = [r for r in mine if r["detail"] == "stale"]
        return {"success", "denied", "unauthenticated"} <= {r["outcome"] for r in mine} and len(stale) == 2

    records = [r for r in admin.audit_until(done) if r["key_id"] == key]
    by_outcome = {o: [r for r in records if r["outcome"] == o] for o in ("success", "denied", "unauthenticated")}
    assert {r["action"] for r in by_outcome["success"]} >= {"append_logs", "put_artifact"}, records
    verified = [r for r in records if r["detail"] != "signature"]  # a bad MAC proves nothing about whose it is
    assert all(r["org_id"] == alpha.id and r["user_id"] == job["user_id"] for r in verified), records
    assert [r["detail"] for r in by_outcome["unauthenticated"] if r["org_id"] == alpha.id] == ["stale"] * 2, records
    assert any(r["detail"] == "signature" for r in by_outcome["unauthenticated"]), records
    assert "submit_job" in {r["action"] for r in by_outcome["denied"]}, records
    for client in (bearer,):
        client.close()
    close_all(alpha, bravo)
    admin.close()

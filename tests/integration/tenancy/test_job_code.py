"""A job's code bundle can be fetched with the job's own token (what a pod's init container does on a cluster),
and by its organisation; never with another job's token nor by another organisation."""

from __future__ import annotations

import hashlib
import sys

from tests.tenancy_helpers import Api, close_all, create_tenant, tar_gz

FETCH = r"""
import hashlib, os, sys, urllib.error, urllib.request
def fetch(job):
    req = urllib.request.Request(os.environ["KILN_ENDPOINT"] + f"/api/v1/jobs/{job}/code",
                                 headers={"Authorization": "Bearer " + os.environ["KILN_JOB_TOKEN"]})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return hashlib.sha256(r.read()).hexdigest()
    except urllib.error.HTTPError as e:
        return str(e.code)
print("own", fetch(os.environ["KILN_JOB_ID"]))
print("other", fetch(sys.argv[1]))
"""


def test_code_bundle_by_job_token_and_organisation(make_server):
    server = make_server()
    admin = Api.admin(server)
    a, b = create_tenant(admin, "code-alpha", ("member",)), create_tenant(admin, "code-bravo", ("member",))
    try:
        member = a["member"].api
        bundle, sha = tar_gz({"train.py": b"print('hi')\n"})
        assert member.request("PUT", f"/blobs/{sha}", content=bundle, unsigned=True).status_code == 201
        other = member.submit("true")
        spec = {"command": [sys.executable, "-c", FETCH, other["id"]], "runtime": {"python": sys.executable}}
        job = member.ok("POST", "/jobs", json_body={"spec": spec, "code_sha256": sha})
        assert member.wait(job["id"])["state"] == "SUCCEEDED"
        lines = [ln.split(" ", 2)[2] for ln in member.get(f"/jobs/{job['id']}/logs").text.splitlines() if " O " in ln]
        assert lines == [f"own {sha}", "other 404"], lines
        got = member.get(f"/jobs/{job['id']}/code")
        assert got.status_code == 200 and hashlib.sha256(got.content).hexdigest() == sha
        assert b["member"].api.get(f"/jobs/{job['id']}/code").status_code == 404
        assert member.get(f"/jobs/{other['id']}/code").status_code == 404  # no bundle
    finally:
        close_all(a, b)

"""A job's token uploads an artifact bigger than its organisation's storage quota: the server stops reading it
early instead of first writing the whole body to its own disk."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import httpx
import psutil

from tests.tenancy_helpers import Api, close_all, create_tenant

HOLDER = "import os, time; open('token', 'w').write(os.environ['KILN_JOB_TOKEN']); time.sleep(120)"


def test_an_artifact_over_the_storage_quota_is_cut_short(make_server) -> None:  # type: ignore[no-untyped-def]
    server = make_server()
    admin = Api.admin(server)
    team = create_tenant(admin, "quota-art", ("member",))
    try:
        admin.ok("PUT", f"/orgs/{team.id}/quota", json_body={"category": "total", "storage": "10M"})
        job = team["member"].api.submit([sys.executable, "-c", HOLDER])
        token_file = server.home / "jobs" / job["id"] / "work" / "token"
        deadline = time.monotonic() + 60
        while not (token_file.exists() and token_file.stat().st_size):
            assert time.monotonic() < deadline, team["member"].api.job(job["id"])
            time.sleep(0.1)
        written_before = psutil.Process(server.proc.pid).io_counters().write_chars

        def body() -> Iterator[bytes]:
            for _ in range(1024):  # 1 GiB, far over the quota
                yield bytes(1 << 20)

        with httpx.Client(base_url=server.url, timeout=60) as http:
            try:
                response = http.put(
                    f"/api/v1/jobs/{job['id']}/artifacts/big.bin",
                    content=body(),
                    headers={"Authorization": f"Bearer {token_file.read_text()}"},
                )
                status = response.status_code
            except httpx.HTTPError:
                status = None  # the server may close the connection on a body it stopped reading
        assert status is None or 400 <= status < 500, status
        written = psutil.Process(server.proc.pid).io_counters().write_chars - written_before
        assert written < 512 << 20, f"the server wrote {written >> 20} MiB of a body over a 10 MB quota"
        assert not [p for p in (server.home / "tmp").iterdir() if p.name.startswith("artifact-")]
        team["member"].api.post(f"/jobs/{job['id']}/cancel")
    finally:
        close_all(team)
        admin.close()

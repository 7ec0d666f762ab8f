"""Network namespaces made ahead (``backends/local/netpool.py``), for ``network: isolated`` and ``none``: a burst
that the pool was sized for starts without any job making its own namespace, and every namespace is used once:
jobs running at the same time, of one organisation or two, are in namespaces of their own, each holding nothing
but what its own job was given (no listener but the forwarded Kiln API, no nft rule but its own egress table, no
file of anyone else's)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from kiln.sdk.client import Client
from tests.helpers import log_text, wait_for
from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Api, close_all, create_tenant

POOL = 20  # spares kept per mode on the test's server (its minimum), and the burst's size per mode
MISSED = "no spare {mode} network was ready"

# The job's network namespace (its inode) and the TCP ports listening in it, then it waits to be cancelled.
LOOK = r"""
import os, time
listening = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        rows = open(table).read().splitlines()[1:]
    except OSError:
        continue
    for row in rows:
        fields = row.split()
        if fields[3] == "0A":  # LISTEN
            listening.add(int(fields[1].rsplit(":", 1)[1], 16))
print("NS", os.readlink("/proc/self/ns/net"), sorted(listening), flush=True)
time.sleep(120)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    srv = KilnServer(
        tmp_path_factory.mktemp("netpool") / "home",
        cpus="64",
        network_pool_min=str(POOL),
        network_pool_max=str(POOL),
        allowed_python_roots=f"{sys.prefix}:{sys.base_prefix}",
    ).start()
    yield srv
    srv.stop()


def _spares(server: KilnServer, mode: str) -> int:
    return len(list((server.home / "run" / "net").glob(f"spare-{mode}-*")))


def _wait_pool_full(server: KilnServer) -> None:
    deadline = time.monotonic() + 180  # a bound on a hang only: filling is what is waited for
    while min(_spares(server, m) for m in ("isolated", "none")) < POOL:
        assert time.monotonic() < deadline, [_spares(server, m) for m in ("isolated", "none")]
        time.sleep(0.2)


def test_a_burst_the_pool_was_sized_for_makes_no_namespace_of_its_own(server: KilnServer) -> None:
    _wait_pool_full(server)
    client = server.client()
    ids = [
        client.submit({"command": "true", "network": mode, "resources": {"cpus": 0.1}}).id
        for _ in range(POOL)
        for mode in ("isolated", "none")
    ]
    for job_id in ids:
        done = wait_for(client, job_id, timeout=120)
        assert done.state == "SUCCEEDED", (done.message, log_text(client, job_id))
    log = server.log()
    assert MISSED.format(mode="isolated") not in log and MISSED.format(mode="none") not in log


def _ns_line(client: Client, job_id: str) -> list[str]:
    deadline = time.monotonic() + 90
    while True:
        lines = [line for line in log_text(client, job_id) if line.startswith("NS ")]
        if lines:
            return lines[0].split(" ", 2)
        job = client.get_job(job_id)
        assert job.state in ("QUEUED", "STARTING", "RUNNING") and time.monotonic() < deadline, job.message
        time.sleep(0.2)


def test_jobs_never_share_a_namespace_and_each_finds_its_own_clean(server: KilnServer) -> None:
    admin = Api.admin(server)
    red, blue = create_tenant(admin, "red", ("member",)), create_tenant(admin, "blue", ("member",))
    clients = [
        Client(tenant["member"].api.url, tenant["member"].api.access_key, tenant["member"].api.secret_key)
        for tenant in (red, blue)
    ]
    jobs: list[tuple[Client, str, str]] = []
    try:
        for i in range(8):  # all running at once: a namespace's inode is unique while it exists
            client, mode = clients[i % 2], ("isolated", "none")[(i // 2) % 2]
            spec = {"command": ["python", "-c", LOOK], "runtime": {"python": sys.executable}, "network": mode}
            jobs.append((client, client.submit({**spec, "resources": {"cpus": 0.1}}).id, mode))
        seen: dict[str, str] = {}
        for client, job_id, mode in jobs:
            _, inode, listening = _ns_line(client, job_id)
            assert inode not in seen, (job_id, seen.get(inode))
            seen[inode] = job_id
            assert listening == f"[{server.port}]", (mode, listening)  # the forwarded Kiln API, nothing else
            net = server.home / "run" / "net" / f"{job_id}-1"
            assert sorted(p.name for p in net.iterdir()) == ["lock", "ns", "pasta.log", "pasta.pid", "users"]
            assert len(list((net / "users").iterdir())) == 1, job_id  # its one shim (the spare's maker left)
            rules = subprocess.run(
                ["nsenter", f"--net={net / 'ns'}", "nft", "list", "ruleset"], capture_output=True, text=True
            )
            assert rules.returncode == 0, rules.stderr
            tables = [line for line in rules.stdout.splitlines() if line.startswith("table")]
            assert tables == (["table inet kiln {"] if mode == "isolated" else []), rules.stdout
        assert len(seen) == len(jobs)
    finally:
        for client, job_id, _ in jobs:
            client.cancel(job_id)
        for client, job_id, _ in jobs:
            wait_for(client, job_id, timeout=60)
        close_all(red, blue)
        for client in clients:
            client.close()


def test_a_namespace_handed_out_is_removed_with_its_job(server: KilnServer) -> None:
    client = server.client()
    job = client.submit({"command": "true", "network": "none", "resources": {"cpus": 0.1}})
    assert wait_for(client, job.id, timeout=60).state == "SUCCEEDED"
    # The shim removes it as it ends, before it writes the exit record the server reads.
    assert not (server.home / "run" / "net" / f"{job.id}-1").exists()

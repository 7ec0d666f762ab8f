"""Network namespaces made ahead (``backends/local/netpool.py``), for ``network: isolated`` and ``none``: a burst
of 100 jobs in each mode that the pool was sized for starts without any job making its own namespace (the pool's
miss counter, in its log, says so: not a timing). Each job reads, as its first
action, its namespace's own TCP and UDP counters (``/proc/net/snmp``: they start at zero when a namespace is made
and never go back) and its sockets, and then uses the namespace (an SDK call to the Kiln API). So a namespace
handed out twice would show the first job's connection to the second: every job finding zeros proves that none
held a job before. Jobs running at the same time, of one organisation or two, are in namespaces of their own, each
holding nothing but what its own job was given: no socket but the Kiln API's listener, no nft rule but the
egress rules it was made with, no file of anyone else's; a ``none`` job's has no pasta. A namespace that held
nothing when its job ended goes back to that job's organisation, and to no other."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from kiln.sdk.client import Client
from tests.helpers import log_text, wait_for
from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Api, close_all, create_tenant

POOL = 100  # spares kept per mode on the test's server (its minimum and maximum), and the burst's size per mode
MODES = ("isolated", "none")
MISSED = "no spare {mode} network was ready"
SUMMARY = re.compile(
    r"job network pool: isolated: (\d+) handed out, (\d+) missed.*; none: (\d+) handed out, (\d+) missed"
)

# What the job's namespace held before the job did anything in it, then one use of it (the SDK's call to the API,
# a TCP connection counted in the namespace), then it waits to be cancelled.
LOOK = r"""
import json, os, time
def snmp():
    lines = open("/proc/net/snmp").read().splitlines()
    rows = {}
    for head, values in zip(lines[::2], lines[1::2]):
        rows[head.split(":")[0]] = dict(zip(head.split()[1:], (int(v) for v in values.split()[1:])))
    return rows
counters = snmp()
used = {
    "tcp_active_opens": counters["Tcp"]["ActiveOpens"],
    "tcp_passive_opens": counters["Tcp"]["PassiveOpens"],
    "udp_in": counters["Udp"]["InDatagrams"],
    "udp_out": counters["Udp"]["OutDatagrams"],
}
sockets = set()
for table in ("tcp", "tcp6", "udp", "udp6", "raw", "raw6"):
    try:
        rows = open("/proc/net/" + table).read().splitlines()[1:]
    except OSError:
        continue
    for row in rows:
        fields = row.split()
        sockets.add((table.rstrip("6"), int(fields[1].rsplit(":", 1)[1], 16), fields[3]))
from kiln.sdk.client import Client
state = str(Client().get_job(os.environ["KILN_JOB_ID"]).state)
report = {"used": used, "sockets": sorted(sockets), "api": state}
print("NS", os.readlink("/proc/self/ns/net"), json.dumps(report), flush=True)
time.sleep(120)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    srv = KilnServer(
        tmp_path_factory.mktemp("netpool") / "home",
        cpus="256",
        network_pool_min=str(POOL),
        network_pool_max=str(POOL),
        allowed_python_roots=f"{sys.prefix}:{sys.base_prefix}",
    ).start()
    yield srv
    srv.stop()


def _spares(server: KilnServer, mode: str) -> int:
    return len(list((server.home / "run" / "net").glob(f"spare-{mode}-*")))


def _wait_pool_full(server: KilnServer) -> None:
    deadline = time.monotonic() + 300  # a bound on a hang only: filling is what is waited for
    while min(_spares(server, m) for m in MODES) < POOL:
        assert time.monotonic() < deadline, [_spares(server, m) for m in MODES]
        time.sleep(0.2)


def _whole_log(server: KilnServer) -> str:
    return server.log_path.read_text(errors="replace")


def _pool_counters(server: KilnServer, at_least: int) -> dict[str, tuple[int, int]]:
    """The pool's counters as it last logged them (it does once it has refilled after a burst, at most every
    10 s), once they count ``at_least`` starts in each mode: {mode: (handed out, missed)}."""
    deadline = time.monotonic() + 120
    while True:
        found = SUMMARY.findall(_whole_log(server))
        if found:
            iso_out, iso_missed, none_out, none_missed = (int(n) for n in found[-1])
            counters = {"isolated": (iso_out, iso_missed), "none": (none_out, none_missed)}
            if all(sum(c) >= at_least for c in counters.values()):
                return counters
        assert time.monotonic() < deadline, found
        time.sleep(0.5)


@pytest.mark.timeout(900)  # the pool's filling (200 namespaces, 100 of them a pasta each) and 200 jobs
def test_a_burst_of_100_the_pool_was_sized_for_makes_no_namespace_of_its_own(server: KilnServer) -> None:
    _wait_pool_full(server)
    client = server.client()
    ids = [
        client.submit({"command": "true", "network": mode, "resources": {"cpus": 0.1}}).id
        for _ in range(POOL)
        for mode in MODES
    ]
    for job_id in ids:
        done = wait_for(client, job_id, timeout=300)
        assert done.state == "SUCCEEDED", (done.message, log_text(client, job_id))
    counters = _pool_counters(server, POOL)
    assert all(missed == 0 and out >= POOL for out, missed in counters.values()), counters  # handed out, none missed
    log = _whole_log(server)
    assert MISSED.format(mode="isolated") not in log and MISSED.format(mode="none") not in log


def _report(client: Client, job_id: str) -> tuple[str, dict]:
    deadline = time.monotonic() + 120
    while True:
        lines = [line for line in log_text(client, job_id) if line.startswith("NS ")]
        if lines:
            _, inode, report = lines[0].split(" ", 2)
            return inode, json.loads(report)
        job = client.get_job(job_id)
        assert job.state in ("QUEUED", "STARTING", "RUNNING") and time.monotonic() < deadline, job.message
        time.sleep(0.2)


def _pastas_for(net_dir: str) -> list[int]:
    """The pastas serving the namespaces under ``net_dir``: each holds its namespace's file open (the path it shows
    follows the renames of a spare's directory into an attempt's)."""
    found = []
    for proc in psutil.process_iter(["name"]):
        if not (proc.info["name"] or "").startswith(("pasta", "passt")):
            continue
        try:
            fds = os.listdir(f"/proc/{proc.pid}/fd")
            links = [os.readlink(f"/proc/{proc.pid}/fd/{fd}") for fd in fds]
        except OSError:
            continue
        if any(link.startswith(net_dir) for link in links):
            found.append(proc.pid)
    return found


def test_every_namespace_handed_out_was_never_used_and_holds_only_its_own(server: KilnServer) -> None:
    admin = Api.admin(server)
    red, blue = create_tenant(admin, "red", ("member",)), create_tenant(admin, "blue", ("member",))
    clients = [
        Client(tenant["member"].api.url, tenant["member"].api.access_key, tenant["member"].api.secret_key)
        for tenant in (red, blue)
    ]
    api_listener = ["tcp", server.port, "0A"]  # LISTEN
    try:
        for _ in range(2):  # a second round after the first's jobs (and their namespaces) ended
            jobs: list[tuple[Client, str, str]] = []
            try:
                for i in range(8):  # all running at once: a namespace's inode is unique while it exists
                    client, mode = clients[i % 2], MODES[(i // 2) % 2]
                    spec = {"command": ["python", "-c", LOOK], "runtime": {"python": sys.executable}, "network": mode}
                    jobs.append((client, client.submit({**spec, "resources": {"cpus": 0.1}}).id, mode))
                seen: dict[str, str] = {}
                for client, job_id, mode in jobs:
                    inode, report = _report(client, job_id)
                    assert inode not in seen, (job_id, seen.get(inode))
                    seen[inode] = job_id
                    # Never used: no connection was ever made or taken in it, no datagram ever sent or received.
                    assert set(report["used"].values()) == {0}, (mode, report)
                    # Nothing listening, connected or waiting in it but the API's port (pasta's or the shim's).
                    assert {tuple(s) for s in report["sockets"]} == {tuple(api_listener)}, (mode, report)
                    assert report["api"] == "RUNNING", report  # the SDK reached the API through it
                    net = server.home / "run" / "net" / f"{job_id}-1"
                    files = sorted(p.name for p in net.iterdir())
                    if mode == "isolated":
                        assert files == ["lock", "ns", "pasta.log", "pasta.pid", "users"], files
                        assert len(_pastas_for(str(net))) == 1, job_id
                    else:
                        assert files == ["lock", "ns", "users"], files  # no pasta: the shim serves the API's port
                        assert _pastas_for(str(net)) == [], job_id
                    assert len(list((net / "users").iterdir())) == 1, job_id  # its one shim (the spare's maker left)
                    rules = subprocess.run(
                        ["nsenter", f"--net={net / 'ns'}", "nft", "list", "ruleset"], capture_output=True, text=True
                    )
                    assert rules.returncode == 0, rules.stderr
                    tables = [line.strip() for line in rules.stdout.splitlines() if line.strip().startswith("table")]
                    chains = [line.strip() for line in rules.stdout.splitlines() if line.strip().startswith("chain")]
                    if mode == "isolated":  # the egress rules it was made with, and nothing else
                        assert (tables, chains) == (["table inet kiln {"], ["chain egress {"]), rules.stdout
                    else:
                        assert rules.stdout.strip() == "", rules.stdout
                assert len(seen) == len(jobs)
            finally:
                for client, job_id, _ in jobs:
                    client.cancel(job_id)
                for client, job_id, _ in jobs:
                    wait_for(client, job_id, timeout=60)
    finally:
        close_all(red, blue)
        for client in clients:
            client.close()


QUIET = r"""
import json, os
print("NS", os.readlink("/proc/self/ns/net"), json.dumps({}), flush=True)
"""


def test_a_namespace_goes_back_to_its_organisation_only_and_only_when_it_holds_nothing(server: KilnServer) -> None:
    """A job that ended with nothing left in its namespace hands it back for its organisation's next job (its pasta
    kept: the ~28 ms of CPU a new one costs); another organisation's job never gets it, and a namespace where a
    job left a trace (here the TIME_WAIT of its call to the API) is removed, never handed out again."""
    admin = Api.admin(server)
    red, blue = create_tenant(admin, "red-recycle", ("member",)), create_tenant(admin, "blue-recycle", ("member",))
    reds, blues = (
        Client(tenant["member"].api.url, tenant["member"].api.access_key, tenant["member"].api.secret_key)
        for tenant in (red, blue)
    )
    py = {"runtime": {"python": sys.executable}, "network": "isolated", "resources": {"cpus": 0.1}}

    def run(client: Client, script: str) -> tuple[str, str, dict]:
        job_id = client.submit({"command": ["python", "-c", script], **py}).id
        inode, report = _report(client, job_id)
        if script == LOOK:  # it waits: its namespace, as its job has it
            net = server.home / "run" / "net" / f"{job_id}-1"
            report["files"] = sorted(p.name for p in net.iterdir())
            report["pasta_log"] = (net / "pasta.log").read_text()
            rules = subprocess.run(["nsenter", f"--net={net / 'ns'}", "nft", "list", "ruleset"], capture_output=True)
            report["rules"] = [line.strip() for line in rules.stdout.decode().splitlines() if "table" in line]
            client.cancel(job_id)
        done = wait_for(client, job_id, timeout=60)
        assert done.state in ("SUCCEEDED", "CANCELLED"), done.message
        return job_id, inode, report

    try:
        _, quiet, _ = run(reds, QUIET)
        handed_back = list((server.home / "run" / "net").glob(f"used-isolated-*-{red.id}"))
        assert len(handed_back) == 1, handed_back  # by red's job, for red's next
        _, other, _ = run(blues, QUIET)  # blue's job comes first: it is not given red's
        assert other != quiet
        _, again, report = run(reds, LOOK)
        assert again == quiet  # red's next job is
        # ... holding nothing of the first: no connection ever made in it, no socket but pasta's API listener,
        # the egress rules it was made with, and the files of any namespace (pasta's log emptied).
        assert set(report["used"].values()) == {0}, report
        assert {tuple(s) for s in report["sockets"]} == {("tcp", server.port, "0A")}, report
        assert report["api"] == "RUNNING", report
        assert report["files"] == ["lock", "ns", "pasta.log", "pasta.pid", "users"], report
        assert report["pasta_log"] == "" and report["rules"] == ["table inet kiln {"], report
        # That job's call to the API left a TIME_WAIT in its namespace: removed, not handed back.
        _, after, _ = run(reds, QUIET)
        assert after not in (quiet, other), after
    finally:
        close_all(red, blue)
        reds.close()
        blues.close()


# A gang member: calls the API through its namespace's port (a new connection each time, no retry), worker i
# 5 + 15 i times 50 ms apart, so the members leave one after another while the others go on calling.
GANG = r"""
import json, os, time, urllib.request
index = int(os.environ["KILN_WORKER_INDEX"])
url = f"{os.environ['KILN_ENDPOINT']}/api/v1/jobs/{os.environ['KILN_JOB_ID']}"
headers = {"Authorization": "Bearer " + os.environ["KILN_JOB_TOKEN"]}
ok, failed = 0, []
for _ in range(5 + 15 * index):
    try:
        json.loads(urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10).read())
        ok += 1
    except Exception as exc:
        failed.append(repr(exc))
    time.sleep(0.05)
print("CALLS", index, os.readlink("/proc/self/ns/net"), ok, json.dumps(failed), flush=True)
"""


@pytest.fixture(scope="module")
def poolless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    """A server that makes no namespace ahead: each attempt's first member to start makes its own."""
    srv = KilnServer(
        tmp_path_factory.mktemp("nopool") / "home",
        cpus="8",
        network_pool_max="0",
        allowed_python_roots=f"{sys.prefix}:{sys.base_prefix}",
    ).start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("made_by", ["the pool", "a member"])
def test_a_gangs_members_share_the_api_port_until_the_last_leaves(
    made_by: str, server: KilnServer, poolless: KilnServer
) -> None:
    """network: none for a gang: one namespace, each member's shim listening on its API port; as members end
    (worker 0 first, whose shim, started first, most likely made the namespace where the pool did not) the others'
    calls go on being answered."""
    client = (server if made_by == "the pool" else poolless).client()
    job = client.submit(
        {
            "command": ["python", "-c", GANG],
            "runtime": {"python": sys.executable},
            "network": "none",
            "distributed": {"framework": "pytorch", "workers": 4},
            "resources": {"cpus": 0.1},
        }
    )
    done = wait_for(client, job.id, timeout=120)
    lines = [line.split(" ", 4)[1:] for line in log_text(client, job.id) if line.startswith("CALLS ")]
    assert done.state == "SUCCEEDED", (done.message, lines)
    assert sorted(int(index) for index, *_ in lines) == [0, 1, 2, 3], lines
    assert len({inode for _, inode, _, _ in lines}) == 1, lines  # one namespace
    for index, _, ok, failed in lines:
        assert json.loads(failed) == [] and int(ok) == 5 + 15 * int(index), (index, ok, failed)


def test_a_namespace_handed_out_is_removed_with_its_job(server: KilnServer) -> None:
    client = server.client()
    job = client.submit({"command": "true", "network": "none", "resources": {"cpus": 0.1}})
    assert wait_for(client, job.id, timeout=60).state == "SUCCEEDED"
    # The shim removes it as it ends, before it writes the exit record the server reads.
    assert not (server.home / "run" / "net" / f"{job.id}-1").exists()


def test_a_stopped_server_leaves_no_spare_and_a_killed_ones_are_swept_at_start(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    home = tmp_path_factory.mktemp("netpool-sweep") / "home"
    srv = KilnServer(home, network_pool_min="6", network_pool_max="6").start()
    net = home / "run" / "net"
    try:
        deadline = time.monotonic() + 120
        while min(len(list(net.glob(f"spare-{m}-*"))) for m in MODES) < 6:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert len(_pastas_for(str(net))) == 6  # the isolated spares' (none has no pasta)
        assert srv.proc is not None
        srv.proc.kill()  # the spares and their pastas are left behind
        srv.proc.wait()
        assert len(_pastas_for(str(net))) == 6
        srv.start()  # ... until a server starts on the same home
        deadline = time.monotonic() + 60
        while min(len(list(net.glob(f"spare-{m}-*"))) for m in MODES) < 6:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert len(_pastas_for(str(net))) == 6, "the killed server's pastas are still running"
    finally:
        srv.stop()
    leftovers = [p.name for p in net.iterdir() if p.name.startswith(("spare-", "making-"))] if net.exists() else []
    assert leftovers == []
    deadline = time.monotonic() + 10  # pasta exits by itself once its namespace is gone; it is sent SIGTERM too
    while _pastas_for(str(net)):
        assert time.monotonic() < deadline, _pastas_for(str(net))
        time.sleep(0.1)
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(net) in line]
    assert mounts == []


def test_a_job_that_ends_after_its_server_was_killed_hands_nothing_back(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Nobody would hand it out again (the next server on the home sweeps what it finds, but may never come): the
    job's last shim removes its namespace, and its pasta exits, as without a pool."""
    home = tmp_path_factory.mktemp("netpool-orphan") / "home"
    srv = KilnServer(home, network_pool_min="1", network_pool_max="1").start()
    net = home / "run" / "net"
    try:
        client = srv.client()
        job = client.submit({"command": ["sleep", "3141"], "network": "isolated", "resources": {"cpus": 0.1}})
        deadline = time.monotonic() + 120
        while client.get_job(job.id).state != "RUNNING":
            assert time.monotonic() < deadline, client.get_job(job.id)
            time.sleep(0.1)
        ours = net / f"{job.id}-1"
        pastas = _pastas_for(str(ours))
        assert len(pastas) == 1, pastas
        assert srv.proc is not None
        srv.proc.kill()
        srv.proc.wait()
        # The job's command ends (jobs outlive their server: nothing else would end it now), its shim tidies up.
        sleeps = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "3141"]]
        assert len(sleeps) == 1, sleeps
        sleeps[0].kill()
        deadline = time.monotonic() + 120
        while ours.exists():
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert list(net.glob("used-*")) == []
        deadline = time.monotonic() + 10
        while psutil.pid_exists(pastas[0]) and psutil.Process(pastas[0]).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the job's pasta still runs"
            time.sleep(0.1)
    finally:
        srv.start()  # sweeps the killed one's spare, then stops with nothing left
        srv.stop()

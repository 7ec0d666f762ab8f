"""A job's network and IPC are its own, tried the way an attacker would: from inside a job, the machine's
databases and caches on its loopback and its other addresses, another organisation's job listening on 127.0.0.1
and 0.0.0.0, a port of the machine the operator did not allow, and another job's SysV shared memory and message
queues are out of reach — while what a job legitimately needs (the Kiln API for its SDK, a local mirror the
operator allows) still works. ``network: none`` runs no pasta: its API port is its shim's listener, which leads to
the API only (a proxy's CONNECT through it is answered by the API) and forwards a bounded number of connections
however many the job opens. ``network: host`` is refused unless the operator allows the organisation.

Every address tried is on this machine: its loopback, or its own addresses, which inside a job's namespace name
the job itself."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from kiln.backends.local.network import machine_addresses
from kiln.sdk.client import Client
from tests.helpers import log_text, wait_for
from tests.kilnserver import KilnServer, free_port
from tests.tenancy_helpers import Api, close_all, create_tenant

PY = {"python": sys.executable}
PAYLOAD = b"kiln-mirror " * 100_000  # 1.2 MB

# Connects to each target and reports what happened, one JSON line; fetches the URLs it is given.
PROBE = r"""
import json, os, socket, time, urllib.request
targets = json.loads(os.environ["PROBE"])
report = {}
for host, port in targets["connect"]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((host, port))
        s.settimeout(2)
        try:
            data = s.recv(64).decode(errors="replace")
        except OSError:
            data = ""
        report[f"{host}:{port}"] = "connected " + data
    except OSError as exc:
        report[f"{host}:{port}"] = type(exc).__name__
    finally:
        s.close()
for url in targets["fetch"]:
    try:
        report[url] = len(urllib.request.urlopen(url, timeout=5).read())
    except Exception as exc:
        report[url] = type(exc).__name__
if targets.get("api"):  # the Kiln API with the job's own token, as the SDK reaches it
    url = f"{os.environ['KILN_ENDPOINT']}/api/v1/jobs/{os.environ['KILN_JOB_ID']}"
    request = urllib.request.Request(url, headers={"Authorization": "Bearer " + os.environ["KILN_JOB_TOKEN"]})
    try:
        report["api"] = json.loads(urllib.request.urlopen(request, timeout=10).read())["state"]
    except Exception as exc:
        report["api"] = repr(exc)
api_port = int(os.environ["KILN_ENDPOINT"].rsplit(":", 1)[1])
if targets.get("sdk"):  # the SDK itself, unchanged, at the URL it is given
    from kiln.sdk.client import Client
    try:
        report["sdk"] = str(Client().get_job(os.environ["KILN_JOB_ID"]).state)
    except Exception as exc:
        report["sdk"] = repr(exc)
if targets.get("tunnel"):  # the API's port asked to be a proxy to the machine's PostgreSQL
    s = socket.create_connection(("127.0.0.1", api_port), timeout=5)
    s.sendall(b"CONNECT 127.0.0.1:5432 HTTP/1.1\r\nHost: 127.0.0.1:5432\r\n\r\n")
    try:
        report["tunnel"] = s.recv(200).decode(errors="replace").split("\r\n")[0]
    except OSError as exc:
        report["tunnel"] = type(exc).__name__
    s.close()
print("REPORT " + json.dumps(report), flush=True)
held = []
for _ in range(targets.get("hold", 0)):  # connections to the API's port, held open
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", api_port))
    held.append(s)
if held:
    print(f"HOLDING {len(held)}", flush=True)
    time.sleep(300)
"""

# Listens on the given ports (127.0.0.1 and 0.0.0.0) and hands a secret to whoever connects.
LISTENER = r"""
import os, socket, threading, time
def serve(host, port):
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, port))
    srv.listen()
    while True:
        conn, _ = srv.accept()
        conn.sendall(b"blue-secret")
        conn.close()
for spec in os.environ["LISTEN"].split(","):
    host, port = spec.rsplit(":", 1)
    threading.Thread(target=serve, args=(host, int(port)), daemon=True).start()
time.sleep(0.5)
print("listening", flush=True)
time.sleep(300)
"""

# SysV IPC: creates (or looks for) a shared memory segment and a message queue under a fixed key.
IPC = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
KEY, IPC_CREAT = 0x4B494C4E, 0o1000
if sys.argv[1] == "create":
    shm = libc.shmget(KEY, 1 << 20, IPC_CREAT | 0o666)
    addr = libc.shmat(shm, None, 0)
    ctypes.memmove(addr, b"red-secret", 10)
    queue = libc.msgget(KEY, IPC_CREAT | 0o666)
    print(f"created shm={shm} queue={queue}", flush=True)
    time.sleep(300)
else:
    shm = libc.shmget(KEY, 0, 0)
    shm_errno = ctypes.get_errno()
    queue = libc.msgget(KEY, 0)
    queue_errno = ctypes.get_errno()
    print(f"looked shm={shm} {os.strerror(shm_errno) if shm < 0 else ''} "
          f"queue={queue} {os.strerror(queue_errno) if queue < 0 else ''}", flush=True)
"""


class _Mirror(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(PAYLOAD)))
        self.end_headers()
        self.wfile.write(PAYLOAD)

    def log_message(self, *_args: object) -> None:
        pass


def _http_server() -> http.server.ThreadingHTTPServer:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Mirror)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture(scope="module")
def mirrors() -> Iterator[tuple[int, int]]:
    """(the port the operator allows jobs, a port it does not), both HTTP servers on the machine's loopback."""
    allowed, other = _http_server(), _http_server()
    yield allowed.server_address[1], other.server_address[1]
    allowed.shutdown()
    other.shutdown()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, mirrors: tuple[int, int]) -> Iterator[KilnServer]:
    allowed, _ = mirrors
    srv = KilnServer(
        tmp_path_factory.mktemp("network") / "home",
        cpus="4",
        job_egress=f"deny 10.0.0.0/8; allow 127.0.0.1:{allowed}",
        network_host_orgs="hostnet",
        allowed_python_roots=f"{sys.prefix}:{sys.base_prefix}",  # the jobs run this interpreter
    ).start()
    yield srv
    srv.stop()


def _client(api: Api) -> Client:
    return Client(api.url, api.access_key, api.secret_key)


def _report(client: Client, job_id: str) -> dict:
    done = wait_for(client, job_id, timeout=90)
    lines = log_text(client, job_id)
    assert done.state == "SUCCEEDED", (done.message, lines)
    found = [line for line in lines if line.startswith("REPORT ")]
    assert found, lines
    return dict(json.loads(found[-1][len("REPORT ") :]))


def _wait_line(client: Client, job_id: str, prefix: str) -> str:
    deadline = time.monotonic() + 60
    while True:
        lines = [line for line in log_text(client, job_id) if line.startswith(prefix)]
        if lines:
            return lines[-1]
        job = client.get_job(job_id)
        assert job.state in ("QUEUED", "STARTING", "RUNNING") and time.monotonic() < deadline, (
            job.message,
            log_text(client, job_id),
        )
        time.sleep(0.2)


def _pastas_serving(prefix: str) -> list[int]:
    """The pastas serving a namespace whose file is under ``prefix``: each holds the file open (the path it shows
    follows the renames of a spare's directory into an attempt's)."""
    found = []
    for proc in psutil.process_iter(["name"]):
        if not (proc.info["name"] or "").startswith(("pasta", "passt")):
            continue
        try:
            links = [os.readlink(f"/proc/{proc.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{proc.pid}/fd")]
        except OSError:
            continue
        if any(link.startswith(prefix) for link in links):
            found.append(proc.pid)
    return found


def _network_gone(server: KilnServer, job_id: str) -> None:
    """The attempt's namespace is removed with it, and its pasta exits."""
    deadline = time.monotonic() + 20
    while True:
        left = list((server.home / "run" / "net").glob(f"{job_id}-*"))
        mounted = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if job_id in line]
        pastas = _pastas_serving(str(server.home / "run" / "net" / job_id))
        if not left and not mounted and not pastas:
            return
        assert time.monotonic() < deadline, (left, mounted, pastas)
        time.sleep(0.2)


def _reachable_here(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_job_reaches_nothing_of_the_machine_nor_another_orgs_listener(
    server: KilnServer, mirrors: tuple[int, int]
) -> None:
    allowed, other = mirrors
    admin = Api.admin(server)
    red, blue = create_tenant(admin, "red", ("member",)), create_tenant(admin, "blue", ("member",))
    try:
        attacker, victim = _client(red["member"].api), _client(blue["member"].api)
        loop_port, any_port = free_port(), free_port()
        listen = f"127.0.0.1:{loop_port},0.0.0.0:{any_port}"
        hold = victim.submit({"command": [sys.executable, "-c", LISTENER], "runtime": PY, "env": {"LISTEN": listen}})
        _wait_line(victim, hold.id, "listening")
        # What the machine serves on its loopback: PostgreSQL, Redis, the unallowed mirror; the victim's ports.
        connect: list[tuple[str, int]] = [
            ("127.0.0.1", 5432),
            ("127.0.0.1", 6379),
            ("::1", 6379),
            ("127.0.0.1", other),
            ("127.0.0.1", loop_port),
            ("127.0.0.1", any_port),
        ]
        for address in machine_addresses():  # its other addresses: a service bound to 0.0.0.0 answers there
            connect += [(address, 5432), (address, any_port)]
        assert _reachable_here(other)  # the machine itself reaches what the job must not
        probe = {
            "connect": connect,
            "fetch": [f"http://127.0.0.1:{allowed}/model.bin", f"http://127.0.0.1:{other}/model.bin"],
            "api": True,
        }
        job = attacker.submit(
            {"command": [sys.executable, "-c", PROBE], "runtime": PY, "env": {"PROBE": json.dumps(probe)}}
        )
        report = _report(attacker, job.id)
        reached = {k: v for k, v in report.items() if isinstance(v, str) and v.startswith("connected")}
        assert reached == {}, report
        # What the job legitimately needs still works: the mirror the operator allows, and the Kiln API.
        assert report[f"http://127.0.0.1:{allowed}/model.bin"] == len(PAYLOAD), report
        assert report[f"http://127.0.0.1:{other}/model.bin"] != len(PAYLOAD), report
        assert report["api"] == "RUNNING", report
        _network_gone(server, job.id)
        victim.cancel(hold.id)
        assert wait_for(victim, hold.id, timeout=60).state == "CANCELLED"
    finally:
        close_all(red, blue)
        admin.close()


def _api_connections(port: int) -> dict[int, int]:
    """Established connections to the Kiln API's port on the machine's loopback, per process."""
    per: dict[int, int] = {}
    for conn in psutil.net_connections("tcp"):
        if conn.raddr and conn.raddr.port == port and conn.status == psutil.CONN_ESTABLISHED and conn.pid:
            per[conn.pid] = per.get(conn.pid, 0) + 1
    return per


def test_network_none_reaches_only_the_kiln_api_with_no_pasta(server: KilnServer, mirrors: tuple[int, int]) -> None:
    allowed, other = mirrors
    admin = Api.admin(server)
    red, blue = create_tenant(admin, "red4", ("member",)), create_tenant(admin, "blue4", ("member",))
    try:
        attacker, victim = _client(red["member"].api), _client(blue["member"].api)
        loop_port, any_port = free_port(), free_port()
        listen = f"127.0.0.1:{loop_port},0.0.0.0:{any_port}"
        hold = victim.submit(
            {
                "command": [sys.executable, "-c", LISTENER],
                "runtime": PY,
                "network": "none",
                "env": {"LISTEN": listen},
            }
        )
        _wait_line(victim, hold.id, "listening")
        connect: list[tuple[str, int]] = [
            ("127.0.0.1", 5432),
            ("127.0.0.1", 6379),
            ("::1", 6379),
            ("::1", server.port),  # the API's port is served on 127.0.0.1 only
            ("127.0.0.1", allowed),  # a mirror the operator allows is for isolated jobs: none has no way out
            ("127.0.0.1", other),
            ("127.0.0.1", loop_port),  # another job's listeners
            ("127.0.0.1", any_port),
        ]
        for address in machine_addresses():
            connect += [(address, 5432), (address, any_port), (address, server.port)]
        probe = {
            "connect": connect,
            "fetch": [f"http://127.0.0.1:{allowed}/model.bin", "http://192.0.2.1/"],
            "api": True,
            "sdk": True,
            "tunnel": True,
            "hold": 100,
        }
        job = attacker.submit(
            {
                "command": [sys.executable, "-c", PROBE],
                "runtime": PY,
                "network": "none",
                "env": {"PROBE": json.dumps(probe)},
            }
        )
        report = json.loads(_wait_line(attacker, job.id, "REPORT ")[len("REPORT ") :])
        reached = {k: v for k, v in report.items() if isinstance(v, str) and v.startswith("connected")}
        assert reached == {}, report
        assert report[f"http://127.0.0.1:{allowed}/model.bin"] != len(PAYLOAD), report
        assert isinstance(report["http://192.0.2.1/"], str), report  # no route out at all
        assert report["api"] == "RUNNING" and report["sdk"] == "RUNNING", report  # the SDK works, same URL
        assert not report["tunnel"].startswith("HTTP/1.1 200"), report  # the API answers: no tunnel
        # No pasta for it: its port is its shim's listener, made in its namespace.
        net = server.home / "run" / "net" / f"{job.id}-1"
        assert sorted(p.name for p in net.iterdir()) == ["lock", "ns", "users"]
        assert _pastas_serving(str(net)) == []
        # The job holds 100 connections to the port: its shim forwards at most 32 of them to the API at once.
        _wait_line(attacker, job.id, "HOLDING 100")
        deadline = time.monotonic() + 20
        while True:
            forwarded = max(_api_connections(server.port).values(), default=0)
            if forwarded >= 32 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert forwarded == 32, _api_connections(server.port)
        attacker.cancel(job.id)
        assert wait_for(attacker, job.id, timeout=60).state == "CANCELLED"
        _network_gone(server, job.id)
        victim.cancel(hold.id)
        assert wait_for(victim, hold.id, timeout=60).state == "CANCELLED"
    finally:
        close_all(red, blue)
        admin.close()


def test_network_host_is_refused_unless_the_operator_allows_the_organisation(
    server: KilnServer, mirrors: tuple[int, int]
) -> None:
    _, other = mirrors
    admin = Api.admin(server)
    red, hostnet = create_tenant(admin, "red2", ("member",)), create_tenant(admin, "hostnet", ("member",))
    try:
        spec = {"command": [sys.executable, "-c", PROBE], "runtime": PY, "network": "host"}
        refused = red["member"].api.post("/jobs", {"spec": {**spec, "env": {"PROBE": "{}"}}})
        assert refused.status_code == 403, refused.text
        assert "network: host" in refused.json()["message"] and "KILN_NETWORK_HOST_ORGS" in refused.json()["message"]
        # The organisation the operator named gets the machine's network: there the unallowed mirror answers.
        probe = {"connect": [], "fetch": [f"http://127.0.0.1:{other}/model.bin"]}
        client = _client(hostnet["member"].api)
        job = client.submit({**spec, "env": {"PROBE": json.dumps(probe)}})
        assert _report(client, job.id)[f"http://127.0.0.1:{other}/model.bin"] == len(PAYLOAD)
    finally:
        close_all(red, hostnet)
        admin.close()


def _host_sysv_keys(table: str) -> set[int]:
    lines = Path(f"/proc/sysvipc/{table}").read_text().splitlines()[1:]
    return {int(line.split()[0]) for line in lines if line.strip()}


def test_sysv_ipc_is_the_jobs_own(server: KilnServer) -> None:
    admin = Api.admin(server)
    red, blue = create_tenant(admin, "red3", ("member",)), create_tenant(admin, "blue3", ("member",))
    try:
        attacker, victim = _client(red["member"].api), _client(blue["member"].api)
        hold = victim.submit({"command": [sys.executable, "-c", IPC, "create"], "runtime": PY})
        created = _wait_line(victim, hold.id, "created ")
        assert "shm=-1" not in created and "queue=-1" not in created, created
        key = 0x4B494C4E
        # Neither the machine nor another job sees the victim's segment or queue.
        assert key not in _host_sysv_keys("shm") and key not in _host_sysv_keys("msg")
        job = attacker.submit({"command": [sys.executable, "-c", IPC, "look"], "runtime": PY})
        assert wait_for(attacker, job.id, timeout=60).state == "SUCCEEDED"
        looked = next(line for line in log_text(attacker, job.id) if line.startswith("looked "))
        assert looked == "looked shm=-1 No such file or directory queue=-1 No such file or directory", looked
        victim.cancel(hold.id)
        assert wait_for(victim, hold.id, timeout=60).state == "CANCELLED"
        assert key not in _host_sysv_keys("shm")
    finally:
        close_all(red, blue)
        admin.close()


def test_sysv_shared_memory_counts_as_the_jobs_memory(server: KilnServer) -> None:
    fill = r"""
import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
shm = libc.shmget(0x4B494C4F, 1 << 30, 0o1000 | 0o600)  # 1 GiB asked under a 256 MiB limit
addr = libc.shmat(shm, None, 0)
for offset in range(0, 600 << 20, 4096):
    ctypes.memset(addr + offset, 1, 1)
time.sleep(30)
"""
    admin = Api.admin(server)
    try:
        client = _client(admin)
        job = client.submit({"command": [sys.executable, "-c", fill], "runtime": PY, "resources": {"memory": "256M"}})
        done = wait_for(client, job.id, timeout=90)
        assert done.state == "FAILED" and done.reason == "OOMKilled", (done.message, log_text(client, job.id))
        assert "SysV shared memory" in (done.message or "")
        assert 0x4B494C4F not in _host_sysv_keys("shm")
    finally:
        admin.close()


EVIL_SO = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void evil(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/ran-as-%d", EVIL_DIR, (int)geteuid());
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
}
"""


def test_loader_variables_of_the_spec_reach_only_the_jobs_own_processes(server: KilnServer, tmp_path: Path) -> None:
    """LD_PRELOAD in a spec's env must not load the job's library into what builds the sandbox as root."""
    trap = tmp_path / "trap"
    trap.mkdir()
    trap.chmod(0o777)
    source = tmp_path / "evil.c"
    source.write_text(EVIL_SO)
    library = trap / "evil.so"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", f'-DEVIL_DIR="{trap}"', "-o", str(library), str(source)], check=True, timeout=60
    )
    library.chmod(0o755)
    admin = Api.admin(server)
    try:
        client = _client(admin)
        job = client.submit(
            {
                "command": ["sh", "-c", 'echo "preload=$LD_PRELOAD"'],
                "runtime": PY,
                "env": {"LD_PRELOAD": str(library), "GCONV_PATH": str(trap)},
            }
        )
        done = wait_for(client, job.id, timeout=60)
        assert done.state == "SUCCEEDED", (done.message, log_text(client, job.id))
        assert f"preload={library}" in log_text(client, job.id)  # the job still gets its variable
        assert sorted(p.name for p in trap.iterdir() if p.name.startswith("ran-as-")) == []
    finally:
        admin.close()

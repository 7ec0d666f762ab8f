"""Jobs on the local executor run sandboxed, tried the way an attacker would: a job of one organisation goes after
the server's secrets, another job's files and another organisation's dataset, and after places to write; limits
that used to leak (/dev/shm, disk, SIGTERM ignored) hold and are reported truthfully."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln.injob import cgroups
from kiln.sdk.client import Client
from tests.helpers import log_text, wait_for
from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Api, close_all, create_tenant

PY = {"python": sys.executable}

# Reads and writes what it is told to, and reports each outcome as one JSON line.
PROBE = r"""
import json, os, sys
targets = json.loads(os.environ["PROBE"])
report = {"uid": os.getuid(), "pids": len([p for p in os.listdir("/proc") if p.isdigit()])}
for path in targets["read"]:
    try:
        if os.path.isdir(path):
            report["list " + path] = sorted(os.listdir(path))
            continue
        open(path, "rb").read(16)
        report["read " + path] = "ok"
    except OSError as exc:
        report["read " + path] = exc.strerror
for path in targets["write"]:
    try:
        with open(path, "a") as fh:
            fh.write("pwned")
        report["write " + path] = "ok"
    except OSError as exc:
        report["write " + path] = exc.strerror
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    srv = KilnServer(tmp_path_factory.mktemp("sandbox") / "home", cpus="2").start()
    yield srv
    srv.stop()


def _client(api: Api) -> Client:
    return Client(api.url, api.access_key, api.secret_key)


def test_a_job_reaches_nothing_but_its_own_files(server: KilnServer, tmp_path: Path) -> None:
    admin = Api.admin(server)
    red, blue = create_tenant(admin, "red", ("member",)), create_tenant(admin, "blue", ("member",))
    try:
        attacker, victim = _client(red["member"].api), _client(blue["member"].api)
        secret_set = tmp_path / "secretset"
        secret_set.mkdir()
        (secret_set / "plans.txt").write_text("blue's secret plans\n")
        victim.put_dataset(secret_set, "secretset")
        # The victim: its dataset staged, a secret in its work dir, still running while the attacker looks.
        hold = victim.submit(
            {
                "command": "echo tree=$KILN_INPUT_SECRETSET; echo blue-secret > secret.txt; sleep 120",
                "inputs": [{"dataset": "secretset"}],
                "resources": {"cpus": 0.5},
            }
        )
        deadline = time.monotonic() + 60
        while not any(line.startswith("tree=") for line in log_text(victim, hold.id)):
            assert time.monotonic() < deadline, (victim.get_job(hold.id).message, log_text(victim, hold.id))
            time.sleep(0.2)
        tree = next(line for line in log_text(victim, hold.id) if line.startswith("tree="))[5:]
        victim_work = server.home / "jobs" / hold.id / "work"
        assert (victim_work / "secret.txt").read_text() == "blue-secret\n"
        home = server.home
        targets = {
            "read": [
                str(home / "server.key"),
                str(home / "kiln.db"),
                str(home / "admin.env"),
                str(home / "jobs"),
                str(victim_work / "secret.txt"),
                f"{tree}/plans.txt",
                str(home / "cache" / "data"),
                "/etc/shadow",
            ],
            "write": [
                str(home / "evil.txt"),
                str(victim_work / "evil.txt"),
                f"{tree}/plans.txt",
                "/etc/evil.txt",
                "/usr/evil.txt",
                str(Path(sys.executable).parent / "evil.txt"),  # the runtime
                "mine.txt",  # its own work dir: allowed
                "/tmp/mine.txt",
                "/dev/shm/mine.txt",
            ],
        }
        job = attacker.submit(
            {"command": [sys.executable, "-c", PROBE], "runtime": PY, "env": {"PROBE": json.dumps(targets)}}
        )
        done = wait_for(attacker, job.id, timeout=60)
        assert done.state == "SUCCEEDED", (done.message, log_text(attacker, job.id))
        report = json.loads(log_text(attacker, job.id)[-1])
        assert report.pop("uid") not in (0, os.getuid())
        assert report.pop("pids") < 5  # its own processes only: nobody else's to see or signal
        allowed = {"write mine.txt", "write /tmp/mine.txt", "write /dev/shm/mine.txt"}
        assert {k: v for k, v in report.items() if k in allowed} == dict.fromkeys(allowed, "ok")
        # The server's directory tree is there only as the skeleton of the paths to the job's own files.
        assert report.pop(f"list {home / 'jobs'}") == [job.id]
        leaked = {k: v for k, v in report.items() if k not in allowed and (v == "ok" or isinstance(v, list))}
        assert leaked == {}, report
        assert not (home / "evil.txt").exists() and not (victim_work / "evil.txt").exists()
        assert Path(tree, "plans.txt").read_text() == "blue's secret plans\n"
        victim.cancel(hold.id)
        assert wait_for(victim, hold.id, timeout=60).state == "CANCELLED"
    finally:
        close_all(red, blue)
        admin.close()


def test_what_a_job_keeps_in_dev_shm_counts_as_its_memory(server: KilnServer) -> None:
    client = server.client()
    fill = (
        "import time\nwith open('/dev/shm/big', 'wb') as f:\n    for _ in range(60):\n"
        "        f.write(b'x' * 10 * 2**20); f.flush(); time.sleep(0.02)\n"
    )
    job = client.submit({"command": [sys.executable, "-c", fill], "runtime": PY, "resources": {"memory": "200M"}})
    done = wait_for(client, job.id, timeout=60)
    assert (done.state, done.reason) == ("FAILED", "OOMKilled"), (done.message, log_text(client, job.id))
    assert "/dev/shm" in done.message
    # The tmpfs went with the attempt.
    assert not any(str(server.home / "jobs") in line for line in Path("/proc/self/mountinfo").read_text().splitlines())


def test_a_job_past_its_disk_limit_fails_with_the_reason(server: KilnServer) -> None:
    client = server.client()
    many = "import time\nfor i in range(40):\n    open(f'f{i}', 'wb').write(b'x' * 2**20 * 4); time.sleep(0.1)\n"
    job = client.submit({"command": [sys.executable, "-c", many], "runtime": PY, "resources": {"disk": "50M"}})
    done = wait_for(client, job.id, timeout=60)
    assert (done.state, done.reason) == ("FAILED", "DiskLimitExceeded"), (done.message, log_text(client, job.id))
    assert done.message.startswith("disk limit exceeded: ") and done.message.endswith("> limit 50 MiB"), done.message
    one = "open('big', 'wb').write(b'x' * 2**20 * 80)"
    job = client.submit({"command": [sys.executable, "-c", one], "runtime": PY, "resources": {"disk": "50M"}})
    done = wait_for(client, job.id, timeout=60)
    assert (done.state, done.reason) == ("FAILED", "DiskLimitExceeded"), (done.message, log_text(client, job.id))


def test_code_that_unpacks_beyond_the_disk_limit_is_refused(server: KilnServer, tmp_path: Path) -> None:
    client = server.client()
    code = tmp_path / "code"
    code.mkdir()
    (code / "zeros.bin").write_bytes(bytes(8 * 2**20))  # compresses to almost nothing
    job = client.run({"command": "true", "resources": {"disk": "4M"}}, code_dir=code)
    done = wait_for(client, job.id, timeout=60)
    assert (done.state, done.reason) == ("FAILED", "DiskLimitExceeded"), done.message
    assert "unpacks to" in done.message


def test_a_job_ignoring_sigterm_is_reported_as_sigkilled(server: KilnServer) -> None:
    client = server.client()
    stubborn = "trap '' TERM; echo ready; sleep 60"
    job = client.submit({"command": stubborn})
    deadline = time.monotonic() + 60
    while "ready" not in log_text(client, job.id):
        assert time.monotonic() < deadline, client.get_job(job.id).message
        time.sleep(0.1)
    client.cancel(job.id)
    done = wait_for(client, job.id, timeout=60)
    assert done.state == "CANCELLED"
    assert "SIGKILL after 3 s grace" in done.message, done.message
    assert done.exit_code == 137
    timed = wait_for(client, client.submit({"command": stubborn, "timeout": 1}).id, timeout=60)
    assert (timed.state, timed.reason) == ("FAILED", "Timeout")
    assert "SIGKILL after 3 s grace" in timed.message, timed.message


def test_the_servers_own_files_are_private(server: KilnServer) -> None:
    home = server.home
    assert os.stat(home).st_mode & 0o777 == 0o700
    for name in ("kiln.db", "server.key", "admin.env"):
        assert os.stat(home / name).st_mode & 0o777 == 0o600, name


def test_a_restarted_job_shows_its_current_attempt_only(server: KilnServer) -> None:
    client = server.client()
    command = 'if [ "$KILN_ATTEMPT" = 1 ]; then exit 3; fi; echo second; sleep 60'
    job = client.submit({"command": command, "max_restarts": 1})
    deadline = time.monotonic() + 60
    while "second" not in log_text(client, job.id):
        assert time.monotonic() < deadline, client.get_job(job.id).message
        time.sleep(0.1)
    now = client.get_job(job.id)
    assert (now.attempt, now.state, now.exit_code) == (2, "RUNNING", None)  # not attempt 1's exit code 3
    client.cancel(job.id)
    assert wait_for(client, job.id, timeout=60).state == "CANCELLED"


def test_a_jobs_files_are_freed_when_it_ends_and_a_failed_ones_kept_for_debugging(server: KilnServer) -> None:
    client = server.client()
    ok = wait_for(
        client, client.submit({"command": "head -c 1000000 /dev/zero > big; echo hi > $KILN_OUTPUT_DIR/o"}).id
    )
    failed = wait_for(client, client.submit({"command": "echo clue > clue.txt; exit 4"}).id)
    assert (ok.state, failed.state) == ("SUCCEEDED", "FAILED")
    deadline = time.monotonic() + 20
    while (server.home / "jobs" / ok.id / "work").exists():
        assert time.monotonic() < deadline, "the succeeded job's work dir stayed"
        time.sleep(0.1)
    assert not (server.home / "jobs" / ok.id / "outputs").exists()
    assert [a.path for a in client.artifacts(ok.id)] == ["o"]  # in the store, where it belongs
    assert (server.home / "jobs" / failed.id / "work" / "clue.txt").read_text() == "clue\n"
    assert (server.home / "jobs" / failed.id / "release.json").exists()  # freed once the retention has passed


def test_an_operator_may_opt_out_of_the_sandbox(make_server) -> None:  # type: ignore[no-untyped-def]
    srv = make_server(sandbox="none")
    client = srv.client()
    job = wait_for(client, client.submit({"command": f"id -u; test -r {srv.home / 'server.key'} && echo exposed"}).id)
    assert job.state == "SUCCEEDED", job.message
    assert log_text(client, job.id) == [str(os.getuid()), "exposed"]  # the server's user, the whole filesystem
    assert "KILN_SANDBOX=none: jobs run unsandboxed" in srv.log()


def _cgroup(controller: str) -> bool:
    """Whether this machine gives jobs a group of ``controller`` (root, a writable hierarchy holding it)."""
    group = cgroups.JobCgroup.create(f"probe-{os.getpid()}-{time.monotonic_ns()}", 1.0, 64)
    try:
        return controller in group.dirs
    finally:
        group.remove()


def _leftover_groups(job_id: str) -> list[str]:
    return [str(p) for p in Path("/sys/fs/cgroup").glob(f"*/{cgroups.ROOT_NAME}/{job_id}-*")]


FORK_STORM = """
import os, sys, time
born = 0
try:
    for _ in range(1000):
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        born += 1
except OSError as exc:
    print(f"born={born} then {exc.strerror}", flush=True)
sys.exit(1)
"""


def test_a_job_sees_no_control_group_of_the_machine(server: KilnServer) -> None:
    """The machine's /sys/fs/cgroup named every running job (kiln/<job id>-<attempt>, another tenant's too) with
    its processes and usage: a job sees an empty directory there, and cannot write to it."""
    client = server.client()
    running = client.submit({"command": ["sleep", "30"], "runtime": PY})
    wait_for(client, running.id, "RUNNING", timeout=60)
    assert _leftover_groups(running.id), "the running job has no control group to hide"
    probe = {"read": ["/sys/fs/cgroup", "/sys/class"], "write": ["/sys/fs/cgroup/escape"]}
    job = client.submit({"command": [sys.executable, "-c", PROBE], "runtime": PY, "env": {"PROBE": json.dumps(probe)}})
    assert wait_for(client, job.id, timeout=60).state == "SUCCEEDED", log_text(client, job.id)
    report = json.loads(next(line for line in log_text(client, job.id) if line.startswith("{")))
    assert report["list /sys/fs/cgroup"] == [], report
    assert report["list /sys/class"], report  # the rest of /sys stays (GPU tools read it)
    assert report["write /sys/fs/cgroup/escape"] == "Read-only file system", report
    client.cancel(running.id)
    wait_for(client, running.id, timeout=60)


# Sends the server's shim-notify socket what a shim sends it, as a job: "the watched metric of <job> is written"
# and "<job> changed", for a job of another organisation; one JSON line of what each send did.
NOTIFY = r"""
import json, os, socket, sys
report = {}
for path in json.loads(os.environ["SOCKETS"]):
    for note in ({"job_id": os.environ["VICTIM"], "event": "metrics"}, {"job_id": os.environ["VICTIM"]}):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.sendto(json.dumps(note).encode(), path)
            report[path + " " + str(note.get("event"))] = "sent"
        except OSError as exc:
            report[path + " " + str(note.get("event"))] = exc.strerror
        finally:
            sock.close()
print(json.dumps(report))
"""


def test_a_job_cannot_reach_the_servers_notify_socket(server: KilnServer) -> None:
    """The shims tell the server an attempt changed, or a watched metric was written, by a datagram to
    ``$KILN_HOME/run/notify.sock``, which the server reads as it comes (task shim-notify). A job that could send there
    could wake the server for any job, or spoof the shims' notes: it finds no such socket."""
    notify = server.home / "run" / "notify.sock"
    assert notify.is_socket(), "the server listens for its shims' notes there"
    client = server.client()
    victim = client.submit({"command": ["sleep", "30"], "runtime": PY})
    wait_for(client, victim.id, "RUNNING", timeout=60)
    sockets = [str(notify), str(server.home / "run")]
    env = {"SOCKETS": json.dumps(sockets), "VICTIM": victim.id}
    job = client.submit({"command": [sys.executable, "-c", NOTIFY], "runtime": PY, "env": env})
    assert wait_for(client, job.id, timeout=60).state == "SUCCEEDED", log_text(client, job.id)
    report = json.loads(next(line for line in log_text(client, job.id) if line.startswith("{")))
    assert len(report) == 4 and "sent" not in report.values(), report
    client.cancel(victim.id)
    wait_for(client, victim.id, timeout=60)


def test_a_fork_storm_stops_at_the_jobs_process_limit(server: KilnServer) -> None:
    client = server.client()
    job = client.submit({"command": [sys.executable, "-c", FORK_STORM], "runtime": PY, "resources": {"pids": 64}})
    done = wait_for(client, job.id, timeout=60)
    (line,) = [text for text in log_text(client, job.id) if text.startswith("born=")]
    assert int(line.split()[0].removeprefix("born=")) < 64, line  # the sandbox's own processes count too
    if _cgroup("pids"):
        assert (done.state, done.reason) == ("FAILED", "PidsLimitExceeded"), (done.message, line)
        assert done.message.startswith("process limit exceeded: the job reached its limit of 64 processes")
        assert _leftover_groups(job.id) == []  # removed with the attempt
    else:  # RLIMIT_NPROC: the storm is capped all the same, but nothing tells the shim
        assert done.state == "FAILED", done.message


def test_a_steps_first_process_starts_in_the_jobs_control_groups(server: KilnServer) -> None:
    """The shim moves bubblewrap and its sandbox into the job's groups while the sandbox waits, before the command
    runs: the command's first process, reading its own groups as its first action, is in them (so the memory and
    process limits hold from its first instruction)."""
    if not _cgroup("pids"):
        pytest.skip("no writable pids control group here: the job runs under RLIMIT_NPROC (docs/sandbox.md)")
    client = server.client()
    job = client.submit({"command": ["cat", "/proc/self/cgroup"], "resources": {"pids": 64, "cpus": 1}})
    done = wait_for(client, job.id, timeout=60)
    assert done.state == "SUCCEEDED", done.message
    groups = {line.split(":")[1]: line.split(":", 2)[2] for line in log_text(client, job.id) if line.count(":") >= 2}
    expected = f"/{cgroups.ROOT_NAME}/{job.id}-1"
    for controller in ("pids", "cpu,cpuacct", "cpu", "cpuacct", ""):  # v1 hierarchies by their controllers; v2 ""
        if controller in groups and (controller != "" or "pids" not in groups):
            assert groups[controller].endswith(expected), (controller, groups)
    assert any(path.endswith(expected) for path in groups.values()), groups


FDS = """
import os
fds = {}
for name in os.listdir("/proc/self/fd"):
    try:
        fds[int(name)] = os.readlink("/proc/self/fd/" + name)
    except OSError:
        pass  # the listing's own descriptor, closed by now
print("fds=" + repr(sorted(fds)), fds, flush=True)
"""


def test_a_job_holds_no_descriptor_but_its_standard_streams(server: KilnServer) -> None:
    """What the shim and bubblewrap open to start a job (the seccomp filter, the pipes through which it joins its
    control groups, its network namespace) stays theirs: the command's first process holds 0, 1 and 2 only."""
    client = server.client()
    job = client.submit({"command": [sys.executable, "-c", FDS], "runtime": PY, "resources": {"pids": 64}})
    done = wait_for(client, job.id, timeout=60)
    assert done.state == "SUCCEEDED", done.message
    lines = [line for line in log_text(client, job.id) if line.startswith("fds=")]
    assert lines and lines[0].startswith("fds=[0, 1, 2] "), lines


BUSY = """
import os, resource, time
start = time.monotonic()
for _ in range(2):
    if os.fork() == 0:
        end = time.monotonic() + 3
        while time.monotonic() < end:
            pass
        os._exit(0)
os.wait(); os.wait()
used = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"cpu={(used.ru_utime + used.ru_stime) / (time.monotonic() - start):.3f}")
"""


def test_a_job_uses_no_more_cpu_than_its_cpus(server: KilnServer) -> None:
    if not _cgroup("cpu"):
        pytest.skip("no writable cpu control group here: cpus is not enforced (docs/sandbox.md)")
    client = server.client()
    job = client.submit({"command": [sys.executable, "-c", BUSY], "runtime": PY, "resources": {"cpus": 0.5}})
    done = wait_for(client, job.id, timeout=60)
    assert done.state == "SUCCEEDED", done.message
    (line,) = log_text(client, job.id)
    # Two busy loops for 3 s: CPU time over the job's own wall time, at most the quota and 10%. Less than 0.5 only
    # where the machine was busy (two test workers on two CPUs, and under a load of 14 a job got a fifth of a CPU):
    # the lower bound only shows the loops ran.
    assert 0.02 <= float(line.removeprefix("cpu=")) <= 0.55, line


def test_a_job_flooding_its_log_stops_at_the_log_limit_and_the_log_counts_as_storage(server: KilnServer) -> None:
    client = server.client()

    def storage() -> int:
        return next(c for c in client.quota().categories if c.category == "total").used.storage or 0

    before = storage()
    job = client.submit({"command": "yes", "resources": {"log": "1M"}})
    done = wait_for(client, job.id, timeout=60)
    assert (done.state, done.reason) == ("FAILED", "LogLimitExceeded"), done.message
    assert done.message.startswith("log limit exceeded: the job's log reached "), done.message
    assert done.message.endswith("its limit of 1 MiB (1048576 bytes); the rest of its output was dropped")
    log = (server.home / "logs" / f"{job.id}.log").read_bytes()
    assert 1024**2 - 64 * 1024 < len(log) < 1024**2 + 4096  # the limit, give or take a read, and Kiln's last lines
    assert b" K log limit exceeded: " in log[-4096:]  # the marker, after the job's last line
    assert storage() - before >= 1024**2 - 64 * 1024

"""A job's kernel surface: its seccomp filter refuses namespaces, mounts, keyrings, BPF and io_uring with EPERM
(unless the operator allows user namespaces), and its PATH names its runtime and the system, never the server's
own tool directories."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator

import pytest

from kiln.domain.schemas import JobRead
from kiln.sdk.client import Client
from tests.helpers import log_text, wait_for
from tests.kilnserver import KilnServer

PY = {"python": sys.executable}
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Each call with arguments that would otherwise fail another way (EFAULT, EINVAL) or succeed: only the filter
# answers EPERM to all of them. One JSON line: name -> errno name, or "ok".
SYSCALLS = r"""
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
NR = {
    "x86_64": {"unshare": 272, "mount": 165, "keyctl": 250, "bpf": 321, "io_uring_setup": 425, "setns": 308},
    "aarch64": {"unshare": 97, "mount": 40, "keyctl": 219, "bpf": 280, "io_uring_setup": 425, "setns": 268},
}[os.uname().machine]
CALLS = {
    "unshare": (0x10000000,),  # CLONE_NEWUSER
    "mount": (b"none", b"/tmp", b"tmpfs", 0, None),
    "keyctl": (0, -3, 0, 0, 0),  # KEYCTL_GET_KEYRING_ID of the session keyring
    "bpf": (0, None, 0),
    "io_uring_setup": (1, None),
    "setns": (-1, 0),
}
out = {}
for name, args in CALLS.items():
    rc = libc.syscall(NR[name], *args)
    out[name] = "ok" if rc >= 0 else errno.errorcode[ctypes.get_errno()]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    srv = KilnServer(tmp_path_factory.mktemp("seccomp") / "home", cpus="2").start()
    yield srv
    srv.stop()


def _run(client: Client, spec: dict) -> tuple[JobRead, list[str]]:
    done = wait_for(client, client.submit(spec).id, timeout=60)
    return done, log_text(client, done.id)


def test_a_job_cannot_make_a_user_namespace(server: KilnServer) -> None:
    client = server.client()
    done, lines = _run(client, {"command": "unshare -Ur true"})
    assert done.state == "FAILED" and done.exit_code, (done.state, lines)
    assert any("Operation not permitted" in line for line in lines), lines


def test_kernel_level_system_calls_answer_eperm_in_a_job(server: KilnServer) -> None:
    client = server.client()
    done, lines = _run(client, {"command": [sys.executable, "-c", SYSCALLS], "runtime": PY})
    assert done.state == "SUCCEEDED", (done.message, lines)
    assert json.loads(lines[-1]) == {
        name: "EPERM" for name in ("unshare", "mount", "keyctl", "bpf", "io_uring_setup", "setns")
    }
    # What jobs do every day still works under the filter: threads, processes, a pipe between them.
    done, lines = _run(
        client, {"command": "echo a | sh -c 'cat; (sleep 0.1 &) ; wait' && python3 -c 'import threading'"}
    )
    assert (done.state, lines) == ("SUCCEEDED", ["a"]), done.message


def test_a_jobs_path_is_its_runtime_and_the_system(server: KilnServer) -> None:
    client = server.client()
    done, lines = _run(client, {"command": 'echo "$PATH"', "runtime": PY})
    assert done.state == "SUCCEEDED", done.message
    entries = lines[-1].split(":")
    assert entries == [os.path.realpath(os.path.dirname(sys.executable)), *SYSTEM_PATH.split(":")], entries
    assert not [e for e in entries if ".pyenv" in e or ".cargo" in e], entries


def test_an_operator_may_let_jobs_make_user_namespaces(make_server) -> None:  # type: ignore[no-untyped-def]
    srv = make_server(job_user_namespaces="true", cpus="2")
    client = srv.client()
    done, lines = _run(client, {"command": "unshare -Urm sh -c 'id -u; mount -t tmpfs none /tmp && echo mounted'"})
    assert (done.state, lines) == ("SUCCEEDED", ["0", "mounted"]), done.message
    done, lines = _run(client, {"command": [sys.executable, "-c", SYSCALLS], "runtime": PY})
    assert json.loads(lines[-1])["keyctl"] == "EPERM", lines  # the rest of the filter holds


def test_every_process_of_a_multi_process_step_runs_under_the_filter(server: KilnServer) -> None:
    # Each process of the step has a bubblewrap of its own, each reading the filter from an fd of its own.
    client = server.client()
    spec = {
        "command": [sys.executable, "-c", SYSCALLS],
        "runtime": PY,
        "resources": {"cpus": 0.25},
        "distributed": {"framework": "pytorch", "workers": 1, "procs_per_worker": 3},
    }
    done, lines = _run(client, spec)
    assert done.state == "SUCCEEDED", (done.message, lines)
    answers = [json.loads(line.split("] ", 1)[1]) for line in lines if "{" in line]
    assert len(answers) == 3 and all(set(a.values()) == {"EPERM"} for a in answers), lines

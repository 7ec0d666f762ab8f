"""``runtime.python`` (``kiln run --python``) names an interpreter only from what the operator allows, tried the
way an attacker did: pointing it at another job's directory (whose parent the sandbox then showed, with every
job's ``shim.json``: tokens and environments), at the server's state, at the machine's trees, through a symlink
or ``..``, or asking a dry run whether a root-only file exists. And what a job could still reach of another job's
files by absolute path: nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kilnserver import TEST_PYTHON_ROOTS, KilnServer
from tests.tenancy_helpers import Api, close_all, create_tenant

PY = {"python": sys.executable}
FIELD = {"field": "spec.runtime.python"}


@pytest.fixture(scope="module")
def allowed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root the operator allows: a virtualenv in it, a secret beside it the job must not see."""
    top = tmp_path_factory.mktemp("pyroots")
    top.chmod(0o755)  # were it shown, the job's uid could read what is in it
    root = top / "allowed"
    root.mkdir()
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=60)
    (top / "secret.txt").write_text("beside the root\n")
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, allowed: Path) -> Iterator[KilnServer]:
    roots = json.dumps([*TEST_PYTHON_ROOTS, str(allowed)])
    srv = KilnServer(tmp_path_factory.mktemp("pypaths") / "home", cpus="2", allowed_python_roots=roots).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def tenants(server: KilnServer) -> Iterator[dict[str, Any]]:
    admin = Api.admin(server)
    red, blue = create_tenant(admin, "pyred", ("member",)), create_tenant(admin, "pyblue", ("member",))
    yield {"red": red["member"].api, "blue": blue["member"].api}
    close_all(red, blue)
    admin.close()


@pytest.fixture(scope="module")
def victim(server: KilnServer, tenants: dict[str, Any]) -> str:
    """A finished job of another organisation whose files stay for debugging: its outputs, work and attempt."""
    blue = tenants["blue"]
    command = "echo blue-model > $KILN_OUTPUT_DIR/model.pkl; echo blue-secret > secret.txt; exit 3"
    job = blue.submit(command, runtime=PY, env={"BLUE_SECRET": "hunter2"})
    done = blue.wait(job["id"], timeout=90)
    assert done["state"] == "FAILED" and done["exit_code"] == 3, (done["reason"], done["message"])
    return str(job["id"])


def _refusal(api: Api, python: str, dry_run: bool) -> tuple[int, dict[str, Any]]:
    spec = {"command": "python3 steal.py", "runtime": {"python": python}}
    response = api.post("/jobs:dry-run" if dry_run else "/jobs", {"spec": spec})
    return response.status_code, response.json()


def _assert_refused(api: Api, python: str, roots: list[str]) -> str:
    """Refused the same way at submit and in a dry run; the message, naming the field and the allowed roots."""
    for dry_run in (True, False):
        status, body = _refusal(api, python, dry_run)
        assert status == 422, (python, dry_run, body)
        assert body.get("details") == FIELD, body
        message = body["message"]
        assert message.startswith(f"runtime.python: {python} is not allowed on this server"), message
        for root in roots:
            assert root in message, (root, message)
    return str(message)


def test_runtime_python_names_only_what_the_operator_allows(
    server: KilnServer, tenants: dict[str, Any], victim: str, allowed: Path
) -> None:
    red = tenants["red"]
    home = server.home
    attempts = home / "jobs" / victim / "attempts"
    assert (attempts / "1" / "shim.json").exists()
    mine = red.submit("true", runtime=PY)
    assert red.wait(mine["id"], timeout=60)["state"] == "SUCCEEDED"
    link = allowed / "to-attempts"  # a link in an allowed root, to where nothing is allowed
    link.symlink_to(attempts, target_is_directory=True)
    roots = ["/usr", str(allowed), *TEST_PYTHON_ROOTS]
    attacks = [
        str(attempts),
        str(attempts / "1" / "shim.json"),
        str(link),
        str(link / "1"),
        f"{allowed}/../../{os.path.relpath(attempts, allowed.parent.parent)}",  # `..` out of the root
        str(home / "jobs" / mine["id"] / "work"),  # the attacker's own job's directories
        str(home / "jobs" / mine["id"] / "attempts" / "1"),
        str(home),
        str(home / "server.key"),
        "/tmp/x/bin/python3",
        "/var/log",
        "/var/log/x/bin/python3",
        "/usr/bin/../../var/log/x/python3",
        "python3/../../etc/shadow",
    ]
    for python in attacks:
        _assert_refused(red, python, roots)
    # No oracle: a root-only file that exists and one that does not are refused in the same words.
    exists = _assert_refused(red, "/root/.bashrc", roots)
    missing = _assert_refused(red, "/root/.nope", roots)
    assert exists.replace("/root/.bashrc", "X") == missing.replace("/root/.nope", "X")
    # What is allowed but missing may say so.
    status, body = _refusal(red, str(allowed / "venv" / "bin" / "nope"), dry_run=True)
    assert (status, body["details"]) == (422, FIELD) and "no such executable" in body["message"], body


def test_an_allowed_root_runs_and_the_sandbox_shows_no_more_of_it(
    server: KilnServer, tenants: dict[str, Any], allowed: Path
) -> None:
    """A virtualenv in an allowed root, and an interpreter right in it (a link to one the operator allows): each
    runs, and the sandbox shows the venv, or the root, and the installation behind them, nothing around them."""
    red = tenants["red"]
    venv = allowed / "venv"
    link = allowed / "python3"
    link.symlink_to(getattr(sys, "_base_executable", sys.executable))
    probe = (
        "import json, os, sys\n"
        "points = [line.split()[4] for line in open('/proc/self/mountinfo')]\n"
        "try:\n    open(sys.argv[1]).read(); beside = 'ok'\nexcept OSError as exc:\n    beside = exc.strerror\n"
        "print(json.dumps({'prefix': sys.prefix, 'points': points, 'beside': beside}))\n"
    )
    secret = allowed.parent / "secret.txt"
    jobs = {
        str(venv): red.submit(["python", "-c", probe, str(secret)], runtime={"python": str(venv / "bin" / "python")}),
        os.path.realpath(sys.base_prefix): red.submit(
            ["python3", "-c", probe, str(secret)], runtime={"python": str(link)}
        ),
    }
    for prefix, job in jobs.items():
        done = red.wait(job["id"], timeout=90)
        assert done["state"] == "SUCCEEDED", (done["reason"], done["message"], _log(server, job["id"]))
        report = json.loads(_log(server, job["id"])[-1])
        assert report["prefix"] == prefix
        assert report["beside"] != "ok"
        for point in report["points"]:  # nothing above the root (/tmp is the job's own), of it the venv at most
            assert point in ("/", "/tmp") or not str(allowed).startswith(point + "/"), point
            assert not point.startswith(str(allowed) + "/") or point.startswith(str(venv)), point
            assert not point.startswith(str(server.home) + "/jobs/") or job["id"] in point, point


def test_a_job_reaches_no_file_of_another_job_by_its_path(
    server: KilnServer, tenants: dict[str, Any], victim: str
) -> None:
    red = tenants["red"]
    job_dir = server.home / "jobs" / victim
    shim_json = job_dir / "attempts" / "1" / "shim.json"
    assert "hunter2" in shim_json.read_text()
    # Root's alone on the machine: the job's token and environment, the job's directory, its attempts'.
    assert os.stat(shim_json).st_mode & 0o777 == 0o600
    assert os.stat(job_dir).st_mode & 0o077 == 0
    assert os.stat(job_dir / "attempts").st_mode & 0o077 == 0
    assert os.stat(job_dir / "attempts" / "1").st_mode & 0o007 == 0
    # The break: naming the victim's attempts as the interpreter, to have them shown.
    status, body = _refusal(red, str(job_dir / "attempts"), dry_run=False)
    assert status == 422 and body["details"] == FIELD, body
    reads = [
        str(shim_json),
        str(job_dir / "outputs" / "model.pkl"),
        str(job_dir / "checkpoints"),
        str(job_dir / "work" / "secret.txt"),
        str(job_dir / "attempts"),
    ]
    steal = (
        "import json, os, sys\n"
        "own = os.path.dirname(os.environ['KILN_PARAMS_FILE'])\n"
        "report = {}\n"
        "for path in [*sys.argv[1:], os.path.join(own, 'shim.json'), os.environ['KILN_PARAMS_FILE']]:\n"
        "    try:\n"
        "        report[path] = sorted(os.listdir(path)) if os.path.isdir(path) else open(path).read()\n"
        "    except OSError as exc:\n"
        "        report[path] = exc.strerror\n"
        "print(json.dumps(report))\n"
    )
    job = red.submit(["python", "-c", steal, *reads], runtime=PY, params={"lr": 0.1})
    done = red.wait(job["id"], timeout=90)
    assert done["state"] == "SUCCEEDED", done
    report = json.loads(_log(server, job["id"])[-1])
    denied = ("No such file or directory", "Permission denied")
    assert {path: report[path] for path in reads} == {path: report[path] for path in reads if report[path] in denied}
    own = [path for path in report if path not in reads]
    own_config, own_params = sorted(own, key=lambda p: p.endswith("shim.json"), reverse=True)
    assert json.loads(report[own_params]) == {"lr": 0.1}  # what the job must read, it reads
    if os.geteuid() == 0:  # the job runs as its organisation's uid: its own config is root's too
        assert report[own_config] == "Permission denied", report[own_config]


def _log(server: KilnServer, job_id: str) -> list[str]:
    client = server.client()
    try:
        return [line.text for line in client.stream_logs(job_id, follow=False) if line.source != "kiln"]
    finally:
        client.close()


def test_the_cli_says_why_without_a_traceback(server: KilnServer, victim: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env.update({**server.credentials(), "KILN_ENDPOINT": server.url, "KILN_CONFIG": str(tmp_path / "config")})
    attempts = str(server.home / "jobs" / victim / "attempts")
    outputs = []
    for python, extra in ((attempts, []), ("/root/.bashrc", ["--dry-run"]), ("/root/.nope", ["--dry-run"])):
        result = subprocess.run(
            [sys.executable, "-m", "kiln", "run", "--python", python, "--no-code", *extra, "--", "python3 steal.py"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr
        assert f"runtime.python: {python} is not allowed on this server" in result.stderr, result.stderr
        outputs.append(result.stderr.replace(python, "X"))
    assert outputs[1] == outputs[2]

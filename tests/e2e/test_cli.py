"""The ``kiln`` command against a real server, run as a real subprocess (``python -m kiln``)."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.kilnserver import KilnServer, free_port

PY = sys.executable
JOB_ID = re.compile(r"^job-[0-9a-z]+$")


def kiln(
    env: dict[str, str], *args: str, cwd: Path | None = None, stdin: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "kiln", *args],
        env=env,
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def base_env(tmp_path: Path) -> dict[str, str]:
    """The environment without any KILN_* variable, and a config file that is never ~/.kiln."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env["KILN_CONFIG"] = str(tmp_path / "kiln-config")
    env["COLUMNS"] = "200"
    return env


@pytest.fixture
def env(shared_server: KilnServer, tmp_path: Path) -> dict[str, str]:
    return {**base_env(tmp_path), **shared_server.credentials(), "KILN_ENDPOINT": shared_server.url}


def submit(env: dict[str, str], *args: str, cwd: Path | None = None) -> str:
    """``kiln run --python <this interpreter> --no-code ARGS --follow``; returns the job id."""
    result = kiln(env, "run", "--python", PY, "--no-code", "--follow", *args, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()[0]


def job_json(env: dict[str, str], job_id: str) -> dict:  # type: ignore[type-arg]
    result = kiln(env, "jobs", "show", job_id, "--output", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_run_prints_the_job_id_first_and_follow_returns_the_outcome(env, tmp_path):
    (tmp_path / "train.py").write_text("import sys\nprint('training done')\nprint('warn', file=sys.stderr)\n")
    ok = kiln(env, "run", "--python", PY, "--follow", "--", PY, "train.py", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    lines = ok.stdout.splitlines()
    assert JOB_ID.match(lines[0]), ok.stdout
    assert "training done" in lines[1:] and "warn" in lines[1:]
    assert "SUCCEEDED" in ok.stderr and "Traceback" not in ok.stderr

    failed = kiln(env, "run", "--python", PY, "--no-code", "--follow", "--", "echo before failing; exit 3")
    assert failed.returncode == 1, failed.stderr
    job_id, *rest = failed.stdout.splitlines()
    assert JOB_ID.match(job_id) and rest == ["before failing"]
    assert "FAILED" in failed.stderr
    shown = job_json(env, job_id)
    assert (shown["state"], shown["exit_code"]) == ("FAILED", 3)
    assert shown["spec"]["command"] == "echo before failing; exit 3"  # one argument with spaces: a shell string

    # Without --follow, stdout holds the id alone (JOB=$(kiln run ... | head -1)).
    quiet = kiln(env, "run", "--python", PY, "--no-code", "true")
    assert quiet.returncode == 0, quiet.stderr
    assert JOB_ID.match(quiet.stdout.strip()) and quiet.stdout.count("\n") == 1
    assert job_json(env, quiet.stdout.strip())["spec"]["command"] == ["true"]


def start_following(env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """``kiln run --follow`` of a long job, once the job is running: (the process, the job id)."""
    proc = subprocess.Popen(
        [PY, "-m", "kiln", "run", "--python", PY, "--no-code", "--follow", "--", "echo started; sleep 60"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As from an interactive shell: a test run started in the background (`make test &`) inherits SIGINT
        # ignored, and Python then never turns Ctrl-C into KeyboardInterrupt.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None
    job_id = proc.stdout.readline().strip()
    assert JOB_ID.match(job_id), job_id
    assert proc.stdout.readline().strip() == "started"
    return proc, job_id


def test_follow_of_a_cancelled_job_exits_130(env):
    proc, job_id = start_following(env)
    try:
        cancel = kiln(env, "jobs", "cancel", job_id)
        assert cancel.returncode == 0, cancel.stderr
        assert proc.wait(30) == 130
        assert proc.stderr is not None and "CANCELLED" in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()


def test_ctrl_c_stops_following_but_not_the_job(env):
    proc, job_id = start_following(env)
    try:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) == 130
        assert proc.stderr is not None
        stderr = proc.stderr.read()
        assert "keeps running" in stderr and "Traceback" not in stderr
    finally:
        proc.kill()
        proc.wait()
    assert job_json(env, job_id)["state"] == "RUNNING"
    assert kiln(env, "jobs", "cancel", job_id).returncode == 0
    ended = kiln(env, "logs", "--follow", job_id)  # returns once the job has ended
    assert ended.returncode == 0 and ended.stdout.splitlines() == ["started"]
    assert job_json(env, job_id)["state"] == "CANCELLED"


def test_download_retrieves_the_jobs_outputs(env, tmp_path):
    code = "import os; open(os.path.join(os.environ['KILN_OUTPUT_DIR'], 'model.txt'), 'w').write('weights v1\\n')"
    job_id = submit(env, "--", PY, "-c", code)
    dest = tmp_path / "downloaded"
    result = kiln(env, "jobs", "download", job_id, "--dest", str(dest))
    assert result.returncode == 0, result.stderr
    assert (dest / "model.txt").read_text() == "weights v1\n"
    assert result.stdout.strip().endswith("model.txt")

    missing = kiln(env, "jobs", "download", job_id, "no/such/file", "--dest", str(dest))
    assert missing.returncode == 1
    assert missing.stderr.startswith("error:") and "Traceback" not in missing.stderr


def test_run_from_a_yaml_file_with_flag_overrides(env, tmp_path):
    command = [PY, "-c", "import os; print(*(os.environ[k] for k in 'ABC'))"]
    spec_file = tmp_path / "kiln.yaml"
    spec_file.write_text(
        "name: from-file\n"
        f"command: {json.dumps(command)}\n"
        "resources:\n  cpus: 1\n"
        "env:\n  A: file-a\n  B: file-b\n  C: 3\n"
        "labels:\n  team: vision\n"
        "timeout: 5m\n"
    )
    result = kiln(
        env,
        "run",
        "-f",
        str(spec_file),
        "--python",
        PY,
        "--no-code",
        "--name",
        "from-flags",
        "--env",
        "B=flag-b",
        "--label",
        "stage=test",
        "--timeout",
        "1h",
        "--follow",
    )
    assert result.returncode == 0, result.stderr
    job_id, *output = result.stdout.splitlines()
    assert output == ["file-a flag-b 3"]
    job = job_json(env, job_id)
    assert job["name"] == "from-flags"
    assert job["spec"]["env"] == {"A": "file-a", "B": "flag-b", "C": "3"}
    assert job["spec"]["labels"] == {"team": "vision", "stage": "test"}
    assert job["spec"]["timeout"] == 3600
    assert job["spec"]["runtime"]["python"] == PY


def test_yaml_errors_name_the_field_and_exit_2(env, tmp_path):
    bad = tmp_path / "kiln.yaml"
    bad.write_text("command: echo hi\nresorces:\n  cpus: 2\n")
    result = kiln(env, "run", "-f", str(bad), "--no-code")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "resorces" in result.stderr and "unknown field" in result.stderr
    assert "Traceback" not in result.stderr

    bad.write_text("command: [echo\n")
    broken = kiln(env, "run", "-f", str(bad), "--no-code")
    assert broken.returncode == 2 and "not valid YAML" in broken.stderr

    bad.write_text("command: echo hi\nresources:\n  memory: lots\n")
    invalid = kiln(env, "run", "-f", str(bad), "--no-code")
    assert invalid.returncode == 2 and "resources.memory" in invalid.stderr

    nothing = kiln(env, "run", "--no-code")
    assert nothing.returncode == 2 and "no command" in nothing.stderr


def test_logs_follow_prints_lines_in_order(env, tmp_path):
    code = "import time\nfor i in range(20):\n    print(f'line {i}', flush=True)\n    time.sleep(0.02)\n"
    submitted = kiln(env, "run", "--python", PY, "--no-code", "--", PY, "-c", code)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()

    followed = kiln(env, "logs", "-f", job_id)
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout.splitlines() == [f"line {i}" for i in range(20)]
    assert "[kiln]" in followed.stderr  # Kiln's own messages go to stderr

    stamped = kiln(env, "logs", "--timestamps", job_id)
    assert stamped.returncode == 0, stamped.stderr
    first = stamped.stdout.splitlines()[0]
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z line 0$", first), first

    events = kiln(env, "jobs", "events", job_id)
    assert events.returncode == 0, events.stderr
    moves = re.findall(r"(\w+|-) → (\w+)", events.stdout)
    assert moves == [("-", "QUEUED"), ("QUEUED", "STARTING"), ("STARTING", "RUNNING"), ("RUNNING", "SUCCEEDED")]


def test_jobs_list_show_and_runtimes(env):
    job_id = submit(env, "--name", "listed", "--", "true")
    listed = kiln(env, "jobs", "list", "--output", "json")
    assert listed.returncode == 0, listed.stderr
    jobs = json.loads(listed.stdout)
    assert job_id in [j["id"] for j in jobs]

    succeeded = json.loads(kiln(env, "jobs", "list", "--state", "succeeded", "-o", "json").stdout)
    assert succeeded and {j["state"] for j in succeeded} == {"SUCCEEDED"}

    table = kiln(env, "jobs", "list", "--limit", "5")
    assert table.returncode == 0 and job_id in table.stdout and "SUCCEEDED" in table.stdout

    shown = kiln(env, "jobs", "show", job_id)
    assert shown.returncode == 0 and "listed" in shown.stdout and "SUCCEEDED" in shown.stdout

    runtimes = kiln(env, "runtimes", "list", "-o", "json")
    assert runtimes.returncode == 0, runtimes.stderr
    assert {"pytorch", "python"} <= {r["framework"] for r in json.loads(runtimes.stdout)}

    unknown = kiln(env, "jobs", "show", "job-doesnotexist")
    assert unknown.returncode == 1
    assert unknown.stderr.startswith("error:") and "Traceback" not in unknown.stderr


def test_login_writes_a_private_config_used_by_later_commands(shared_server, tmp_path):
    creds = shared_server.credentials()
    env = base_env(tmp_path)
    config = Path(env["KILN_CONFIG"])

    logged_out = kiln(env, "whoami")
    assert logged_out.returncode == 1 and "kiln login" in logged_out.stderr

    wrong = kiln(env, "login", "--endpoint", shared_server.url, "--access-key", creds["KILN_ACCESS_KEY"], stdin="x\n")
    assert wrong.returncode == 1 and wrong.stderr.count("error:") == 1
    assert not config.exists()

    secret = creds["KILN_SECRET_KEY"]
    result = kiln(
        env, "login", "--endpoint", shared_server.url, "--access-key", creds["KILN_ACCESS_KEY"], stdin=secret + "\n"
    )
    assert result.returncode == 0, result.stderr
    assert "admin" in result.stderr
    assert secret not in result.stdout + result.stderr
    assert stat.S_IMODE(config.stat().st_mode) == 0o600

    me = kiln(env, "whoami", "--output", "json")
    assert me.returncode == 0, me.stderr
    assert json.loads(me.stdout)["access_key"] == creds["KILN_ACCESS_KEY"]
    assert kiln(env, "jobs", "list", "-o", "json").returncode == 0


def test_ignored_files_are_not_uploaded(env, tmp_path):
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "train.py").write_text("print('hi')\n")
    (project / "secret.env").write_text("TOKEN=1\n")
    (project / "data" / "big.bin").write_bytes(b"\0" * 1024)
    (project / "notes.tmp").write_text("scratch\n")
    (project / ".gitignore").write_text("secret.env\n*.tmp\n")
    (project / ".kilnignore").write_text("data/\n")
    result = kiln(env, "run", "--python", PY, "--follow", "--", "ls -A; ls data 2>&1 || true", cwd=project)
    assert result.returncode == 0, result.stderr
    listing = result.stdout.splitlines()[1:]
    assert "train.py" in listing and ".gitignore" in listing
    assert not {"secret.env", "notes.tmp", "data", "big.bin"} & set(listing)


def test_version_and_usage_errors(tmp_path):
    env = base_env(tmp_path)
    version = kiln(env, "--version")
    assert version.returncode == 0 and version.stdout.startswith("kiln ")
    bad_flag = kiln(env, "jobs", "list", "--state", "bogus")
    assert bad_flag.returncode == 2
    bad_env = kiln(env, "run", "--env", "NOEQUALS", "--", "true")
    assert bad_env.returncode == 2 and "KEY=VALUE" in bad_env.stderr


def test_server_command_options_override_the_environment(tmp_path):
    import httpx

    home = tmp_path / "server-home"
    port = free_port()
    env = {**base_env(tmp_path), "KILN_PORT": "1", "KILN_HOME": str(tmp_path / "not-this-one")}
    env["KILN_RUNTIMES_DIR"] = str(tmp_path / "runtimes")
    args = [PY, "-m", "kiln", "server", "--port", str(port), "--home", str(home), "--log-level", "warning"]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "kiln server did not become ready"
            time.sleep(0.1)
        assert (home / "admin.env").exists() and not (tmp_path / "not-this-one").exists()
    finally:
        proc.terminate()
        proc.wait(15)

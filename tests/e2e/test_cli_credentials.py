"""What a new user sees when credentials are wrong, and where the CLI keeps its own state: the ``kiln`` command as
a real subprocess against a real server (issue 14, first contact).

A refusal names the endpoint, the access key id and the variable or file each value came from, and what to
check; a stale clock says by how much it is off; no credentials name the server's ``admin.env`` and the client's
config file where they really are. The CLI's state (``kiln login``'s config, the upload resume files, the hash
cache) lives in one directory: ``$KILN_CLIENT_DIR``, else ``$KILN_HOME``, else ``~/.kiln``.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kiln.auth import failures
from tests.kilnserver import KilnServer

PY = sys.executable
# `kiln` with the clock of kiln.auth.signing set back 1000 s: a machine whose clock is off, as the SDK signs.
SKEWED_KILN = (
    "import sys, time, types\n"
    "import kiln.auth.signing as signing\n"
    "signing.time = types.SimpleNamespace(time=lambda: time.time() - 1000)\n"
    "from kiln.cli.main import main\n"
    "sys.argv[0] = 'kiln'\n"
    "main()\n"
)


def kiln(
    env: dict[str, str], *args: str, cwd: Path | None = None, skewed: bool = False
) -> subprocess.CompletedProcess[str]:
    command = [PY, "-c", SKEWED_KILN, *args] if skewed else [PY, "-m", "kiln", *args]
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def error_of(result: subprocess.CompletedProcess[str]) -> str:
    """The one ``error:`` line of a failed command (exit code 1, no traceback)."""
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    return errors[0].removeprefix("error: ")


def bare_env(tmp_path: Path) -> dict[str, str]:
    """No KILN_* variable, and an empty $HOME that the test checks stays empty."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    home = tmp_path / "user-home"
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), COLUMNS="200")
    return env


def written_under(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A directory with code for `kiln run` (packaged and uploaded) and a file for `kiln data put`."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "train.py").write_text("print('training')\n")
    (root / "data").mkdir()
    (root / "data" / "rows.csv").write_text("a,b\n1,2\n")
    return root


def three_commands(env: dict[str, str], project: Path, skewed: bool = False) -> list[str]:
    """The error lines of `kiln jobs list`, `kiln run` (with code to upload) and `kiln data put`."""
    listed = kiln(env, "jobs", "list", skewed=skewed)
    ran = kiln(env, "run", "--python", PY, "--", "python train.py", cwd=project, skewed=skewed)
    put = kiln(env, "data", "put", str(project / "data"), "creds-test", skewed=skewed)
    return [error_of(listed), error_of(ran), error_of(put)]


def test_a_wrong_secret_names_the_key_and_where_the_secret_came_from(
    shared_server: KilnServer, tmp_path: Path, project: Path
) -> None:
    creds = shared_server.credentials()
    key = creds["KILN_ACCESS_KEY"]
    env = {**bare_env(tmp_path), **creds, "KILN_ENDPOINT": shared_server.url, "KILN_SECRET_KEY": "not-the-secret"}
    expected = (
        f"the secret key does not match access key {key} at {shared_server.url} — check KILN_SECRET_KEY "
        "(environment variable)"
    )
    assert three_commands(env, project) == [expected] * 3  # `kiln run` said only "HTTP 401"

    # From `kiln login`'s file (in the client's directory): that file, and `kiln login` again.
    client_dir = tmp_path / "client"
    client_dir.mkdir()
    config = client_dir / "config"
    config.write_text(f"KILN_ENDPOINT={shared_server.url}\nKILN_ACCESS_KEY={key}\nKILN_SECRET_KEY=not-it\n")
    env = {**bare_env(tmp_path), "KILN_CLIENT_DIR": str(client_dir)}
    assert error_of(kiln(env, "jobs", "list")) == (
        f"the secret key does not match access key {key} at {shared_server.url} — check KILN_SECRET_KEY in "
        f"{config}, or run `kiln login` again"
    )


def test_an_unknown_key_is_named_as_such(shared_server: KilnServer, tmp_path: Path, project: Path) -> None:
    creds = shared_server.credentials()
    env = {**bare_env(tmp_path), **creds, "KILN_ENDPOINT": shared_server.url, "KILN_ACCESS_KEY": "AKNOSUCHKEY000000000"}
    expected = (
        f"the access key id you provided does not exist: {shared_server.url} has no access key AKNOSUCHKEY000000000 "
        "— check KILN_ACCESS_KEY (environment variable) and KILN_ENDPOINT (environment variable)"
    )
    assert three_commands(env, project) == [expected] * 3
    assert creds["KILN_SECRET_KEY"] not in expected


def test_a_stale_clock_says_by_how_much(shared_server: KilnServer, tmp_path: Path, project: Path) -> None:
    env = {**bare_env(tmp_path), **shared_server.credentials(), "KILN_ENDPOINT": shared_server.url}
    pattern = re.compile(
        rf"this machine's clock is (\d+) s behind the server's at {re.escape(shared_server.url)} \(server time "
        r"(\S+Z), this machine's (\S+Z); at most 300 s either way is accepted\) — set this machine's clock right, "
        r"e\.g\. turn on NTP: `timedatectl set-ntp true`"
    )
    for line in three_commands(env, project, skewed=True):
        match = pattern.fullmatch(line)
        assert match, line
        assert 999 <= int(match.group(1)) <= 1010
        assert abs(time.time() - time.mktime(time.strptime(match.group(2), "%Y-%m-%dT%H:%M:%SZ")) + time.timezone) < 60


def test_a_disabled_or_expired_key_is_named_as_such(shared_server: KilnServer, tmp_path: Path) -> None:
    with shared_server.client() as admin:
        disabled = admin.create_key(description="to be disabled")
        admin.disable_key(disabled.id)
        expiring = admin.create_key(expires_in=1, description="short")
    assert expiring.expires_at is not None
    base = {**bare_env(tmp_path), "KILN_ENDPOINT": shared_server.url}
    env = {**base, "KILN_ACCESS_KEY": disabled.id, "KILN_SECRET_KEY": disabled.secret_key}
    assert error_of(kiln(env, "jobs", "list")) == (
        f"access key {disabled.id} is disabled (server {shared_server.url}) — ask an admin of your organisation "
        "for a new key (`kiln keys create --user NAME`), then set KILN_ACCESS_KEY and KILN_SECRET_KEY (environment "
        "variables)"
    )
    time.sleep(max(0.0, expiring.expires_at.timestamp() - time.time()) + 0.5)
    env = {**base, "KILN_ACCESS_KEY": expiring.id, "KILN_SECRET_KEY": expiring.secret_key}
    assert error_of(kiln(env, "jobs", "list")) == (
        f"access key {expiring.id} expired at {failures.iso(expiring.expires_at.timestamp())} (server "
        f"{shared_server.url}) — ask an admin of your organisation for a new key (`kiln keys create --user NAME`), "
        "then set KILN_ACCESS_KEY and KILN_SECRET_KEY (environment variables)"
    )


def test_no_credentials_name_the_real_files(tmp_path: Path, project: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    env = {**bare_env(tmp_path), "KILN_HOME": str(elsewhere)}
    expected = (
        f"no Kiln credentials: KILN_ENDPOINT, KILN_ACCESS_KEY and KILN_SECRET_KEY are not set, and {elsewhere}/config "
        f"does not exist. On the server's machine, load the admin key it wrote: `set -a; . {elsewhere}/admin.env; "
        f"set +a`; or run `kiln login` to save credentials to {elsewhere}/config"
    )
    assert three_commands(env, project) == [expected] * 3

    client_dir = tmp_path / "client"
    env["KILN_CLIENT_DIR"] = str(client_dir)
    assert error_of(kiln(env, "jobs", "list")) == (
        f"no Kiln credentials: KILN_ENDPOINT, KILN_ACCESS_KEY and KILN_SECRET_KEY are not set, and {client_dir}/config "
        f"does not exist. On the server's machine, load the admin key it wrote: `set -a; . {elsewhere}/admin.env; "
        f"set +a`; or run `kiln login` to save credentials to {client_dir}/config"
    )
    assert written_under(tmp_path / "user-home") == []


@pytest.mark.parametrize("variable", ["KILN_CLIENT_DIR", "KILN_HOME"])
def test_the_client_keeps_its_state_in_its_directory_not_in_home(
    shared_server: KilnServer, tmp_path: Path, project: Path, variable: str
) -> None:
    creds = shared_server.credentials()
    state = tmp_path / "kiln-state"
    env = {**bare_env(tmp_path), variable: str(state)}
    login = subprocess.run(
        [PY, "-m", "kiln", "login", "--endpoint", shared_server.url, "--access-key", creds["KILN_ACCESS_KEY"]],
        env=env,
        input=creds["KILN_SECRET_KEY"] + "\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert login.returncode == 0, login.stderr
    assert f"credentials saved to {state}/config" in login.stderr
    assert stat.S_IMODE((state / "config").stat().st_mode) == 0o600

    put = kiln(env, "data", "put", str(project / "data"), f"state-{variable.lower().replace('_', '-')}")
    assert put.returncode == 0, put.stderr
    assert written_under(tmp_path / "user-home") == []
    assert (state / "hashes.sqlite").is_file() and (state / "uploads").is_dir()
    assert {"config", "hashes.sqlite", "uploads"} <= set(written_under(state))

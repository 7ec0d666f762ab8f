"""``kiln server`` when it cannot start: one line (``error: ...``) naming what to change, an exit code, nothing
written into a new ``$KILN_HOME`` when the port is taken, and a traceback only with ``--debug``.

Real ``kiln server`` processes; the second-server case uses the session's shared server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kilnserver import KilnServer, free_port


def kiln_server(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``kiln server`` with only the given KILN_* settings (a free port and a home under tmp_path unless set)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    clean.update({"KILN_HOME": str(tmp_path / "home"), "KILN_PORT": str(free_port()), "COLUMNS": "300"})
    clean.update(env)
    return subprocess.run(
        [sys.executable, "-m", "kiln", "server", *args], env=clean, capture_output=True, text=True, timeout=120
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one ``error:`` line of a failed start, checking that nothing like a traceback came with it."""
    output = result.stdout + result.stderr
    assert "Traceback" not in output and "\n  File " not in output, output
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, output
    assert output.rstrip().endswith(errors[0]), output  # the last thing said
    return errors[0]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another program listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_port_in_use_is_one_line_before_anything_is_created(tmp_path, taken_port):
    result = kiln_server(tmp_path, KILN_PORT=str(taken_port))
    assert result.returncode == 1
    line = one_error_line(result)
    assert f"127.0.0.1:{taken_port}" in line and "already in use" in line
    assert "KILN_PORT" in line and "--port" in line
    assert "ready on" not in result.stderr
    assert not (tmp_path / "home").exists()  # no database, no admin.env, no server key


def test_a_port_in_use_given_with_the_option_is_said_the_same_way(tmp_path, taken_port):
    result = kiln_server(tmp_path, "--port", str(taken_port), "--home", str(tmp_path / "other"))
    assert result.returncode == 1
    assert f"127.0.0.1:{taken_port}" in one_error_line(result)
    assert not (tmp_path / "other").exists()


def test_an_address_of_another_machine_names_kiln_host(tmp_path):
    result = kiln_server(tmp_path, KILN_HOST="192.0.2.1")  # TEST-NET-1: never one of this machine's
    assert result.returncode == 1
    line = one_error_line(result)
    assert "192.0.2.1" in line and "KILN_HOST" in line
    assert not (tmp_path / "home").exists()


def test_a_second_server_on_the_same_home_says_which_server_holds_it(tmp_path, shared_server: KilnServer):
    assert shared_server.proc is not None
    result = kiln_server(tmp_path, KILN_HOME=str(shared_server.home))
    assert result.returncode == 1
    line = one_error_line(result)
    assert f"another Kiln server (pid {shared_server.proc.pid}, {shared_server.url})" in line
    assert f"KILN_HOME={shared_server.home}" in line and "--home" in line


def test_debug_prints_the_traceback_before_the_same_line(tmp_path, shared_server: KilnServer):
    result = kiln_server(tmp_path, "--debug", KILN_HOME=str(shared_server.home))
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.rstrip().splitlines()[-1].startswith("error: another Kiln server (pid ")


def test_an_unreachable_database_is_one_line_without_its_password(tmp_path):
    url = f"postgresql+psycopg://kiln:hunter2pw@127.0.0.1:{free_port()}/kiln"
    result = kiln_server(tmp_path, KILN_DATABASE_URL=url)
    assert result.returncode == 1
    line = one_error_line(result)
    assert "cannot use the database postgresql+psycopg://kiln:***@127.0.0.1:" in line
    assert "KILN_DATABASE_URL" in line and "refused" in line.lower()
    assert "hunter2pw" not in result.stdout + result.stderr


def test_a_database_url_that_is_not_one_says_what_to_write(tmp_path):
    result = kiln_server(tmp_path, KILN_DATABASE_URL="localhost:5432/kiln")
    assert result.returncode == 1
    line = one_error_line(result)
    assert "KILN_DATABASE_URL is not a database URL" in line and "postgresql+psycopg://" in line


def test_a_home_that_cannot_be_created_names_kiln_home(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    home = blocker / "home"
    result = kiln_server(tmp_path, KILN_HOME=str(home))
    assert result.returncode == 1
    line = one_error_line(result)
    assert f"cannot use KILN_HOME={home}" in line and "--home" in line


def test_invalid_settings_name_their_variable_and_exit_2(tmp_path):
    result = kiln_server(tmp_path, KILN_PORT="eighty")
    assert result.returncode == 2
    assert "KILN_PORT" in one_error_line(result)
    out_of_range = kiln_server(tmp_path, KILN_PORT="70000")
    assert out_of_range.returncode == 2
    assert "KILN_PORT=70000 is not a port number" in one_error_line(out_of_range)


def test_the_server_module_fails_the_same_way(tmp_path, taken_port):
    """``python -m kiln.api.serve`` (what tests and containers run) says the same one line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env.update({"KILN_HOME": str(tmp_path / "home"), "KILN_PORT": str(taken_port)})
    result = subprocess.run(
        [sys.executable, "-m", "kiln.api.serve"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    assert f"127.0.0.1:{taken_port}" in one_error_line(result)
    assert not (tmp_path / "home").exists()
    env["KILN_PORT"] = "eighty"
    invalid = subprocess.run([sys.executable, "-m", "kiln.api.serve"], env=env, capture_output=True, text=True)
    assert invalid.returncode == 2 and "KILN_PORT" in one_error_line(invalid)


def test_ready_is_said_once_the_port_accepts_connections(shared_server: KilnServer):
    """Not when the application has started (uvicorn had not bound the port yet, and may then have failed to)."""
    log = shared_server.log_path.read_text(errors="replace")
    ready = log.index(f"ready on {shared_server.url}")
    assert log.index("Application startup complete") < ready


def test_help_names_the_variables_behind_each_option_and_debug(tmp_path):
    """The defaults were in [brackets], which the help's rich markup took for tags and dropped."""
    result = kiln_server(tmp_path, "--help")
    assert result.returncode == 0
    help_text = " ".join(result.stdout.split())
    for default in ("$KILN_HOST, else 127.0.0.1", "$KILN_PORT, else 8080", "$KILN_HOME, else ~/.kiln"):
        assert default in help_text
    assert "--debug" in help_text and "traceback" in help_text


def test_a_missing_file_a_setting_names_is_said_by_that_setting(tmp_path):
    missing = tmp_path / "catalog.yaml"
    result = kiln_server(tmp_path, KILN_RUNTIME_CATALOG=str(missing))
    assert result.returncode == 1
    assert one_error_line(result) == f"error: cannot use KILN_RUNTIME_CATALOG={missing}: No such file or directory"


def test_a_backend_that_cannot_load_is_named_with_why(tmp_path):
    broken = tmp_path / "site" / "kubernetes"  # a client that fails to import, ahead of the installed one
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('the kubernetes client is broken on this machine')\n")
    result = kiln_server(tmp_path, KILN_BACKEND="kubernetes", PYTHONPATH=str(tmp_path / "site"))
    assert result.returncode == 1
    assert one_error_line(result) == (
        "error: KILN_BACKEND=kubernetes: cannot load: ImportError: the kubernetes client is broken on this machine"
    )

"""Durations and dataset references from a user's side, against a real server: ``timeout: 1d`` in a kiln.yaml
submits (it was refused while ``--since 1d`` worked), a bad timeout is an error naming the field, the CLI refuses a
dataset reference with the server's own message, and an input at ``NAME@latest`` is pinned at submit."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from kiln.errors import BadRequest
from tests.e2e.test_cli import PY, base_env, job_json, kiln
from tests.kilnserver import KilnServer

NAME_RULE = "use lowercase letters, digits and . _ - (at most 100, starting with a letter or digit)"


@pytest.fixture
def env(shared_server: KilnServer, tmp_path: Path) -> dict[str, str]:
    return {**base_env(tmp_path), **shared_server.credentials(), "KILN_ENDPOINT": shared_server.url}


def test_a_timeout_in_days_in_kiln_yaml_submits(env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "kiln.yaml").write_text(f"command: [{PY}, -c, 'print(1)']\ntimeout: 1d\n")
    result = kiln(env, "run", "--python", PY, "--no-code", "-f", "kiln.yaml", "--follow", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    job = job_json(env, result.stdout.splitlines()[0])
    assert job["state"] == "SUCCEEDED"
    assert job["spec"]["timeout"] == 86400.0  # stored as seconds, as before
    flag = kiln(env, "run", "--python", PY, "--no-code", "--timeout", "1h30m", "--dry-run", "--", PY, "-V")
    assert flag.returncode == 0, flag.stderr
    assert "timeout: 5400.0\n" in flag.stdout, flag.stdout  # the spec the server would run


def test_a_bad_timeout_names_the_field_and_says_what_a_duration_is(env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "kiln.yaml").write_text(f"command: [{PY}, -V]\ntimeout: 1x\n")
    result = kiln(env, "run", "--python", PY, "--no-code", "-f", "kiln.yaml", cwd=tmp_path)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "timeout: '1x' is not a duration (e.g. 90s, 15m, 2h, 1d, 1h30m)" in result.stderr, result.stderr


def test_the_cli_refuses_a_dataset_reference_with_the_servers_message(env, shared_server) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BadRequest) as server:  # the server's answer to the same name, sent as it is
        shared_server.client().request("GET", "/datasets/Bad_Name")
    assert server.value.message == f"dataset name 'Bad_Name': {NAME_RULE}"
    for args in (["data", "get", "Bad_Name@2", "out"], ["data", "rm", "Bad_Name"]):
        result = kiln(env, *args)
        assert result.returncode != 0
        assert server.value.message in result.stderr, result.stderr
    # The same reference in a job's inputs: refused before anything is sent, with that message.
    result = kiln(env, "run", "--python", PY, "--no-code", "--input", "Bad_Name@2", "--", PY, "-V")
    assert result.returncode == 2
    assert f"inputs[0].dataset: {server.value.message}" in result.stderr, result.stderr


def test_a_job_input_at_latest_is_pinned_at_submit(env, shared_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    client = shared_server.client()
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("alpha\n")
    name = f"latest-{uuid.uuid4().hex[:8]}"
    client.put_dataset(tmp_path / "d", name)
    result = kiln(env, "run", "--python", PY, "--no-code", "--input", f"{name}@latest", "--follow", "--", PY, "-V")
    assert result.returncode == 0, result.stderr
    job = job_json(env, result.stdout.splitlines()[0])
    assert job["state"] == "SUCCEEDED"
    assert job["spec"]["inputs"][0]["dataset"] == f"{name}@1"

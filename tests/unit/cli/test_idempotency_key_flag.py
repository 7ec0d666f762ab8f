"""`kiln run --idempotency-key` and `kiln tune --idempotency-key` check the key before anything is packed or sent
(tests/e2e/test_cli_run_checks.py runs one against a server)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kiln.cli.main import build_app

STUDY_YAML = """\
trial: {command: "echo score={x}", runtime: {python: /usr/bin/python3}}
parameters: {x: {type: float, low: 0, high: 1}}
objective: {metric: score, direction: maximize}
"""


@pytest.mark.parametrize("command", ["tune", "run"])
def test_a_bad_idempotency_key_is_a_usage_error_before_anything_is_sent(tmp_path: Path, command: str) -> None:
    study = tmp_path / "study.yaml"
    study.write_text(STUDY_YAML)
    args = ["-f", str(study)] if command == "tune" else ["--no-code", "--", "true"]
    # An endpoint nothing listens on and no secret: reaching for the server would fail otherwise.
    env = {"COLUMNS": "200", "KILN_ENDPOINT": "http://127.0.0.1:9", "KILN_ACCESS_KEY": "AK" + "0" * 18}
    result = CliRunner().invoke(build_app(), [command, "--idempotency-key", "k" * 256, *args], env=env)
    assert result.exit_code == 2, result.output
    assert "--idempotency-key: the key is 256 characters long" in result.output

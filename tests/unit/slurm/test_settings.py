"""KILN_SLURM_*: read with the server's settings (one tree), every bad value named by its variable, and the Slurm
commands found on the PATH or where the operator says."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from kiln.api.startup import settings_problems
from kiln.backends.slurm.settings import slurm_commands
from kiln.errors import BackendUnavailable
from kiln.settings import Settings, SlurmSettings


def test_the_server_settings_carry_the_slurm_branch_from_its_own_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KILN_SLURM_PARTITION", "gpu")
    monkeypatch.setenv("KILN_SLURM_ACCOUNT", "lab-7")
    monkeypatch.setenv("KILN_SLURM_QOS", '{"high": "kiln-high", "low": "scavenger"}')
    monkeypatch.setenv("KILN_SLURM_EXTRA_DIRECTIVES", '["--exclusive", "--comment=kiln job"]')
    monkeypatch.setenv("KILN_SLURM_RUNTIMES", '{"pytorch": "/opt/torch/bin/python"}')
    slurm = Settings(home=tmp_path).slurm
    assert (slurm.partition, slurm.account) == ("gpu", "lab-7")
    assert slurm.qos == {"high": "kiln-high", "low": "scavenger"}
    assert slurm.extra_directives == ["--exclusive", "--comment=kiln job"]
    assert slurm.runtimes == {"pytorch": "/opt/torch/bin/python"}


def test_defaults_leave_everything_to_the_cluster() -> None:
    slurm = SlurmSettings()
    assert (slurm.partition, slurm.account, slurm.qos, slurm.extra_directives) == (None, None, {}, [])
    assert (slurm.python, slurm.scratch_dir, slurm.log_dir) == ("python3", None, "/tmp")
    assert slurm.sbatch is None  # found on the PATH


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("KILN_SLURM_EXTRA_DIRECTIVES", '["exclusive"]', "starting with '--'"),
        ("KILN_SLURM_EXTRA_DIRECTIVES", '["#SBATCH --exclusive"]', "starting with '--'"),
        ("KILN_SLURM_EXTRA_DIRECTIVES", '["--exclusive\\n#SBATCH --uid=0"]', "on one line"),
        ("KILN_SLURM_EXTRA_DIRECTIVES", '["-- exclusive"]', "starting with '--'"),
        ("KILN_SLURM_EXTRA_DIRECTIVES", "--exclusive", 'not JSON: write it as JSON, e.g. ["--exclusive"]'),
        ("KILN_SLURM_QOS", "high=kiln-high", "not JSON"),
        ("KILN_SLURM_QOS", '{"urgent": "q"}', "'urgent' is not a job priority (low, normal, high)"),
        ("KILN_SLURM_QOS", '{"high": "two words"}', "not a Slurm QOS name"),
        ("KILN_SLURM_PARTITION", "gpu,cpu", "not a Slurm name"),
        ("KILN_SLURM_ACCOUNT", "lab 7", "not a Slurm name"),
        ("KILN_SLURM_GPU_TYPES", '{"H200": "h200:2"}', "not a GRES type"),
        ("KILN_SLURM_RUNTIMES", '{"pytorch": "venvs/torch/bin/python"}', "absolute path"),
        ("KILN_SLURM_SCRATCH_DIR", "scratch", "absolute path"),
        ("KILN_SLURM_LOG_DIR", "/tmp/a\nb", "on one line"),
        ("KILN_SLURM_SBATCH", " ", "on one line"),
        ("KILN_SLURM_UPLOAD_TIMEOUT", "0", "greater than or equal to 1"),
    ],
)
def test_a_bad_value_is_named_by_its_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, variable: str, value: str, words: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError) as caught:
        Settings(home=tmp_path)
    problems = settings_problems(caught.value)
    assert problems.startswith(f"{variable}:"), problems
    assert words in problems, problems


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_commands_are_found_on_the_path_or_where_the_settings_say(tmp_path: Path) -> None:
    on_path = tmp_path / "bin"
    for name in ("sbatch", "squeue", "scontrol", "scancel", "sacct"):
        _executable(on_path / name)
    mine = _executable(tmp_path / "opt" / "my-sbatch")
    commands = slurm_commands(SlurmSettings(sbatch=str(mine)), path=str(on_path))
    assert commands.sbatch == str(mine)
    assert commands.squeue == str(on_path / "squeue") and commands.sacct == str(on_path / "sacct")


def test_missing_commands_are_each_named_with_their_setting(tmp_path: Path) -> None:
    on_path = tmp_path / "bin"
    _executable(on_path / "sbatch")
    (tmp_path / "not-executable").write_text("")
    with pytest.raises(BackendUnavailable) as caught:
        slurm_commands(SlurmSettings(scancel=str(tmp_path / "not-executable")), path=str(on_path))
    message = caught.value.message
    assert "squeue is not on the PATH" in message and "KILN_SLURM_SQUEUE" in message
    assert f"KILN_SLURM_SCANCEL={tmp_path / 'not-executable'} is not an executable file" in message
    assert "sbatch" not in message

"""`kiln run` flags on top of a kiln.yaml: scheduling fields."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.cli.spec import Overrides, SpecError, build_spec


def test_priority_and_gpu_type_flags_override_the_file(tmp_path: Path) -> None:
    spec_file = tmp_path / "kiln.yaml"
    spec_file.write_text(
        "command: python train.py\npriority: low\nresources: {gpus: 2, gpu_type: A100}\n"
        "distributed: {framework: pytorch, workers: 2}\nnode_selector: {zone: a}\n"
    )
    spec = build_spec(spec_file, Overrides(priority="high", gpu_type="H200"))
    assert spec.priority == "high" and spec.resources.gpu_type == "H200" and spec.resources.gpus == 2
    assert spec.distributed is not None and spec.distributed.workers == 2 and spec.gang_size == 2
    assert spec.node_selector == {"zone": "a"}


def test_a_bad_priority_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="priority"):
        build_spec(None, Overrides(command=["true"], priority="urgent"))


def test_gpu_type_needs_gpus() -> None:
    with pytest.raises(SpecError, match="gpu_type"):
        build_spec(None, Overrides(command=["true"], gpu_type="H200"))


def test_disk_flag_sets_the_jobs_disk_limit(tmp_path: Path) -> None:
    spec_file = tmp_path / "kiln.yaml"
    spec_file.write_text("command: python train.py\nresources: {memory: 1G, disk: 10G}\n")
    spec = build_spec(spec_file, Overrides(disk="50G"))
    assert (spec.resources.disk, spec.resources.memory) == (50 * 1024**3, 1024**3)
    with pytest.raises(SpecError, match="disk"):
        build_spec(None, Overrides(command=["true"], disk="lots"))


def test_pids_and_log_limit_flags_set_the_jobs_limits() -> None:
    spec = build_spec(None, Overrides(command=["yes"], pids=64, log="100M"))
    assert (spec.resources.pids, spec.resources.log) == (64, 100 * 1024**2)
    with pytest.raises(SpecError, match="pids"):
        build_spec(None, Overrides(command=["true"], pids=2))  # the sandbox's own processes need more


def test_param_flags_are_typed_and_merge_over_the_files_params(tmp_path: Path) -> None:
    spec_file = tmp_path / "kiln.yaml"
    spec_file.write_text("command: python train.py\nparams: {lr: 0.1, layers: 2}\nexperiment: base\n")
    flags = Overrides(params={"lr": "0.01", "opt": "adam", "wd": "1e-4", "bn": "false"}, experiment="mnist sweeps")
    spec = build_spec(spec_file, flags)
    assert spec.params == {"lr": 0.01, "layers": 2, "opt": "adam", "wd": 1e-4, "bn": False}
    assert spec.experiment == "mnist sweeps"
    with pytest.raises(SpecError, match="params"):
        build_spec(None, Overrides(command=["true"], params={"not a name": "1"}))


def test_a_misspelt_command_key_gets_its_did_you_mean(tmp_path: Path) -> None:
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text("comand: python train.py\nresources: {cpus: 1}\n")
    with pytest.raises(SpecError) as caught:
        build_spec(spec_file, Overrides())
    text = str(caught.value)
    assert "comand: unknown field (did you mean 'command'?)" in text and "no command to run" in text
    with pytest.raises(SpecError, match=r"^no command to run"):  # nothing misspelt: the plain message
        build_spec(None, Overrides())

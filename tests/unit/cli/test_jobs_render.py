"""`kiln jobs render --backend NAME`: a backend Kiln does not have is named with the ones it has (it answered
``'slurm' is not one of 'kubernetes'.``, issue 26), one with nothing to render says so, and Kubernetes and Slurm
print what a spec becomes."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from kiln.cli.main import build_app


def _render(tmp_path: Path, backend: str) -> tuple[int, str]:
    spec = tmp_path / "kiln.yaml"
    spec.write_text("command: python train.py\n")
    result = CliRunner().invoke(build_app(), ["jobs", "render", "-f", str(spec), "--backend", backend])
    return result.exit_code, result.output


def test_an_unknown_backend_names_the_backends_there_are(tmp_path: Path) -> None:
    code, output = _render(tmp_path, "nomad")
    assert code == 2
    assert "unknown backend 'nomad': the backends are local, kubernetes, slurm" in output


def test_the_local_backend_says_it_has_nothing_to_render(tmp_path: Path) -> None:
    code, output = _render(tmp_path, "local")
    assert code == 2
    assert "backend 'local' has nothing to render" in output and "--backend kubernetes or slurm" in output


def test_kubernetes_renders(tmp_path: Path) -> None:
    code, output = _render(tmp_path, "Kubernetes")
    assert code == 0, output
    assert "kind: Job" in output


def test_slurm_renders_the_sbatch_script(tmp_path: Path) -> None:
    code, output = _render(tmp_path, "slurm")
    assert code == 0, output
    assert output.startswith("#!/bin/bash\n#SBATCH --job-name=kiln-job-0000000000example-a1\n")
    assert "export KILN_JOB_TOKEN=REPLACE-WITH-THE-JOB-TOKEN" in output


def test_slurm_says_what_it_cannot_run_and_which_setting_is_wrong(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "kiln.yaml"
    spec.write_text("command: python train.py\nruntime: {image: pytorch/pytorch:2.4}\n")
    result = CliRunner().invoke(build_app(), ["jobs", "render", "-f", str(spec), "--backend", "slurm"])
    assert result.exit_code == 2 and "no container images" in result.output
    monkeypatch.setenv("KILN_SLURM_EXTRA_DIRECTIVES", '["--exclusive", "-N 2"]')
    code, output = _render(tmp_path, "slurm")
    assert code == 2 and "KILN_SLURM_EXTRA_DIRECTIVES" in output and "'-N 2'" in output

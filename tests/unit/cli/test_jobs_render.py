"""`kiln jobs render --backend NAME`: a backend Kiln does not have is named with the ones it has (it answered
``'slurm' is not one of 'kubernetes'.``, issue 26), and one with nothing to render says so."""

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
    code, output = _render(tmp_path, "slurm")
    assert code == 2
    assert "unknown backend 'slurm': the backends are local, kubernetes" in output


def test_the_local_backend_says_it_has_nothing_to_render(tmp_path: Path) -> None:
    code, output = _render(tmp_path, "local")
    assert code == 2
    assert "backend 'local' has nothing to render" in output and "--backend kubernetes" in output


def test_kubernetes_renders(tmp_path: Path) -> None:
    code, output = _render(tmp_path, "Kubernetes")
    assert code == 0, output
    assert "kind: Job" in output

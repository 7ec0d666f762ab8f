"""The layers of the code base hold: import-linter's contracts in pyproject.toml ([tool.importlinter], run by
`make lint`) are kept, they do catch an import against them, and kiln.injob (the shim and what runs in a job's
sandbox, often under a bare interpreter) imports nothing but the standard library and itself."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.kilnserver import REPO

SRC = REPO / "src"
INJOB = SRC / "kiln" / "injob"
PYPROJECT = REPO / "pyproject.toml"
LINT_IMPORTS = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def _lint_imports(cwd: Path, src: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` with the project's contracts, on the package under ``src``."""
    return subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache", "--no-logo"],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_import_contracts_are_kept():
    done = _lint_imports(REPO, SRC)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_make_lint_runs_the_import_contracts():
    makefile = (REPO / "Makefile").read_text()
    lint = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    assert "$(BIN)/lint-imports" in lint
    dev = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["dev"]
    assert any(d.startswith("import-linter") for d in dev)


def test_the_layers_name_every_package_from_cli_down_to_injob():
    config = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")
    order = [name.strip() for layer in layers["layers"] for name in layer.split("|")]
    assert order[0] == "cli" and order[-1] == "injob"
    for higher, lower in [
        ("api", "platform"),
        ("scheduler", "tasks"),
        ("tasks", "usecases"),
        ("usecases", "db"),
        ("db", "domain"),
    ]:
        assert order.index(higher) < order.index(lower), (higher, lower)
    assert layers["exhaustive"] is True  # a new top-level package must be given a layer


@pytest.mark.parametrize(
    ("module", "bad_import", "said"),
    [
        # a use case reaching up into the reconciler: the circle kiln.storage.keys and
        # kiln.usecases.jobs.scheduler_inputs
        # took away
        (
            "usecases/data/outputs.py",
            "from kiln.scheduler.loop import Reconciler",
            "kiln.usecases is not allowed to import",
        ),
        # server code writing the client's files through the SDK (what kiln.auth.credfile replaced)
        (
            "usecases/access/identity.py",
            "from kiln.sdk.config import client_dir",
            "kiln.usecases is not allowed to import",
        ),
        # the API running SQL itself is fine by the layers (db is lower), but the platform importing the API is not
        ("platform/__init__.py", "from kiln.api.prometheus import router", "kiln.platform is not allowed to import"),
        ("injob/units.py", "from kiln.domain import quantities", "kiln.injob is not allowed to import"),
        ("domain/placement/packing.py", "from kiln.domain.placement import policy", "No cycles are allowed"),
        ("usecases/jobs/jobs.py", "from kiln.backends.local import executor", "kiln.usecases is not allowed to import"),
    ],
)
def test_an_import_against_the_layers_breaks_the_lint(tmp_path, module, bad_import, said):
    shutil.copytree(SRC / "kiln", tmp_path / "src" / "kiln", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(PYPROJECT, tmp_path / "pyproject.toml")
    target = tmp_path / "src" / "kiln" / module
    target.write_text(target.read_text() + f"\n{bad_import}  # noqa\n")
    done = _lint_imports(tmp_path, tmp_path / "src")
    assert done.returncode == 1, done.stdout + done.stderr
    assert said in done.stdout, done.stdout


def foreign_imports(source: str, siblings: set[str]) -> list[str]:
    """The imports in ``source`` (a module of kiln.injob) that are neither the standard library, kiln.injob,
    nor a module next to it (the shim, run as a script, imports its siblings by their bare names)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue  # a relative import stays inside kiln.injob
        for name in names:
            top = name.split(".")[0]
            inside = name == "kiln.injob" or name.startswith("kiln.injob.")
            if not inside and top not in sys.stdlib_module_names and top not in siblings:
                found.append(f"line {node.lineno}: {name}")
    return found


def test_the_runtime_imports_only_the_standard_library():
    modules = sorted(INJOB.glob("*.py"))
    assert len(modules) > 10
    siblings = {p.stem for p in modules}
    problems = {str(p.relative_to(SRC)): found for p in modules if (found := foreign_imports(p.read_text(), siblings))}
    assert problems == {}, f"kiln.injob must import only the standard library and kiln.injob: {problems}"


def test_the_runtime_scan_sees_what_it_must_refuse():
    source = "import json\nimport httpx\nfrom kiln.domain import spec\nfrom kiln.injob import units\nimport units\n"
    source += "def f():\n    import pydantic\n    from . import shimio\n"
    assert foreign_imports(source, {"units"}) == ["line 2: httpx", "line 3: kiln.domain", "line 7: pydantic"]

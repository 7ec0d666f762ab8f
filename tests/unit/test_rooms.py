"""The folders say what they hold (issue 49): src/kiln/usecases is a package per part of the product (and a module
for a part that is one file), each saying in its docstring what it holds; tests/integration is a folder per part,
as tests/unit mirrors src/kiln. A new file dropped at the top of either fails here: put it in its part."""

from __future__ import annotations

import ast

from tests.kilnserver import REPO

USECASES = REPO / "src" / "kiln" / "usecases"
ONE_FILE_PARTS = {"budgets", "notebooks", "pipelines"}  # a part of the product that is one module
INTEGRATION = REPO / "tests" / "integration"


def test_the_use_cases_are_a_package_per_part_of_the_product():
    modules = {p.stem for p in USECASES.glob("*.py")} - {"__init__"}
    assert modules == ONE_FILE_PARTS, "a use case module belongs in its part's package (docs/architecture.md)"
    packages = sorted(p for p in USECASES.iterdir() if (p / "__init__.py").exists())
    assert len(packages) >= 8
    for package in packages:
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text()))
        assert doc and len(doc) > 20, f"{package.name}/__init__.py says what the package holds"
        assert list(package.glob("*.py")) != [package / "__init__.py"], f"{package.name} holds modules"


def test_the_integration_tests_are_a_folder_per_part():
    loose = sorted(p.name for p in INTEGRATION.glob("test_*.py"))
    assert loose == [], f"put these in the folder of the part they test: {loose}"
    for folder in (p for p in INTEGRATION.iterdir() if p.is_dir() and p.name != "__pycache__"):
        assert (folder / "__init__.py").exists(), f"{folder.name}: a package (tests import each other by name)"

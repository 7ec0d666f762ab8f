"""Every built-in catalog entry installs from the package index this machine's builds use: pip resolves its packages
(``pip install --dry-run --ignore-installed --report``, for this interpreter, the one runtime virtualenvs are made
from) without installing anything. A full build of TensorFlow or PyTorch does not belong in the suite; a resolution
reads the wheels' metadata only (a few seconds an entry, all of them at once)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kiln.domain.catalog import DEFAULT_CATALOG

ASKED_FOR = {  # what users ask for first, and the package each builds on the local executor
    "tensorflow": "tensorflow-cpu",
    "jax": "jax",
    "xgboost": "xgboost",
    "lightgbm": "lightgbm",
}


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares them (tensorflow_cpu is tensorflow-cpu)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def resolve(packages: tuple[str, ...], report: Path) -> tuple[int, str, list[str]]:
    """(pip's exit code, its output, the names it would install)."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--quiet",
            "--ignore-installed",
            "--disable-pip-version-check",
            "--no-input",
            "--report",
            str(report),
            *packages,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    names = []
    if result.returncode == 0:
        names = [canonical(item["metadata"]["name"]) for item in json.loads(report.read_text())["install"]]
    return result.returncode, result.stdout + result.stderr, names


def test_the_frameworks_users_ask_for_first_are_in_the_catalog() -> None:
    for framework, package in ASKED_FOR.items():
        entry = DEFAULT_CATALOG.resolve(framework)
        assert entry.default and entry.description, entry
        assert any(p.startswith(package) for p in entry.packages), entry
        assert entry.image and ":" in entry.image, entry  # what container backends run
    assert DEFAULT_CATALOG.resolve("tensorflow").image.startswith("tensorflow/tensorflow:2.21")


@pytest.mark.timeout(600)
def test_every_catalog_entry_resolves_against_the_index(tmp_path: Path) -> None:
    entries = [e for e in DEFAULT_CATALOG.entries if e.packages]
    broken = ("kiln-test-no-such-package-anywhere==0.0.1",)  # the check can fail
    with ThreadPoolExecutor(max_workers=len(entries) + 1) as pool:
        futures = {e.name: pool.submit(resolve, e.packages, tmp_path / f"{e.name}.json") for e in entries}
        failing = pool.submit(resolve, broken, tmp_path / "broken.json")
        results = {name: future.result() for name, future in futures.items()}
    problems = {name: output[-2000:] for name, (code, output, _) in results.items() if code != 0}
    assert not problems, problems
    for entry in entries:
        names = results[entry.name][2]
        for package in entry.packages:
            top = canonical(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", package).group())  # type: ignore[union-attr]
            assert top in names, (entry.name, top, names)
    code, output, _ = failing.result()
    assert code != 0 and "kiln-test-no-such-package-anywhere" in output

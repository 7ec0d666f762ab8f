"""A missing component (PostgreSQL, FUSE, tensorboard, ...) fails the tests that need it, saying what to install
and how to opt out; opted out by name in $KILN_TEST_WITHOUT, they are skipped and the summary counts them. Run as a
real pytest session on a probe module, with the repository's conftest and settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.components import COMPONENTS, ENV, missing, require
from tests.kilnserver import REPO

pytestmark = pytest.mark.heavy  # each runs a pytest session: make test-fast leaves it out

PROBE = """
import pytest

def test_on_postgresql(postgres_url):
    pass

@pytest.mark.needs("kubectl")
def test_with_kubectl():
    pass

def test_needing_nothing():
    pass
"""


def session(tmp_path: Path, without: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_probe.py").write_text(PROBE)
    # Neither the outer run's opt-outs nor its options (PYTEST_ADDOPTS="-rf ..." changes the summary's lines).
    env = {k: v for k, v in os.environ.items() if k not in (ENV, "PYTEST_ADDOPTS")}
    # Nothing answers on port 1, and no kubectl on this PATH.
    env.update(KILN_TEST_PG_URL="postgresql://postgres@127.0.0.1:1/postgres", PATH=str(tmp_path / "bin"))
    if without is not None:
        env[ENV] = without
    args = ["-p", "tests.conftest", "-c", str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path)]
    return subprocess.run(
        [sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider", "-q", str(tmp_path / "test_probe.py")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_missing_component_fails_its_tests_and_says_how_to_opt_out(tmp_path: Path) -> None:
    result = session(tmp_path, None)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "1 passed, 2 errors" in out, out
    assert "PostgreSQL is missing: PostgreSQL not reachable at postgresql://postgres@127.0.0.1:1/postgres" in out
    assert "or run without the tests that need it: KILN_TEST_WITHOUT=postgresql" in out
    assert "kubectl (it renders the kustomize overlays, offline) is missing: kubectl not on PATH" in out
    assert "KILN_TEST_WITHOUT=kubectl" in out
    assert "2 tests FAILED for a missing component" in out
    assert "skipped" not in out.lower(), out


def test_opted_out_components_skip_their_tests_and_the_summary_counts_them(tmp_path: Path) -> None:
    result = session(tmp_path, "postgresql, kubectl")
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "1 passed, 2 skipped" in out, out
    assert "(opted out: KILN_TEST_WITHOUT=postgresql)" in out and "(opted out: KILN_TEST_WITHOUT=kubectl)" in out
    assert "1 test needing postgresql SKIPPED (KILN_TEST_WITHOUT)" in out
    assert "1 test needing kubectl SKIPPED (KILN_TEST_WITHOUT)" in out


def test_opting_out_of_something_else_does_not_skip(tmp_path: Path) -> None:
    result = session(tmp_path, "kubectl")
    assert result.returncode == 1
    assert "1 passed, 1 skipped, 1 error" in result.stdout, result.stdout


def test_an_unknown_name_to_opt_out_of_is_a_usage_error(tmp_path: Path) -> None:
    result = session(tmp_path, "postgres")
    assert result.returncode == 4, result.stdout + result.stderr
    assert f"{ENV}: unknown component(s) postgres; known: {', '.join(COMPONENTS)}" in result.stderr


def test_require_fails_skips_or_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    require("postgresql", None)  # reachable: nothing happens
    with pytest.raises(pytest.fail.Exception, match=r"Install it .*KILN_TEST_WITHOUT=postgresql$"):
        require("postgresql", "not reachable")
    monkeypatch.setenv(ENV, "fuse,postgresql")
    with pytest.raises(pytest.skip.Exception, match=r"\(opted out: KILN_TEST_WITHOUT=postgresql\)"):
        require("postgresql", "not reachable")
    assert all(missing(name) is None or isinstance(missing(name), str) for name in COMPONENTS if name != "postgresql")

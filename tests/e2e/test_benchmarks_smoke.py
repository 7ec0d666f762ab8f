"""`make bench-smoke` (and `make test`): every benchmark in benchmarks/ runs at its smallest size (`--smoke`) to its
results table, so that a change that breaks one fails the day it is made (issue 26: metrics_ingest.py's training
job had run a script from $KILN_HOME, which jobs stopped seeing with the sandbox, and nothing ran it). Only that
each runs through is checked: exit status 0, no traceback, the results table and the total time printed. The
figures of a smoke run mean nothing and are never judged (a FAIL in its table is no failure here).

A benchmark that builds a runtime (tuning: sklearn; serving and metrics_ingest's training: sklearn and pytorch)
builds it into .cache/test-runtimes the first time, as the end-to-end tests that need the same runtimes do, and
reuses it after."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.components import require
from tests.conftest import postgres_available
from tests.kilnserver import REPO
from tests.slurm_cluster import SlurmCluster

BENCHMARKS = REPO / "benchmarks"
# Imported by the benchmarks (or run by an interpreter they start: tuning.py's Ray virtualenv), never run on their own.
HELPERS = {"cpu_use.py", "report.py", "s3bench.py", "scheduler_loop.py", "tuning_offline.py", "tuning_ray.py"}
# Components a benchmark needs beyond what every Kiln server does (tests/components.py: KILN_TEST_WITHOUT skips).
NEEDS = {"console.py": ("chromium",), "input_modes.py": ("fuse",), "failover.py": ("postgresql",)}
# Seconds a smoke run may take, where more than the default: a runtime to build on a machine that has none yet.
SLOW = {"tuning.py": 1200, "serving.py": 1800, "metrics_ingest.py": 1500, "notebooks.py": 900, "tracking.py": 900}
DEFAULT_LIMIT = 300
# Benchmarks that run on a machine-wide test fixture: smoked by a test of their own that takes the fixture (and is
# grouped with the other tests that use it), given the running one (slurm_submit.py: the Slurm test cluster).
ON_FIXTURE = {"slurm_submit.py"}

TABLE_HEADER = re.compile(r"^metric\s+value\s+baseline\s+ratio\s+target\s+result$", re.MULTILINE)
TOTAL = re.compile(r"^total \d+s$", re.MULTILINE)


def scripts() -> list[str]:
    return sorted(p.name for p in BENCHMARKS.glob("*.py") if p.name not in HELPERS | ON_FIXTURE)


def _param(name: str) -> object:
    marks = [pytest.mark.timeout(SLOW.get(name, DEFAULT_LIMIT) + 60)]
    marks += [pytest.mark.needs(*NEEDS[name])] if name in NEEDS else []
    return pytest.param(name, marks=marks, id=name.removesuffix(".py"))


def test_every_benchmark_is_a_script_or_a_declared_helper() -> None:
    """A new benchmark is smoked as soon as it exists; a new helper must be named above (else it is run)."""
    for path in BENCHMARKS.glob("*.py"):
        runnable = 'if __name__ == "__main__":' in path.read_text()
        assert runnable == (path.name not in HELPERS), f"{path.name}: a script has a __main__ block, a helper none"


@pytest.mark.parametrize("script", [_param(name) for name in scripts()])
def test_a_benchmark_runs_to_its_results_table(script: str, tmp_path: Path) -> None:
    if "postgresql" in NEEDS.get(script, ()):  # its mark alone checks nothing: PostgreSQL's check is a connection
        require("postgresql", postgres_available())
    _smoke(script, tmp_path)


@pytest.mark.timeout(DEFAULT_LIMIT + 60)
def test_the_slurm_benchmark_runs_to_its_results_table(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    _smoke("slurm_submit.py", tmp_path, "--slurm-conf", str(slurm_cluster.conf_path))


def _smoke(script: str, tmp_path: Path, *extra: str) -> None:
    started = time.monotonic()
    try:
        run = subprocess.run(
            [
                sys.executable,
                "-u",
                str(BENCHMARKS / script),
                "--smoke",
                "--json",
                str(tmp_path / "figures.json"),
                *extra,
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=SLOW.get(script, DEFAULT_LIMIT),
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        pytest.fail(f"{script} --smoke did not finish in {exc.timeout:.0f} s; its output ended:\n{out[-4000:]}")
    output = run.stdout + run.stderr
    took = time.monotonic() - started
    assert run.returncode == 0, f"{script} --smoke exited {run.returncode} after {took:.0f} s:\n{output[-6000:]}"
    assert "Traceback (most recent call last)" not in output, output[-6000:]
    assert TABLE_HEADER.search(run.stdout), f"{script} printed no results table:\n{run.stdout[-4000:]}"
    assert TOTAL.search(run.stdout), f"{script} did not finish its report:\n{run.stdout[-4000:]}"
    assert (tmp_path / "figures.json").is_file(), f"{script} --json wrote nothing"
    print(f"{script} --smoke: {took:.1f} s")

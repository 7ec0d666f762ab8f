"""Shared fixtures: real servers, real databases (SQLite and PostgreSQL)."""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _pytest.nodeid import NodeId

from tests.components import ENV, OPTED_OUT, check_opt_outs, require
from tests.kilnserver import KilnServer
from tests.slurm_cluster import SlurmCluster

PG_ADMIN_URL = os.environ.get("KILN_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
_pg_problem: list[str] = []


def _pg_connect():  # type: ignore[no-untyped-def]
    import psycopg

    return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3)


def postgres_available() -> str | None:
    """None when PostgreSQL answers, else why not."""
    if _pg_problem:
        return _pg_problem[0]
    try:
        with _pg_connect() as conn:
            conn.execute("SELECT 1")
        return None
    except Exception as exc:
        _pg_problem.append(f"PostgreSQL not reachable at {PG_ADMIN_URL}: {exc}")
        return _pg_problem[0]


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    require("postgresql", postgres_available())
    name = f"kiln_test_{secrets.token_hex(6)}"
    with _pg_connect() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with _pg_connect() as conn:
            # WITH (FORCE) ends the connections of servers a test has not stopped yet, atomically.
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Run the test once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'kiln.db'}"
    return request.getfixturevalue("postgres_url")  # type: ignore[no-any-return]


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    """Factory: ``make_server(database_url=None, **settings)`` → a started KilnServer; all stopped at the end."""
    servers: list[KilnServer] = []

    def factory(database_url: str | None = None, home: Path | None = None, **settings: str) -> KilnServer:
        server = KilnServer(home or tmp_path / f"home{len(servers)}", database_url, **settings)
        servers.append(server)
        return server.start()

    yield factory
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    """One server for tests that only submit work and read it back."""
    server = KilnServer(tmp_path_factory.mktemp("shared") / "home").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A real two-node Slurm cluster on this machine (tests/slurm_cluster.py), started once per session.

    It is one per machine (fixed names, a machine-wide lock): the tests that use it are one unit of work under
    pytest-xdist (``pytest_collection_modifyitems`` below), so a single worker starts it."""
    require("slurm")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def python_runtime() -> dict[str, str]:
    """A custom runtime that starts instantly: this interpreter (bring-your-own-Python)."""
    return {"python": sys.executable}


def pytest_configure(config: pytest.Config) -> None:
    check_opt_outs()


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("needs"):
        for component in mark.args:
            require(component)


def _reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    return longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # type: ignore[no-untyped-def]
    """Say, last, which tests did not run for a missing component: skipped where opted out, failed otherwise."""
    skipped: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = _reason(report)
        if OPTED_OUT in reason:
            component = reason.rsplit(OPTED_OUT, 1)[1].rstrip(")")
            skipped[component] = skipped.get(component, 0) + 1
    failed = sum(
        f"run without the tests that need it: {ENV}=" in _reason(report)
        for key in ("failed", "error")
        for report in terminalreporter.stats.get(key, [])
    )
    for component, count in sorted(skipped.items()):
        tests = "1 test" if count == 1 else f"{count} tests"
        terminalreporter.write_sep("!", f"{tests} needing {component} SKIPPED ({ENV})", yellow=True)
    if failed:
        tests = "1 test" if failed == 1 else f"{failed} tests"
        terminalreporter.write_sep("!", f"{tests} FAILED for a missing component (see their messages)", red=True)


# -- how make test spreads the suite over its workers (pytest-xdist --dist loadgroup --no-loadscope-reorder) --

# Files whose tests are long and share nothing (each starts its own servers): each of their tests is a unit of
# work of its own, so that the workers share them. Every other file is one unit: its module-scoped servers start once.
SPLIT_FILES = frozenset(
    {
        "tests/e2e/test_benchmarks_smoke.py",
        "tests/integration/servers/test_crash_safety.py",
        "tests/integration/database/test_upgrade_from_releases.py",  # one test per release and database, ~15-50 s each
    }
)
# Session fixtures of which a machine holds one at a time (fixed names and ports): the tests that use one, whatever
# their files, are one unit of work, so that one worker starts it, and the others do not wait for it all the run.
MACHINE_WIDE_FIXTURES = ("slurm_cluster",)
# The longest units first, longest first (make test's durations): a worker that draws one of them near the end of
# the run runs it alone while the others wait. xdist's default order (--loadscope-reorder: the units with the most
# tests first) put the one-test files, the long end-to-end ones, last whatever the collection order said, so the
# order here only holds with --no-loadscope-reorder (the Makefile's).
LONGEST_FIRST = (
    "tests/integration/api/test_api_schema.py",
    "tests/e2e/test_quickstart.py",
    "tests/e2e/test_benchmarks_smoke.py",
    "tests/integration/servers/test_crash_safety.py",
    "tests/integration/database/test_upgrade_from_releases.py",
    "tests/integration/servers/test_chaos.py",
    "tests/e2e/test_pytorch.py",
    "tests/e2e/test_ddp.py",
    "tests/e2e/test_serving.py",
    "tests/e2e/test_tuning_digits.py",
    "tests/integration/tuning/test_studies_semantics.py",
    "tests/e2e/test_console.py",
    "tests/integration/notebooks/test_notebooks.py",
    "tests/integration/tenancy/test_quota.py",
    "tests/e2e/test_cli_runtimes.py",
    "tests/integration/tenancy/test_isolation_matrix.py",
    "tests/integration/data/test_catalog_index.py",
    "tests/integration/local/test_local_executor.py",
    "tests/integration/metrics/test_metrics_store.py",
    "tests/e2e/test_cli_tenancy.py",
    "tests/integration/jobs/test_reconcile_batch.py",
    "tests/integration/jobs/test_lifecycle.py",
    "tests/integration/console/test_console_session.py",
    "tests/integration/data/test_datasets.py",
    "tests/e2e/test_cli.py",
)


def _file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(trylast=True)  # after tests/integration/conftest.py gives schemathesis' items their ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_file_of(item), len(rank)))  # stable: within a file, as written
    if not getattr(config.option, "loadgroup", False):  # a pytest-xdist worker of --dist loadgroup
        return
    for item in items:
        path = _file_of(item)
        # The unit of work: the text after the node id's last "@" (where it follows any "]"). pytest-xdist 3.8
        # appends its xdist_group marks there by setting Item._nodeid, which pytest 9 no longer reads (the node id
        # is built from Item._id): with --dist loadgroup every test was its own unit, and a file's module-scoped
        # servers started on both workers. So the unit is written into the id here.
        group = item.nodeid.translate(str.maketrans("[]@", "()_")) if path in SPLIT_FILES else path
        group = next((name for name in MACHINE_WIDE_FIXTURES if name in getattr(item, "fixturenames", ())), group)
        item._id = NodeId.parse(f"{item.nodeid}@{group}")  # type: ignore[attr-defined]

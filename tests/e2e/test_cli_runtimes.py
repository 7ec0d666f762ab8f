"""Installing a catalog runtime from the command line against a real server: the build's progress until it ends,
``--no-wait``, ``--follow`` printing the log as it grows, a failed build exiting 1 with the end of its log, and
the same state and log through the API (``GET /runtimes/{name}``, ``GET /runtimes/{name}/log``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln.errors import NotFound
from tests.e2e.test_cli import base_env, kiln
from tests.kilnserver import KilnServer

CATALOG = """
- framework: bare
  version: "1"
  packages: []
  default: true
  description: a clean virtualenv
- framework: bare2
  version: "1"
  packages: []
- framework: broken
  version: "1"
  packages: ["kiln-test-no-such-package-anywhere==0.0.1"]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    """One server whose catalog holds a cheap runtime and one that cannot be built, in a runtimes dir of its own
    (nothing installed yet)."""
    root = tmp_path_factory.mktemp("runtimes-cli")
    (root / "catalog.yaml").write_text(CATALOG)
    started = KilnServer(
        root / "home", runtime_catalog=str(root / "catalog.yaml"), runtimes_dir=str(root / "runtimes")
    ).start()
    yield started
    started.stop()


@pytest.fixture
def env(server: KilnServer, tmp_path: Path) -> dict[str, str]:
    return {**base_env(tmp_path), **server.credentials(), "KILN_ENDPOINT": server.url}


@pytest.mark.timeout(360)  # the install 180 s, then two commands of 60 s at most
def test_install_shows_the_build_until_it_ends_and_the_api_has_its_state_and_log(server, env):
    client = server.client()
    with pytest.raises(NotFound, match="never built"):
        client.read_runtime_log("bare-1")
    assert client.runtime("bare").build is None and client.runtime("bare-1").status == "not-installed"

    result = kiln(env, "runtimes", "install", "bare", timeout=180)
    assert result.returncode == 0, result.stderr
    assert "runtime bare-1 is installed in" in result.stderr, result.stderr

    detail = client.runtime("bare-1")
    build = detail.build
    assert detail.status == "installed" and build is not None
    assert (build.state, build.phase) == ("succeeded", "done")
    assert build.finished_at is not None and build.finished_at >= build.started_at
    assert build.log_bytes > 0
    lines = list(client.runtime_log_lines("bare-1"))
    assert any("building runtime bare-1" in line for line in lines), lines
    assert any(" O runtime ok:" in line for line in lines), lines  # the smoke test of the new interpreter
    data, next_offset, ended = client.read_runtime_log("bare-1", offset=0)
    assert next_offset == len(data) == build.log_bytes and not ended
    assert client.read_runtime_log("bare-1", offset=next_offset) == (b"", next_offset, True)

    again = kiln(env, "runtimes", "install", "bare")
    assert again.returncode == 0 and "runtime bare-1 is installed" in again.stderr
    shown = kiln(env, "runtimes", "show", "bare-1")
    assert shown.returncode == 0 and f"build:         {build.id}: succeeded" in shown.stdout, shown.stdout


def test_no_wait_returns_at_once_and_follow_prints_the_log_as_it_grows(server, env):
    started = time.monotonic()
    result = kiln(env, "runtimes", "install", "bare2", "--no-wait")
    assert result.returncode == 0, result.stderr
    assert "building runtime bare2-1; follow it with: kiln runtimes log bare2-1 --follow" in result.stderr
    assert server.client().runtime("bare2").status in ("installing", "installed")
    followed = kiln(env, "runtimes", "log", "bare2-1", "--follow", timeout=180)
    assert time.monotonic() - started < 170
    assert followed.returncode == 0, followed.stderr
    assert "[kiln] building runtime bare2-1" in followed.stderr and "runtime ok:" in followed.stdout
    assert server.client().runtime("bare2-1").build.state == "succeeded"  # type: ignore[union-attr]


@pytest.mark.timeout(660)  # two failed installs of 300 s at most
def test_a_failed_build_exits_1_with_the_end_of_its_log(server, env):
    result = kiln(env, "runtimes", "install", "broken", timeout=300)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "error: runtime broken-1 failed to build: ERROR: " in result.stderr, result.stderr
    assert "lines of the build log (all of it: kiln runtimes log broken-1)" in result.stderr
    assert "kiln-test-no-such-package-anywhere" in result.stderr
    detail = server.client().runtime("broken-1")
    assert detail.status == "failed" and detail.build is not None and detail.build.phase == "failed"
    assert "kiln runtimes log broken-1" in (detail.message or "")
    listed = {r.name: r.status for r in server.client().runtimes()}
    assert listed["broken-1"] == "failed"

    followed = kiln(env, "runtimes", "install", "broken", "--follow", timeout=300)
    assert followed.returncode == 1
    assert "Could not find a version" in followed.stdout + followed.stderr  # pip's own lines, as they came
    assert "error: runtime broken-1 failed to build" in followed.stderr

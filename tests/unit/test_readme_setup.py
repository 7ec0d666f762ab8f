"""The README's quick start says what `make run` and `make test` install on the machine and what they use, as
the Makefile does it (a new user saw apt-get run with nothing in the README about it), and the Makefile says so
as it installs."""

from __future__ import annotations

import re

from tests.kilnserver import REPO

README = (REPO / "README.md").read_text()
MAKEFILE = (REPO / "Makefile").read_text()
QUICK_START = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]


def _target(name: str) -> str:
    match = re.search(rf"^{name}:.*?(?=^\S)", MAKEFILE, re.MULTILINE | re.DOTALL)
    assert match, f"no target {name} in the Makefile"
    return match.group(0)


def test_the_quick_start_names_every_system_package_make_installs():
    mount_packages = re.search(r"^MOUNT_PACKAGES := (.+)$", MAKEFILE, re.MULTILINE)
    assert mount_packages and "$(MOUNT_PACKAGES)" in _target("mount-tools")
    assert "mount-tools" in _target("test")
    assert f"apt-get install {mount_packages.group(1).strip()}" in QUICK_START
    sandbox_packages = re.search(r"^SANDBOX_PACKAGES := (.+)$", MAKEFILE, re.MULTILINE)
    assert sandbox_packages and "$(SANDBOX_PACKAGES)" in _target("sandbox-tools")
    assert "sandbox-tools" in _target("run") and "sandbox-tools" in _target("test")
    assert f"apt-get install {sandbox_packages.group(1).strip()}" in QUICK_START
    assert "uv pip install -e '.[dev]'" in QUICK_START.replace("-e\n", "-e ")
    assert "$(UV) -e '.[dev]'" in MAKEFILE and "UV := $(BIN)/uv pip install" in MAKEFILE
    assert "nodejs" in _target("node-tools") and "node-tools" in _target("test")
    assert "apt-get install nodejs" in QUICK_START


def test_the_quick_start_says_make_test_uses_postgresql_on_its_port():
    assert "127.0.0.1 -p 5432" in _target("services") and "services" in _target("test")
    assert "PostgreSQL on 127.0.0.1:5432" in QUICK_START


def test_the_makefile_says_what_it_installs_and_why():
    assert 'echo "installing $(MOUNT_PACKAGES) with apt-get (' in _target("mount-tools")
    assert 'echo "installing $(SANDBOX_PACKAGES) with apt-get (' in _target("sandbox-tools")
    assert 'echo "starting PostgreSQL on 127.0.0.1:5432' in _target("services")


def test_the_readme_links_the_api_docs_and_says_how_to_change_the_port():
    assert "/api/v1/docs" in README and "/openapi.json" in README
    assert "KILN_PORT=8081 make run" in QUICK_START and "kiln server --debug" in QUICK_START

"""What the test suite needs installed besides the Python packages of ``.[dev]``'s core, and how a missing one is
reported: as a FAILURE that says what to install, never as a quiet skip, unless whoever runs the tests opts out of
it by name: ``KILN_TEST_WITHOUT=postgresql,fuse make test``. The tests that need an opted-out component are then
skipped, each saying so, and the summary counts them.

A test asks for a component with the marker ``@pytest.mark.needs("fuse")`` (checked before it starts, in
``tests/conftest.py``) or, where the need shows only inside a fixture or a helper, with ``require("postgresql",
problem)``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil

import pytest

ENV = "KILN_TEST_WITHOUT"
OPTED_OUT = f"opted out: {ENV}="

# name → (what it is, how to get it)
COMPONENTS: dict[str, tuple[str, str]] = {
    "postgresql": (
        "PostgreSQL",
        "`make services` starts an installed one on 127.0.0.1:5432 (user postgres, or KILN_TEST_PG_URL); Debian: "
        "apt-get install postgresql",
    ),
    "fuse": (
        "FUSE (/dev/fuse) with rclone, s3fs and fusermount3",
        "`make mount-tools` installs the tools as root (Debian: apt-get install fuse3 rclone s3fs); a container needs "
        "--device /dev/fuse",
    ),
    "tensorboard": ("the tensorboard package", "pip install -e '.[dev]' (`make dev`)"),
    "kubernetes-validate": ("the kubernetes-validate package", "pip install -e '.[dev]' (`make dev`)"),
    "kubectl": ("kubectl (it renders the kustomize overlays, offline)", "https://kubernetes.io/docs/tasks/tools/"),
    "node": ("Node.js (node)", "`make node-tools` as root (Debian: apt-get install nodejs)"),
    "shell-tools": (
        "bash, curl, openssl and sha256sum",
        "Debian: apt-get install bash curl openssl coreutils",
    ),
    "chromium": (
        "Chromium (/usr/bin/chromium) with the playwright package (the web console's browser tests)",
        "`make browser-tools` as root (Debian: apt-get install chromium); playwright: pip install -e '.[dev]' "
        "(`make dev`; `playwright install` is not needed)",
    ),
    "slurm": (
        "Slurm and MUNGE (slurmctld, slurmd, the client tools, munged) with ip, nsenter and unshare, run as root "
        "(the two-node test cluster, tests/slurm_cluster.py)",
        "`make slurm-tools` as root (Debian: apt-get install slurmctld slurmd slurm-client munge)",
    ),
}


def opted_out() -> frozenset[str]:
    """The components named in $KILN_TEST_WITHOUT (comma- or space-separated)."""
    return frozenset(part for part in os.environ.get(ENV, "").replace(",", " ").split() if part)


def check_opt_outs() -> None:
    """A name that is no component is a usage error: a typo would otherwise opt out of nothing, silently."""
    unknown = sorted(opted_out() - set(COMPONENTS))
    if unknown:
        raise pytest.UsageError(f"{ENV}: unknown component(s) {', '.join(unknown)}; known: {', '.join(COMPONENTS)}")


def _missing_tools(*tools: str) -> str | None:
    missing = [tool for tool in tools if shutil.which(tool) is None]
    return f"{', '.join(missing)} not on PATH" if missing else None


def _missing_module(name: str) -> str | None:
    return None if importlib.util.find_spec(name) is not None else f"cannot import {name}"


@functools.cache
def missing(component: str) -> str | None:
    """None when ``component`` is there, else what is missing. PostgreSQL is checked by tests/conftest.py."""
    if component == "fuse":
        problems = [] if os.path.exists("/dev/fuse") else ["this kernel or container has no FUSE device (/dev/fuse)"]
        tools = _missing_tools("rclone", "s3fs", "fusermount3")
        return "; ".join(problems + ([tools] if tools else [])) or None
    if component == "tensorboard":
        return _missing_module("tensorboard")
    if component == "kubernetes-validate":
        return _missing_module("kubernetes_validate")
    if component == "kubectl":
        return _missing_tools("kubectl")
    if component == "node":
        return _missing_tools("node")
    if component == "shell-tools":
        return _missing_tools("bash", "curl", "openssl", "sha256sum")
    if component == "chromium":
        problems = [] if os.access("/usr/bin/chromium", os.X_OK) else ["no /usr/bin/chromium"]
        module = _missing_module("playwright")
        return "; ".join(problems + ([module] if module else [])) or None
    if component == "slurm":
        from tests.slurm_cluster import slurm_problem

        return slurm_problem()
    raise KeyError(f"no check for component {component!r} (known: {', '.join(COMPONENTS)})")


def require(component: str, problem: str | None = None) -> None:
    """Return when ``component`` is there (``problem`` is None, or its own check finds nothing missing); else skip
    the test when it is opted out, fail it otherwise, saying what to install and how to opt out."""
    what, how = COMPONENTS[component]
    if problem is None and component != "postgresql":
        problem = missing(component)
    if problem is None:
        return
    problem = " ".join(problem.split()).rstrip(".")  # psycopg's are several lines
    if component in opted_out():
        pytest.skip(f"{what}: {problem} ({OPTED_OUT}{component})")
    pytest.fail(
        f"{what} is missing: {problem}. Install it ({how}), or run without the tests that need it: {ENV}={component}",
        pytrace=False,
    )

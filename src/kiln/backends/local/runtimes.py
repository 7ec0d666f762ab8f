"""Managed virtualenvs for catalog runtimes on the local executor.

A runtime is built once, on first use, by the shim of the first job that needs it (so its pip output lands in
that job's log) or by ``kiln runtimes install``; a lock file makes concurrent builders wait for one another.
One built from packages other than its entry's (an upgrade changed the catalog, or the operator's catalog file
did) is out of date: the next build installs the entry's packages into it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from kiln.backends.local.python_policy import PythonPolicy, base_python
from kiln.domain.catalog import Catalog, CatalogEntry
from kiln.domain.spec import RuntimeSpec
from kiln.errors import RuntimeUnavailable

BUILD_ENV_PREFIXES = ("PIP_",)
BUILD_ENV = {"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy", "SSL_CERT_FILE"}


@dataclass(frozen=True)
class ResolvedRuntime:
    python: str  # interpreter the job's PATH and commands use
    bin_dir: str | None
    build: dict | None  # shim instructions when the venv must be built first
    label: str
    roots: tuple[str, ...] = ()  # what the job's sandbox shows of the machine for it (python_policy.py)


class RuntimeManager:
    def __init__(self, catalog: Catalog, root: Path) -> None:
        self.catalog = catalog
        self.root = root

    def venv_path(self, entry: CatalogEntry) -> Path:
        return self.root / entry.name

    def is_installed(self, entry: CatalogEntry) -> bool:
        """Built, and with the entry's packages: one built from another list (the catalog changed since) is not,
        and the next build brings it up to date (kiln.injob.shimprep)."""
        built = self.installed_packages(entry)
        return isinstance(built, dict) and built.get("packages", []) == list(entry.packages)

    def is_building(self, entry: CatalogEntry) -> bool:
        lock = Path(str(self.venv_path(entry)) + ".lock")
        if not lock.exists() or self.is_installed(entry):
            return False
        import fcntl

        with open(lock) as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fh, fcntl.LOCK_UN)
        return False

    def build_spec(self, entry: CatalogEntry) -> dict:
        return {
            "name": entry.name,
            "venv": str(self.venv_path(entry)),
            "base_python": base_python(),
            "packages": list(entry.packages),
            # The operator's pip set-up (index, proxy, certificates) applies to builds, never to the jobs.
            "env": {k: v for k, v in os.environ.items() if k.startswith(BUILD_ENV_PREFIXES) or k in BUILD_ENV},
        }

    def resolve(self, runtime: RuntimeSpec, policy: PythonPolicy) -> ResolvedRuntime:
        """The interpreter a job runs with: a catalog runtime's venv, or the ``runtime.python`` that ``policy``
        allows (RuntimeUnavailable naming the field otherwise)."""
        if runtime.image:
            raise RuntimeUnavailable(
                f"runtime.image {runtime.image!r}: the local executor runs no container images; "
                "use a framework or a python executable, or submit to a container backend"
            )
        if runtime.python:
            found = policy.resolve(runtime.python, [self.venv_path(e) for e in self.catalog.entries])
            return ResolvedRuntime(found.python, found.bin_dir, None, runtime.label, found.roots)
        entry = self.catalog.resolve(runtime.framework or "python", runtime.version)
        venv = self.venv_path(entry)
        build = None if self.is_installed(entry) else self.build_spec(entry)
        # Before its build, the venv is shown with the interpreter it will be made from.
        roots = policy.catalog_roots(str(venv), [build["base_python"]] if build else [])
        return ResolvedRuntime(
            python=str(venv / "bin" / "python"), bin_dir=str(venv / "bin"), build=build, label=entry.name, roots=roots
        )

    def installed_packages(self, entry: CatalogEntry) -> dict | None:
        marker = self.venv_path(entry) / ".kiln-ready"
        try:
            return json.loads(marker.read_text())  # type: ignore[no-any-return]
        except (OSError, ValueError):
            return None

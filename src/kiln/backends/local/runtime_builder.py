"""The local executor's :class:`~kiln.backends.capabilities.RuntimeBuilder`: catalog runtimes are virtualenvs on
this machine (:class:`RuntimeManager`), built through the API by a shim run (:class:`RuntimeBuilds`)."""

from __future__ import annotations

from pathlib import Path

from kiln.backends.capabilities import RuntimeBuilder
from kiln.backends.local.runtime_builds import RuntimeBuilds, read_whole_lines
from kiln.backends.local.runtimes import RuntimeManager
from kiln.domain.catalog import Catalog, CatalogEntry
from kiln.domain.runtime_builds import BuildInfo
from kiln.injob import shim as shim_module

SHIM_PATH = Path(shim_module.__file__).resolve()


class LocalRuntimeBuilder(RuntimeBuilder):
    """Builds runtimes on this machine. A mixin of :class:`~kiln.backends.local.executor.LocalBackend` (which
    sets ``runtimes`` and ``runtime_builds``), and usable on its own through :func:`host_runtime_builder`."""

    runtimes: RuntimeManager
    runtime_builds: RuntimeBuilds

    @property
    def runtime_catalog(self) -> Catalog:
        return self.runtimes.catalog

    def runtime_path(self, entry: CatalogEntry) -> Path:
        return self.runtimes.venv_path(entry)

    def runtime_installed(self, entry: CatalogEntry) -> bool:
        return self.runtimes.is_installed(entry)

    def runtime_building(self, entry: CatalogEntry) -> bool:
        return self.runtimes.is_building(entry)

    def latest_runtime_build(self, entry: CatalogEntry, lock_held: bool) -> BuildInfo | None:
        return self.runtime_builds.latest(entry, lock_held)

    def latest_runtime_build_id(self, entry: CatalogEntry) -> str | None:
        return self.runtime_builds.latest_id(entry)

    def read_runtime_build(self, entry: CatalogEntry, build_id: str) -> BuildInfo:
        return self.runtime_builds.read(entry, build_id, False)

    def read_runtime_build_log(self, entry: CatalogEntry, build_id: str, offset: int, limit: int) -> tuple[bytes, int]:
        return read_whole_lines(self.runtime_builds.log_path(entry, build_id), offset, limit)

    def start_runtime_build(self, entry: CatalogEntry) -> None:
        venv_python = str(self.runtimes.venv_path(entry) / "bin" / "python")
        self.runtime_builds.start(entry, self.runtimes.build_spec(entry), venv_python)


class HostRuntimeBuilder(LocalRuntimeBuilder):
    """Runtimes on the server's machine for a backend that builds none of its own (Kubernetes jobs run catalog
    images): ``kiln runtimes install`` builds them on the server's machine, as it always has."""

    def __init__(self, runtimes: RuntimeManager) -> None:
        self.runtimes = runtimes
        self.runtime_builds = RuntimeBuilds(runtimes.root, SHIM_PATH)


def host_runtime_builder(catalog: Catalog, root: Path) -> HostRuntimeBuilder:
    return HostRuntimeBuilder(RuntimeManager(catalog, root))

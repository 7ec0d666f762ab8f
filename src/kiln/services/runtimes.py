"""The runtime catalog as users see it, installing a runtime ahead of its first job, and how that build goes."""

from __future__ import annotations

from datetime import UTC, datetime

from kiln.backends.local.executor import SHIM_PATH
from kiln.backends.local.runtime_builds import BuildInfo, RuntimeBuilds, read_whole_lines
from kiln.backends.local.runtimes import RuntimeManager
from kiln.domain.catalog import CatalogEntry
from kiln.domain.runtime_builds import RuntimeBuildRead, RuntimeDetail
from kiln.domain.schemas import RuntimeRead
from kiln.errors import InvalidInput, NotFound
from kiln.services.identity import Principal

BY_A_JOB = "being built by the first job that uses it (its pip output is in that job's log)"


def _time(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


class RuntimeService:
    def __init__(self, manager: RuntimeManager) -> None:
        self.manager = manager
        self.builds = RuntimeBuilds(manager.root, SHIM_PATH)

    def _state(self, entry: CatalogEntry) -> tuple[str, BuildInfo | None, str | None]:
        """(status, latest API build, message) of ``entry``."""
        lock_held = self.manager.is_building(entry)
        build = self.builds.latest(entry, lock_held)
        if self.manager.is_installed(entry):
            return "installed", build, entry.description
        if build is not None and build.state == "running":
            return "installing", build, build.message or f"build {build.phase}"
        if lock_held:
            return "installing", build, BY_A_JOB
        if build is not None and build.state == "failed":
            return "failed", build, f"{build.message} (kiln runtimes log {entry.name})"
        return "not-installed", build, entry.description

    def _read(self, entry: CatalogEntry) -> RuntimeRead:
        status, _, message = self._state(entry)
        return RuntimeRead(
            name=entry.name,
            framework=entry.framework,
            version=entry.version,
            default=entry.default,
            packages=list(entry.packages),
            status=status,
            path=str(self.manager.venv_path(entry)) if status == "installed" else None,
            message=message,
        )

    def _detail(self, entry: CatalogEntry) -> RuntimeDetail:
        status, build, message = self._state(entry)
        return RuntimeDetail(
            name=entry.name,
            framework=entry.framework,
            version=entry.version,
            default=entry.default,
            packages=list(entry.packages),
            status=status,
            path=str(self.manager.venv_path(entry)) if status == "installed" else None,
            message=message,
            image=entry.image,
            description=entry.description,
            build=None
            if build is None
            else RuntimeBuildRead(
                id=build.id,
                state=build.state,
                phase=build.phase,
                message=build.message,
                started_at=_time(build.started_at),  # type: ignore[arg-type]
                finished_at=_time(build.finished_at),
                log_bytes=build.log_bytes,
            ),
        )

    def _entry(self, name: str) -> CatalogEntry:
        """The entry named ``name`` (``pytorch-2.13``), or a framework's default (``pytorch``)."""
        for entry in self.manager.catalog.entries:
            if entry.name == name:
                return entry
        try:
            return self.manager.catalog.resolve(name)
        except InvalidInput:
            known = ", ".join(e.name for e in self.manager.catalog.entries)
            raise NotFound(f"no runtime {name!r} in the catalog; known: {known}") from None

    def list(self, principal: Principal) -> list[RuntimeRead]:
        principal.require("runtimes:read")
        return [self._read(e) for e in self.manager.catalog.entries]

    def get(self, principal: Principal, name: str) -> RuntimeDetail:
        principal.require("runtimes:read")
        return self._detail(self._entry(name))

    def read_log(self, principal: Principal, name: str, offset: int, limit: int) -> tuple[bytes, int, bool]:
        """(whole lines of the latest API build's log from ``offset``, next offset, whether that build has ended)."""
        principal.require("runtimes:read")
        entry = self._entry(name)
        build_id = self.builds.latest_id(entry)
        if build_id is None:
            raise NotFound(
                f"runtime {entry.name} has no build log: it was never built with `kiln runtimes install` "
                "(a build by a job's first use logs into that job's log)"
            )
        ended = self.builds.read(entry, build_id, False).state != "running"
        data, next_offset = read_whole_lines(self.builds.log_path(entry, build_id), offset, limit)
        return data, next_offset, ended and not data

    def install(self, principal: Principal, framework: str, version: str | None) -> RuntimeDetail:
        """Build a runtime in the background with the same supervisor jobs use, then smoke-test it. A build a job
        started first is waited for (the runtime's lock), then tested."""
        principal.require("runtimes:install")
        entry = self.manager.catalog.resolve(framework, version)
        if not self.manager.is_installed(entry):
            venv_python = str(self.manager.venv_path(entry) / "bin" / "python")
            self.builds.start(entry, self.manager.build_spec(entry), venv_python)
        return self._detail(entry)

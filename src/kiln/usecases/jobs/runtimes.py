"""The runtime catalog as users see it, installing a runtime ahead of its first job, and how that build goes."""

from __future__ import annotations

from datetime import UTC, datetime

from kiln.backends.capabilities import RuntimeBuilder
from kiln.domain.catalog import CatalogEntry
from kiln.domain.notebooks import VARIANTS
from kiln.domain.runtime_builds import BuildInfo, RuntimeBuildRead, RuntimeDetail
from kiln.domain.schemas import RuntimeRead
from kiln.errors import InvalidInput, NotFound
from kiln.usecases.access.identity import Principal

BY_A_JOB = "being built by the first job that uses it (its pip output is in that job's log)"


def _time(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


class RuntimeService:
    def __init__(self, builder: RuntimeBuilder) -> None:
        self.builder = builder

    def _state(self, entry: CatalogEntry) -> tuple[str, BuildInfo | None, str | None]:
        """(status, latest API build, message) of ``entry``."""
        lock_held = self.builder.runtime_building(entry)
        build = self.builder.latest_runtime_build(entry, lock_held)
        if self.builder.runtime_installed(entry):
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
        return self._summary(entry, status, message)

    def _summary(self, entry: CatalogEntry, status: str, message: str | None) -> RuntimeRead:
        return RuntimeRead(
            name=entry.name,
            framework=entry.framework,
            version=entry.version,
            default=entry.default,
            packages=list(entry.packages),
            status=status,
            path=str(self.builder.runtime_path(entry)) if status == "installed" else None,
            message=message,
        )

    def _detail(self, entry: CatalogEntry) -> RuntimeDetail:
        """The summary of ``_read`` with the image, description and latest build: one reading of the state."""
        status, build, message = self._state(entry)
        return RuntimeDetail(
            **self._summary(entry, status, message).model_dump(),
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
        """The entry named ``name`` (``pytorch-2.13``), or a framework's default (``pytorch``); with ``+lab``
        (``pytorch-2.13+lab``), that entry with JupyterLab: a notebook's runtime (``+tensorboard``: a TensorBoard's)."""
        for suffix in VARIANTS:
            if name.endswith(suffix):
                base = self._entry(name.removesuffix(suffix))
                return self.builder.runtime_catalog.resolve(base.framework, base.version + suffix)
        for entry in self.builder.runtime_catalog.entries:
            if entry.name == name:
                return entry
        try:
            return self.builder.runtime_catalog.resolve(name)
        except InvalidInput:
            known = ", ".join(e.name for e in self.builder.runtime_catalog.entries)
            raise NotFound(f"no runtime {name!r} in the catalog; known: {known}") from None

    def list(self, principal: Principal) -> list[RuntimeRead]:
        principal.require("runtimes:read")
        return [self._read(e) for e in self.builder.runtime_catalog.entries]

    def get(self, principal: Principal, name: str) -> RuntimeDetail:
        principal.require("runtimes:read")
        return self._detail(self._entry(name))

    def read_log(self, principal: Principal, name: str, offset: int, limit: int) -> tuple[bytes, int, bool]:
        """(whole lines of the latest API build's log from ``offset``, next offset, whether that build has ended)."""
        principal.require("runtimes:read")
        entry = self._entry(name)
        build_id = self.builder.latest_runtime_build_id(entry)
        if build_id is None:
            raise NotFound(
                f"runtime {entry.name} has no build log: it was never built with `kiln runtimes install` "
                "(a build by a job's first use logs into that job's log)"
            )
        ended = self.builder.read_runtime_build(entry, build_id).state != "running"
        data, next_offset = self.builder.read_runtime_build_log(entry, build_id, offset, limit)
        return data, next_offset, ended and not data

    def install(self, principal: Principal, framework: str, version: str | None) -> RuntimeDetail:
        """Build a runtime in the background with the same supervisor jobs use, then smoke-test it. A build a job
        started first is waited for (the runtime's lock), then tested."""
        principal.require("runtimes:install")
        entry = self.builder.runtime_catalog.resolve(framework, version)
        if not self.builder.runtime_installed(entry):
            self.builder.start_runtime_build(entry)
        return self._detail(entry)

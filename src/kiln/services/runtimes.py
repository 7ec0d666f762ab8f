"""The runtime catalog as users see it, and installing a runtime ahead of its first job."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from kiln.backends.local.executor import SHIM_PATH
from kiln.backends.local.runtimes import RuntimeManager
from kiln.domain.schemas import RuntimeRead
from kiln.services.identity import Principal


class RuntimeService:
    def __init__(self, manager: RuntimeManager) -> None:
        self.manager = manager
        self._builds: dict[str, subprocess.Popen[bytes]] = {}

    def _read(self, entry) -> RuntimeRead:  # type: ignore[no-untyped-def]
        installed = self.manager.is_installed(entry)
        build = self._builds.get(entry.name)
        if installed:
            status = "installed"
        elif self.manager.is_building(entry) or (build is not None and build.poll() is None):
            status = "installing"
        elif build is not None and build.returncode is not None:
            status = "failed"
        else:
            status = "not-installed"
        return RuntimeRead(
            name=entry.name,
            framework=entry.framework,
            version=entry.version,
            default=entry.default,
            packages=list(entry.packages),
            status=status,
            path=str(self.manager.venv_path(entry)) if installed else None,
            message=self._failure(entry) if status == "failed" else entry.description,
        )

    def _failure(self, entry) -> str:  # type: ignore[no-untyped-def]
        log = self.manager.root / f"{entry.name}.install.log"
        try:
            lines = [line.split(" ", 2)[-1] for line in log.read_text(errors="replace").splitlines()]
        except OSError:
            return "the build failed; see the server log"
        errors = [line for line in lines if "failed" in line or "rror" in line]
        return f"{(errors or lines or ['the build failed'])[-1]} (log: {log})"

    def list(self, principal: Principal) -> list[RuntimeRead]:
        principal.require("runtimes:read")
        return [self._read(e) for e in self.manager.catalog.entries]

    def install(self, principal: Principal, framework: str, version: str | None) -> RuntimeRead:
        """Build a runtime in the background with the same supervisor jobs use, then smoke-test it."""
        principal.require("runtimes:install")
        entry = self.manager.catalog.resolve(framework, version)
        if self.manager.is_installed(entry) or self.manager.is_building(entry):
            return self._read(entry)
        build_dir = self.manager.root / ".builds" / f"{entry.name}-{int(time.time() * 1000)}"
        build_dir.mkdir(parents=True)
        venv_python = str(self.manager.venv_path(entry) / "bin" / "python")
        config = {
            "job_id": f"runtime-{entry.name}",
            "attempt": 1,
            "work_dir": str(build_dir / "work"),
            "code_archive": None,
            "log_path": str(self.manager.root / f"{entry.name}.install.log"),
            "env": {"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONUNBUFFERED": "1"},
            "prepare": None,
            "command": [venv_python, "-c", "import sys; print('runtime ok:', sys.version)"],
            "finish": None,
            "timeout": 3600,
            "memory_limit": None,
            "grace": 5,
            "notify_socket": None,
            "runtime_build": self.manager.build_spec(entry),
        }
        (build_dir / "shim.json").write_text(json.dumps(config))
        with open(build_dir / "shim.log", "ab") as out:
            self._builds[entry.name] = subprocess.Popen(
                [sys.executable, "-I", "-S", str(SHIM_PATH), str(build_dir)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        time.sleep(0.2)  # let the builder take its lock so the answer says "installing"
        return self._read(entry)

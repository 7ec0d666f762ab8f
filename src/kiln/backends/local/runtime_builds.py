"""Builds of catalog runtimes started through the API (``kiln runtimes install``), and what they left on disk.

Each build is a shim run in ``<runtimes>/.builds/<name>/<id>/`` (the id is its start time in milliseconds): the
shim builds the virtualenv under the runtime's lock, exactly as a job's first use would, then smoke-tests the
interpreter. The directory keeps ``install.log`` (the log, in the jobs' line format), the shim's ``status.json``
and ``exit.json``. Everything the API says about a build is read back from these files, so it survives a restart
of the server (the shim runs in its own session and outlives it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from kiln.domain.catalog import CatalogEntry
from kiln.domain.runtime_builds import (
    PHASE_DONE,
    PHASE_FAILED,
    PHASE_PACKAGES,
    PHASE_STARTING,
    PHASE_TESTING,
    PHASE_VENV,
    PHASE_WAITING,
    BuildInfo,
)
from kiln.injob.logline import parse_line

KEEP_BUILDS = 5  # per runtime: older build directories (and their logs) are removed when a new build starts
TAIL_BYTES = 256 * 1024  # how much of a log's end is read to find its phase and last line
SMOKE_TEST = "import sys; print('runtime ok:', sys.version)"


def read_whole_lines(path: Path, offset: int, limit: int) -> tuple[bytes, int]:
    """Whole lines of ``path`` from ``offset`` (at most ``limit`` bytes unless one line is longer); next offset."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return b"", offset
    try:
        if offset >= os.fstat(fd).st_size:  # nothing yet; and ext4 refuses to seek past 16 TiB
            return b"", offset
        os.lseek(fd, offset, os.SEEK_SET)
        data = os.read(fd, limit)
    finally:
        os.close(fd)
    cut = data.rfind(b"\n")
    if cut < 0:
        return (data, offset + len(data)) if data and len(data) >= limit else (b"", offset)
    return data[: cut + 1], offset + cut + 1


def _json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _alive(pid: object, build_dir: Path) -> bool:
    """Whether ``pid`` is still the shim of ``build_dir`` (a reused pid runs something else)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        return str(build_dir) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def _failure(lines: list[tuple[str, str]], outcome: dict[str, Any]) -> str:
    """What failed, in one line: pip's own ``ERROR:`` line where there is one, else the shim's outcome."""
    errors = [text for stream, text in lines if stream != "K" and text.startswith("ERROR:")]
    if errors:
        return errors[-1].strip()
    if outcome.get("message"):
        return str(outcome["message"])
    code = outcome.get("exit_code")
    if code not in (None, 0):
        return f"the smoke test of the new runtime exited {code}"
    return f"the build ended with {outcome.get('reason') or 'an error'}"


class RuntimeBuilds:
    """Start builds and read them back (one per runtime at a time; the runtime's lock serialises the rest)."""

    def __init__(self, root: Path, shim_path: Path) -> None:
        self.root = root
        self.shim_path = shim_path
        self._procs: dict[Path, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()

    def _dir(self, entry: CatalogEntry) -> Path:
        return self.root / ".builds" / entry.name

    def log_path(self, entry: CatalogEntry, build_id: str) -> Path:
        return self._dir(entry) / build_id / "install.log"

    def latest_id(self, entry: CatalogEntry) -> str | None:
        try:
            # shim.pid is written last: a build without one is still being started (or was never started).
            ids = [p.name for p in self._dir(entry).iterdir() if p.name.isdigit() and (p / "shim.pid").exists()]
        except OSError:
            return None
        return max(ids, key=int) if ids else None

    def latest(self, entry: CatalogEntry, lock_held: bool) -> BuildInfo | None:
        """The latest build of ``entry``; ``lock_held``: whether the runtime's lock is held (a build is on)."""
        build_id = self.latest_id(entry)
        return None if build_id is None else self.read(entry, build_id, lock_held)

    def read(self, entry: CatalogEntry, build_id: str, lock_held: bool) -> BuildInfo:
        build_dir = self._dir(entry) / build_id
        log = self.log_path(entry, build_id)
        try:
            size = log.stat().st_size
        except OSError:
            size = 0
        lines = self._tail(log, size)
        started = int(build_id) / 1000
        outcome = _json(build_dir / "exit.json")
        if outcome is not None:
            ok = outcome.get("exit_code") == 0 and outcome.get("reason") in (None, "", "Completed")
            finished = outcome.get("finished_at")
            return BuildInfo(
                build_id,
                "succeeded" if ok else "failed",
                PHASE_DONE if ok else PHASE_FAILED,
                f"runtime {entry.name} ready" if ok else _failure(lines, outcome),
                started,
                float(finished) if isinstance(finished, int | float) else None,
                size,
            )
        status = _json(build_dir / "status.json") or {}
        proc = self._procs.get(build_dir)
        pid = (_json(build_dir / "shim.pid") or {}).get("pid")
        running = proc.poll() is None if proc is not None else _alive(pid, build_dir)
        if not running:
            message = "the build stopped without a result (its process is gone: was the machine restarted?)"
            return BuildInfo(build_id, "failed", PHASE_FAILED, message, started, None, size)
        return BuildInfo(
            build_id, "running", self._phase(lines, status, lock_held), self._last(lines), started, None, size
        )

    @staticmethod
    def _tail(log: Path, size: int) -> list[tuple[str, str]]:
        """(stream, text) of the log's last lines; the first may be cut when the log is longer than TAIL_BYTES."""
        try:
            with open(log, "rb") as fh:
                fh.seek(max(0, size - TAIL_BYTES))
                data = fh.read(TAIL_BYTES)
        except OSError:
            return []
        return [parse_line(line)[1:] for line in data.decode(errors="replace").splitlines() if line]

    @staticmethod
    def _phase(lines: list[tuple[str, str]], status: dict[str, Any], lock_held: bool) -> str:
        if status.get("phase") == "running":
            return PHASE_TESTING
        starts = [i for i, (stream, text) in enumerate(lines) if stream == "K" and text.startswith("building runtime")]
        if starts:
            return PHASE_PACKAGES if any(stream != "K" for stream, _ in lines[starts[-1] + 1 :]) else PHASE_VENV
        if any(stream != "K" for stream, _ in lines):  # its start line has left the tail: pip is long at work
            return PHASE_PACKAGES
        return PHASE_WAITING if lock_held else PHASE_STARTING

    @staticmethod
    def _last(lines: list[tuple[str, str]]) -> str | None:
        return next((text.strip() for _, text in reversed(lines) if text.strip()), None)

    def start(self, entry: CatalogEntry, build: dict[str, Any], venv_python: str) -> str | None:
        """Start a build of ``entry`` (``build``: the shim's runtime_build instructions); its id. None when one
        started through the API is still running (the caller reads that one)."""
        with self._lock:
            current = self.latest_id(entry)
            if current is not None and self.read(entry, current, False).state == "running":
                return None
            build_id = str(max(int(time.time() * 1000), int(current or 0) + 1))
            build_dir = self._dir(entry) / build_id
            build_dir.mkdir(parents=True)
            config = {
                "job_id": f"runtime-{entry.name}",
                "attempt": 1,
                "work_dir": str(build_dir / "work"),
                "code_archive": None,
                "log_path": str(build_dir / "install.log"),
                "env": {"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONUNBUFFERED": "1"},
                "prepare": None,
                "command": [venv_python, "-c", SMOKE_TEST],
                "finish": None,
                "timeout": 3600,
                "memory_limit": None,
                "grace": 5,
                "notify_socket": None,
                "runtime_build": build,
            }
            (build_dir / "shim.json").write_text(json.dumps(config))
            with open(build_dir / "shim.log", "ab") as out:
                self._procs[build_dir] = subprocess.Popen(
                    [sys.executable, "-I", "-S", str(self.shim_path), str(build_dir)],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            (build_dir / "shim.pid").write_text(json.dumps({"pid": self._procs[build_dir].pid}))
            self._prune(entry, keep=build_id)
            return build_id

    def _prune(self, entry: CatalogEntry, keep: str) -> None:
        """Remove finished builds beyond the newest KEEP_BUILDS (never ``keep``, never one still running)."""
        try:
            ids = sorted((p.name for p in self._dir(entry).iterdir() if p.name.isdigit()), key=int, reverse=True)
        except OSError:
            return
        for old in ids[KEEP_BUILDS:]:
            build_dir = self._dir(entry) / old
            if old == keep or not (build_dir / "exit.json").exists():
                continue
            self._procs.pop(build_dir, None)
            shutil.rmtree(build_dir, ignore_errors=True)

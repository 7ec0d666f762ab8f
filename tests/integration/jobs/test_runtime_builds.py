"""Runtime builds started through the API are read back from their files: a server that restarts (a new
``RuntimeBuilds``) still knows a build's state, phase and log, and a build whose process died without a result
is failed, not forever "running"; one built from other packages than its entry's is brought up to date in place.
Real shims building a real virtualenv (package-less, or with a one-module wheel installed from its file)."""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import subprocess
import time
import zipfile
from pathlib import Path

from kiln.backends.local.executor import SHIM_PATH
from kiln.backends.local.runtime_builds import KEEP_BUILDS, RuntimeBuilds, read_whole_lines
from kiln.backends.local.runtimes import RuntimeManager
from kiln.domain.catalog import Catalog, CatalogEntry

BARE = CatalogEntry("bare", "1", (), "python:3.11-slim", default=True)


def _manager(tmp_path: Path) -> RuntimeManager:
    return RuntimeManager(Catalog([BARE]), tmp_path / "runtimes")


def _start(builds: RuntimeBuilds, manager: RuntimeManager) -> str:
    build_id = builds.start(BARE, manager.build_spec(BARE), str(manager.venv_path(BARE) / "bin" / "python"))
    assert build_id is not None
    return build_id


def _until_ended(builds: RuntimeBuilds, build_id: str, timeout: float = 120):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    phases = []
    while True:
        info = builds.read(BARE, build_id, False)
        phases.append(info.phase)
        if info.state != "running":
            return info, phases
        assert time.monotonic() < deadline, f"build still running after {timeout}s: {info}"
        time.sleep(0.05)


def test_a_build_is_read_back_after_a_restart(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    builds = RuntimeBuilds(manager.root, SHIM_PATH)
    build_id = _start(builds, manager)
    assert _start_again(builds, manager) is None  # one build at a time: the running one is the answer
    info, phases = _until_ended(builds, build_id)
    assert (info.state, info.phase, info.message) == ("succeeded", "done", "runtime bare-1 ready")
    assert manager.is_installed(BARE)
    assert set(phases) <= {"starting", "creating the virtualenv", "testing", "done"}, phases

    restarted = RuntimeBuilds(manager.root, SHIM_PATH)  # a new server process: nothing in memory
    again = restarted.latest(BARE, lock_held=False)
    assert again is not None and again == info
    assert info.finished_at is not None and info.finished_at > info.started_at
    data, offset = read_whole_lines(restarted.log_path(BARE, build_id), 0, 1 << 20)
    assert offset == info.log_bytes == len(data) and b" O runtime ok: " in data
    first, cut = read_whole_lines(restarted.log_path(BARE, build_id), 0, 10)
    assert len(first) == cut == 10 and not first.endswith(b"\n")  # a line longer than a page comes in pieces
    assert read_whole_lines(restarted.log_path(BARE, build_id), 1 << 62, 100) == (b"", 1 << 62)


def _start_again(builds: RuntimeBuilds, manager: RuntimeManager) -> str | None:
    return builds.start(BARE, manager.build_spec(BARE), str(manager.venv_path(BARE) / "bin" / "python"))


def test_a_build_whose_process_died_is_failed_and_the_next_one_builds(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    builds = RuntimeBuilds(manager.root, SHIM_PATH)
    build_id = _start(builds, manager)
    shim = builds._procs[builds._dir(BARE) / build_id]
    os.killpg(shim.pid, signal.SIGKILL)
    shim.wait(10)
    restarted = RuntimeBuilds(manager.root, SHIM_PATH)
    dead = restarted.latest(BARE, lock_held=False)
    assert dead is not None and (dead.state, dead.phase) == ("failed", "failed")
    assert dead.message is not None and "stopped without a result" in dead.message
    retry = _start(restarted, manager)
    assert retry != build_id
    info, _ = _until_ended(restarted, retry)
    assert info.state == "succeeded" and manager.is_installed(BARE)


def test_old_builds_are_pruned(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    builds = RuntimeBuilds(manager.root, SHIM_PATH)
    root = builds._dir(BARE)
    for n in range(KEEP_BUILDS + 3):  # finished builds of the past
        old = root / str(1000 + n)
        old.mkdir(parents=True)
        (old / "shim.json").write_text("{}")
        (old / "exit.json").write_text('{"exit_code": 0, "reason": "Completed", "finished_at": 2.0}')
    build_id = _start(builds, manager)
    kept = sorted((p.name for p in root.iterdir()), key=int)
    assert len(kept) == KEEP_BUILDS and kept[-1] == build_id
    _until_ended(builds, build_id)


def _wheel(directory: Path) -> Path:
    """A one-module wheel, which pip installs from its file without an index."""
    files = {
        "kilnprobe.py": b"ANSWER = 42\n",
        "kilnprobe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: kilnprobe\nVersion: 1.0\n",
        "kilnprobe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for name, data in files.items()
    )
    wheel = directory / "kilnprobe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr("kilnprobe-1.0.dist-info/RECORD", record + "kilnprobe-1.0.dist-info/RECORD,,\n")
    return wheel


def test_a_runtime_built_from_other_packages_is_updated_in_place(tmp_path: Path) -> None:
    """The catalog's sklearn and pytorch entries gained MLflow's client: a runtime built before is out of date, and
    its next build installs what the entry now lists into the same venv (running jobs keep their files)."""
    manager = _manager(tmp_path)
    builds = RuntimeBuilds(manager.root, SHIM_PATH)
    assert _until_ended(builds, _start(builds, manager))[0].state == "succeeded"
    venv = manager.venv_path(BARE)
    (venv / "kept").write_text("")  # the old venv's: updated, not made again
    changed = CatalogEntry("bare", "1", (str(_wheel(tmp_path)),), "python:3.11-slim", default=True)
    updated = RuntimeManager(Catalog([changed]), manager.root)
    assert not updated.is_installed(changed)  # not what the entry says now
    build_id = builds.start(changed, updated.build_spec(changed), str(venv / "bin" / "python"))
    assert build_id is not None
    info, _ = _until_ended(builds, build_id)
    assert info.state == "succeeded" and updated.is_installed(changed) and (venv / "kept").exists()
    data, _ = read_whole_lines(builds.log_path(changed, build_id), 0, 1 << 20)
    assert b"updating runtime bare-1" in data
    probe = [str(venv / "bin" / "python"), "-c", "import kilnprobe; print(kilnprobe.ANSWER)"]
    assert subprocess.run(probe, capture_output=True, text=True, check=True).stdout == "42\n"

"""The shim's side of ``mode: mount`` without a real mount (runtime/mount.py, runtime/stage.py): configs and
inputs are checked before any work; real mounts are in tests/integration/local/test_mount.py."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from kiln.injob import mount, stage
from kiln.injob.stage import StageError


def test_a_mount_config_is_checked(tmp_path: Path) -> None:
    for bad in (None, {}, {"source": {"kind": "local"}}):
        with pytest.raises(StageError, match="the executor gave no mount configuration"):
            mount.Mount(bad)
    with pytest.raises(StageError, match="unknown kind of store 'ftp'"):
        mount.Mount({"source": {"kind": "ftp"}, "dir": str(tmp_path)})


def test_mounted_files_need_no_source_staged_ones_do(tmp_path: Path) -> None:
    entry = {"path": "a.txt", "size": 1, "sha256": hashlib.sha256(b"a").hexdigest()}
    item = {"name": "d", "version": 1, "path": "/data/d", "env": "KILN_INPUT_D", "files": [entry]}
    assert stage.Input(dict(item, mode="mount")).files == [("a.txt", 1, entry["sha256"], "")]
    with pytest.raises(StageError, match=r"input d@1: file a\.txt: no source"):
        stage.Input(dict(item, mode="stage"))


def test_mounted_inputs_without_a_mount_config_fail_before_any_work(tmp_path: Path) -> None:
    entry = {"path": "a.txt", "size": 1, "sha256": hashlib.sha256(b"a").hexdigest()}
    item = {"name": "d", "version": 1, "path": "/data/d", "env": "KILN_INPUT_D", "mode": "mount", "files": [entry]}
    with pytest.raises(StageError, match="no mount configuration"):
        stage.stage_inputs([item], {"dir": str(tmp_path / "cache")}, str(tmp_path / "work"), log=print)
    assert not (tmp_path / "cache").exists() and stage._MOUNTS == {}

"""``metrics.watch`` in the shim: a watched metric's point is written at once and the server woken after it is
on disk; other points wait for their batch. Names match as the spec's include/exclude do (patterns, any case)."""

from __future__ import annotations

from pathlib import Path

from kiln.injob.extract import SdkFiles
from kiln.injob.spool import Spool, Watch


def _spool(path: Path, woken: list[int], watch: list[str]) -> Spool:
    def on_watched() -> None:
        woken.append(len(path.read_bytes()) if path.exists() else 0)  # what was on disk when it was called

    return Spool(str(path), "worker0", "log", flush_seconds=3600, watch=Watch(watch), on_watched=on_watched)


def test_a_watched_point_is_due_at_once_and_wakes_after_it_is_written(tmp_path: Path) -> None:
    woken: list[int] = []
    spool = _spool(tmp_path / "log-a1-worker0.jsonl", woken, ["val_*"])
    spool.add(1.0, 1, {"loss": 0.5})
    assert not spool.due()  # an unwatched point waits for its batch
    spool.add(1.0, 1, {"VAL_acc": 0.9})
    assert spool.due()
    spool.flush()
    assert woken and woken[0] > 0  # the point was on disk when the server was told
    assert b'"VAL_acc":0.9' in (tmp_path / "log-a1-worker0.jsonl").read_bytes()
    spool.add(2.0, 2, {"loss": 0.4})
    assert not spool.due()
    spool.flush()
    assert len(woken) == 1  # a batch without a watched point wakes nothing


def test_nothing_watched_nothing_woken(tmp_path: Path) -> None:
    woken: list[int] = []
    spool = _spool(tmp_path / "s.jsonl", woken, [])
    spool.add(1.0, 1, {"val_acc": 0.9})
    assert not spool.due()
    spool.flush()
    assert woken == []


def test_a_wake_up_that_fails_loses_no_point(tmp_path: Path) -> None:
    def broken() -> None:
        raise OSError("the server is away")

    spool = Spool(str(tmp_path / "s.jsonl"), "worker0", "log", watch=Watch(["acc"]), on_watched=broken)
    spool.add(1.0, 1, {"acc": 0.9})
    spool.flush()
    assert b'"acc":0.9' in (tmp_path / "s.jsonl").read_bytes()


def test_kiln_log_files_growing_are_noticed(tmp_path: Path) -> None:
    files = SdkFiles(str(tmp_path))
    assert not files.grew()
    (tmp_path / "log-a1-worker0.jsonl").write_text("x\n")
    assert not files.grew()  # the shim's own spool files are not kiln.log's
    sdk = tmp_path / "sdk-a1-worker0-12.jsonl"
    sdk.write_text('{"m": {"acc": 1}}\n')
    assert files.grew()
    assert not files.grew()
    with sdk.open("a") as fh:
        fh.write('{"m": {"acc": 2}}\n')
    assert files.grew()

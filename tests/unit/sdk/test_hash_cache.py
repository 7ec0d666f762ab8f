"""The client's hash cache: digests reused only for files that did not change, and never for racy ones."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from kiln.sdk import hash_cache
from kiln.sdk.hash_cache import HashCache, hash_cached
from kiln.sdk.local_files import FileDigests, hash_file


class Counting:
    def __init__(self) -> None:
        self.calls: list[tuple[Path, int | None]] = []

    def __call__(self, source: Path, part_size: int | None) -> FileDigests:
        self.calls.append((source, part_size))
        return hash_file(source, part_size)


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files written just before they are hashed count as settled (else a test would wait 2 s)."""
    monkeypatch.setattr(hash_cache, "RACY_SECONDS", 0)


def test_an_unchanged_file_is_not_read_again(tmp_path: Path, settled: None) -> None:
    f = tmp_path / "data.bin"
    f.write_bytes(os.urandom(300_000))
    cache = HashCache(tmp_path / "cache" / "hashes.sqlite")
    compute = Counting()
    first = hash_cached(cache, f, 100_000, compute)
    assert first.sha256 == hashlib.sha256(f.read_bytes()).hexdigest() and len(first.parts) == 3
    assert hash_cached(cache, f, 100_000, compute) == first
    assert hash_cached(cache, f, None, compute) == FileDigests(first.sha256)  # the SHA-256 alone
    assert len(compute.calls) == 1
    # Another process (a later put) finds it too.
    cache.close()
    again = HashCache(tmp_path / "cache" / "hashes.sqlite")
    assert hash_cached(again, f, 100_000, compute) == first and len(compute.calls) == 1
    # Another part size: the parts are computed again.
    assert len(hash_cached(again, f, 50_000, compute).parts) == 6 and len(compute.calls) == 2


@pytest.mark.parametrize("change", ["content", "same-size-content", "replaced", "touched"])
def test_any_change_to_the_file_means_it_is_read_again(tmp_path: Path, settled: None, change: str) -> None:
    f = tmp_path / "data.bin"
    f.write_bytes(b"a" * 1000)
    cache = HashCache(tmp_path / "hashes.sqlite")
    compute = Counting()
    hash_cached(cache, f, None, compute)
    if change == "content":
        f.write_bytes(b"b" * 999)
    elif change == "same-size-content":
        st = os.stat(f)
        f.write_bytes(b"b" * 1000)
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # even with the old modification time (ctime moves)
    elif change == "replaced":
        (tmp_path / "new.bin").write_bytes(b"a" * 1000)
        os.replace(tmp_path / "new.bin", f)  # another inode
    else:
        os.utime(f)
    digests = hash_cached(cache, f, None, compute)
    assert len(compute.calls) == 2
    assert digests.sha256 == hashlib.sha256(f.read_bytes()).hexdigest()


def test_a_file_modified_when_it_was_hashed_is_hashed_again(tmp_path: Path) -> None:
    """Its modification time is within RACY_SECONDS of the hashing: a second write in that instant could hide."""
    f = tmp_path / "data.bin"
    f.write_bytes(b"fresh")
    cache = HashCache(tmp_path / "hashes.sqlite")
    compute = Counting()
    hash_cached(cache, f, None, compute)
    hash_cached(cache, f, None, compute)
    assert len(compute.calls) == 2


def test_a_file_that_changes_while_it_is_hashed_is_not_remembered(tmp_path: Path, settled: None) -> None:
    f = tmp_path / "data.bin"
    f.write_bytes(b"one")
    cache = HashCache(tmp_path / "hashes.sqlite")

    def changing(source: Path, part_size: int | None) -> FileDigests:
        digests = hash_file(source, part_size)
        source.write_bytes(b"two, longer")
        return digests

    hash_cached(cache, f, None, changing)
    compute = Counting()
    assert hash_cached(cache, f, None, compute).sha256 == hashlib.sha256(b"two, longer").hexdigest()
    assert len(compute.calls) == 1


def test_a_cache_that_cannot_be_opened_only_costs_the_hashing(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache's directory would be")
    cache = HashCache(blocker / "hashes.sqlite")
    f = tmp_path / "data.bin"
    f.write_bytes(b"x")
    compute = Counting()
    assert hash_cached(cache, f, None, compute).sha256 == hashlib.sha256(b"x").hexdigest()
    assert hash_cached(cache, f, None, compute) and len(compute.calls) == 2

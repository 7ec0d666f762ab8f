"""Hashing a local file for an upload: its SHA-256 and its parts' digests in one read."""

from __future__ import annotations

import hashlib
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kiln.sdk.local_files import hash_file, part_digests, sha256_file

KiB = 1024


@pytest.mark.parametrize("size", [0, 1, 64 * KiB - 1, 64 * KiB, 5 * 64 * KiB + 17])
@pytest.mark.parametrize("threads", [0, 1, 3])
def test_the_part_digests_are_those_of_each_part_and_the_sha256_that_of_the_whole(
    tmp_path: Path, size: int, threads: int
) -> None:
    data = os.urandom(size)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    part = 64 * KiB
    if threads:
        with ThreadPoolExecutor(threads) as pool:
            digests = hash_file(path, part, pool)
    else:
        digests = hash_file(path, part)
    assert digests.sha256 == hashlib.sha256(data).hexdigest() == sha256_file(path)
    assert digests.part_size == part
    chunks = [data[i : i + part] for i in range(0, size, part)]
    assert digests.parts == tuple(
        (hashlib.md5(c).hexdigest(), format(zlib.crc32(c), "08x")) for c in chunks
    )  # in order, the last one shorter; none for an empty file


def test_without_a_part_size_only_the_sha256_is_computed(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"abc")
    digests = hash_file(path)
    assert (digests.sha256, digests.part_size, digests.parts) == (hashlib.sha256(b"abc").hexdigest(), None, ())
    assert part_digests(b"abc") == (hashlib.md5(b"abc").hexdigest(), "352441c2")  # CRC32 as S3 spells it

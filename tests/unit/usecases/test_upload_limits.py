"""What the upload and manifest code does with sizes and counts a client chose: work in proportion to what is
actually there, never to the number sent."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from kiln.domain import limits
from kiln.domain.datasets import DatasetFileEntry
from kiln.errors import BadRequest
from kiln.usecases.data.dataset_names import validate_manifest
from kiln.usecases.data.uploads import missing_parts, part_count

SHA = "0" * 64


def test_part_count() -> None:
    assert part_count(0, 16) == 1
    assert part_count(16, 16) == 1
    assert part_count(17, 16) == 2
    assert part_count(limits.MAX_FILE_BYTES, -(-limits.MAX_FILE_BYTES // limits.MAX_UPLOAD_PARTS)) == 10_000


def test_missing_parts_counts_and_lists_the_first_ones() -> None:
    assert missing_parts(5, {1, 2, 3, 4, 5}) == (0, [])
    assert missing_parts(5, {2, 4}) == (3, [1, 3, 5])
    assert missing_parts(5, {2, 4, 7, 0}) == (3, [1, 3, 5])  # numbers outside 1..parts do not count
    count, first = missing_parts(10_000, set(range(1, 10_001, 2)))
    assert count == 5000 and first[:3] == [2, 4, 6] and len(first) == 1000


def test_missing_parts_of_a_huge_part_count_allocates_nothing_in_proportion_to_it() -> None:
    """complete_upload of a session sized by the attacker's 2628206758546830848 bytes built a list of 156 billion
    part numbers; the count and the first 1,000 take as long and as much memory as for 1,000 parts."""
    parts = 2628206758546830848 // (16 * 1024 * 1024)
    tracemalloc.start()
    started = time.monotonic()
    count, first = missing_parts(parts, {1, 2, 3})
    elapsed = time.monotonic() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert count == parts - 3 and first == list(range(4, 1004))
    assert elapsed < 1 and peak < 1024 * 1024


def entries(*paths: str) -> list[DatasetFileEntry]:
    return [DatasetFileEntry(path=p, size=1, sha256=SHA) for p in paths]


@pytest.mark.parametrize(
    ("paths", "clash"),
    [(("a", "a/b"), "a"), (("x/y", "x/y/z", "x"), "x"), (("a-b", "a/c", "a"), "a"), (("d/e", "d/e/f/g"), "d/e")],
)
def test_a_path_that_is_also_a_directory_is_named(paths: tuple[str, ...], clash: str) -> None:
    with pytest.raises(BadRequest, match=f"file path '{clash}': is both a file and a directory"):
        validate_manifest(entries(*paths), 100)


def test_sibling_paths_sharing_a_prefix_are_not_a_clash() -> None:
    files = validate_manifest(entries("a-b", "a.c/d", "a/x", "ab"), 100)
    assert [f.path for f in files] == ["a-b", "a.c/d", "a/x", "ab"]


def test_deep_paths_take_time_in_proportion_to_their_length_not_its_square() -> None:
    """Every file 502 levels deep in its own tree: building every ancestor of every path took ~1.3 GB and
    minutes for a 16 MiB manifest; the check is one binary search per path."""
    deep = "/".join(["d"] * 500)
    files = entries(*(f"{i}/{deep}/f" for i in range(2000)))
    tracemalloc.start()
    started = time.monotonic()
    assert len(validate_manifest(files, 10_000)) == 2000
    elapsed = time.monotonic() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert elapsed < 5 and peak < 64 * 1024 * 1024

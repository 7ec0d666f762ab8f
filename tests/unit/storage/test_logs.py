"""Reading a job's log from any offset a client sends."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.domain import limits
from kiln.storage.logs import LogStore


@pytest.mark.parametrize("offset", [2**44, 2**62 - 1, limits.MAX_INT64])
def test_an_offset_past_the_end_reads_nothing_whatever_the_file_system_can_seek_to(tmp_path: Path, offset: int) -> None:
    """ext4 refuses to seek past 16 TiB (EINVAL): a GET .../logs?offset=4611686018427387903 was a 500."""
    logs = LogStore(tmp_path)
    logs.append("job-1", "O", ["hello"])
    assert logs.read("job-1", offset) == (b"", offset)


def test_reads_go_on_from_where_the_last_one_ended(tmp_path: Path) -> None:
    logs = LogStore(tmp_path)
    logs.append("job-1", "O", ["one", "two"])
    first, at = logs.read("job-1", 0)
    assert first.count(b"\n") == 2 and at == logs.size("job-1")
    assert logs.read("job-1", at) == (b"", at)
    logs.append("job-1", "E", ["three"])
    more, end = logs.read("job-1", at)
    assert more.endswith(b"three\n") and end == logs.size("job-1")

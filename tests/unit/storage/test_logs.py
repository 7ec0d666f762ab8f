"""Reading a job's log from any offset a client sends."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.domain import limits
from kiln.storage.logs import SEGMENT_BYTES, LogStore
from kiln.storage.store import ObjectStore


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


def test_a_log_shipped_by_one_server_reads_the_same_through_another_and_goes_on_there(tmp_path: Path) -> None:
    """Two servers' log stores on one object store: what the writer shipped reads byte for byte through the other
    at every offset (a small tail segment rewritten, big ones kept), an unended line only once the attempt is over,
    and a later attempt written by the other goes on after it (catch_up)."""
    store = ObjectStore(str(tmp_path / "store"))
    writer, reader = LogStore(tmp_path / "a", store), LogStore(tmp_path / "b", store)
    writer.append("job-1", "O", ["one"])
    assert writer.ship("org", "job-1") == writer.size("job-1")
    writer.append("job-1", "O", ["two"])
    writer.ship("org", "job-1")
    assert len(writer.segments("org", "job-1")) == 1  # the small segment was rewritten, not a second one added
    with open(writer.path("job-1"), "ab") as fh:  # a segment's worth, then a line still being written
        fh.write(b"x" * (SEGMENT_BYTES - 10) + b"\n" + b"partial")
    whole = writer.size("job-1") - len(b"partial")
    assert writer.ship("org", "job-1") == whole
    writer.append("job-1", "O", ["three"])  # ends the partial line
    writer.ship("org", "job-1")
    assert len(writer.segments("org", "job-1")) == 2
    log = writer.path("job-1").read_bytes()
    at, got = 0, b""
    while data := reader.read("job-1", at, 1000, org_id="org")[0]:
        got, at = got + data, at + len(data)
    assert got == log and not reader.path("job-1").exists()  # all of it from the store, nothing left here
    mid = reader.read("job-1", 4, org_id="org")[0]  # from mid-line: to a line's end
    assert log[4:].startswith(mid) and mid.endswith(b"\n")

    with open(writer.path("job-1"), "ab") as fh:
        fh.write(b"no newline")
    assert reader.read("job-1", len(log), org_id="org") == (b"", len(log))
    writer.ship("org", "job-1", final=True)  # the attempt ended: its last, unended line too
    assert reader.read("job-1", len(log), org_id="org")[0] == b"no newline"

    reader.catch_up("org", "job-1")  # attempt 2 starts on the other server
    reader.append_system("job-1", "restarting")
    reader.ship("org", "job-1")
    assert reader.path("job-1").read_bytes().startswith(writer.path("job-1").read_bytes())
    assert writer.read("job-1", writer.size("job-1"), org_id="org")[0].endswith(b"K restarting\n")

    reader.remove("org", "job-1")
    assert store.list("orgs/org/jobs/job-1/log") == [] and not reader.path("job-1").exists()

"""What the shim (root, outside the job's CPU limit) spends on a job's TensorBoard files is bounded: a crafted event
file of small scalar records, the costliest kind to decode, is read up to the budget and no further, and says so;
records too big to be scalars are skipped without being decoded or counted (records are framed by hand here, so
these tests need no tensorboard package)."""

from __future__ import annotations

import struct
from pathlib import Path

from kiln.injob import tbreader

MiB = 1024 * 1024


def record(data: bytes) -> bytes:
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", tbreader.masked_crc(header)) + data + struct.pack("<I", tbreader.masked_crc(data))


def scalar(tag: bytes, value: float, step: int) -> bytes:
    """An Event holding one simple_value (what torch's add_scalar writes)."""
    item = b"\x0a" + bytes([len(tag)]) + tag + b"\x15" + struct.pack("<f", value)
    summary = b"\x0a" + bytes([len(item)]) + item
    return b"\x09" + struct.pack("<d", 1000.0) + b"\x10" + bytes([step]) + b"\x2a" + bytes([len(summary)]) + summary


def test_a_crafted_event_file_is_read_up_to_the_budget_and_no_further(tmp_path: Path) -> None:
    one = record(scalar(b"loss", 0.5, 1))
    chunk = one * (MiB // len(one))
    path = tmp_path / "events.out.tfevents.1"
    with open(path, "wb") as fh:
        for _ in range(16):  # 16 MiB of the costliest records to decode
            fh.write(chunk)
    follower = tbreader.DirectoryFollower(str(tmp_path), max_bytes=MiB)
    points = sum(len(follower.poll()) for _ in range(20))
    # One file gets at most half the budget; a record counts at least MIN_RECORD_COST.
    assert follower.spent <= MiB // 2 and points == follower.spent // tbreader.MIN_RECORD_COST
    ((path_seen, problem),) = follower.problems()
    assert path_seen == str(path) and problem.startswith("stopped after 0.5 MiB of records")
    reader = follower.readers[str(path)]
    assert reader.offset < MiB  # the other 15 MiB were never read
    # A second file takes the other half, then nothing more is read at all, and the follower says so.
    (tmp_path / "run2").mkdir()
    (tmp_path / "run2" / "events.out.tfevents.2").write_bytes(chunk * 2)
    more = [p for _ in range(20) for p in follower.poll()]
    assert more and follower.spent <= MiB and {name for *_, name, _ in more} == {"run2/loss"}
    assert "the most a job reads" in follower.limit_note
    assert follower.poll() == []


def test_records_too_big_to_be_scalars_are_skipped_undecoded_and_uncounted(tmp_path: Path) -> None:
    data = b"\x10\x01" * MiB  # 2 MiB of tiny fields: costly to decode, and no scalar can be that big
    header = struct.pack("<Q", len(data))
    big = header + struct.pack("<I", tbreader.masked_crc(header)) + data + b"\0\0\0\0"  # its data's CRC unchecked
    path = tmp_path / "events.out.tfevents.1"
    path.write_bytes(big + record(scalar(b"acc", 0.25, 2)))
    follower = tbreader.DirectoryFollower(str(tmp_path), max_bytes=4096)
    assert follower.poll() == [(1000.0, 2, "acc", 0.25)]
    assert follower.spent == 2 * tbreader.MIN_RECORD_COST


def crowded(values: int, step: int) -> bytes:
    """An Event whose Summary holds ``values`` simple values (tag "a"): the crafted record that cost the shim 12 s
    of CPU and 406 MB at 60,000 values a record."""
    item = b"\x0a\x01a\x15" + struct.pack("<f", 0.5)
    one = b"\x0a" + bytes([len(item)]) + item
    summary = one * values
    length, size = b"", len(summary)
    while True:  # the summary's length as a varint
        length += bytes([(size & 0x7F) | (0x80 if size > 0x7F else 0)])
        size >>= 7
        if not size:
            break
    return b"\x09" + struct.pack("<d", 1000.0) + b"\x10" + bytes([step]) + b"\x2a" + length + summary


def test_a_crafted_record_of_many_values_is_decoded_up_to_the_cap_and_cpu_stops_at_its_budget(tmp_path: Path) -> None:
    one = record(crowded(60_000, 1))
    assert len(one) < tbreader.MAX_DECODED_RECORD  # decoded, not skipped for its size
    (tmp_path / "events.out.tfevents.1").write_bytes(one * 40)
    follower = tbreader.DirectoryFollower(str(tmp_path), max_bytes=1 << 40, max_cpu=0.3)
    points = [p for _ in range(40) for p in follower.poll()]
    # Each record gives at most MAX_VALUES_PER_EVENT points: the other 59,000 values are skipped undecoded.
    assert 0 < len(points) <= 40 * tbreader.MAX_VALUES_PER_EVENT
    reader = follower.readers[str(tmp_path / "events.out.tfevents.1")]
    # The CPU budget stops the decoding (a record's decoding may pass it: one record's worth over, no more).
    assert follower.cpu_spent < 0.3 + 0.5, follower.cpu_spent
    assert reader.offset < len(one) * 40, "all 40 records were decoded: the CPU budget stopped nothing"
    assert "s of CPU spent decoding them for metrics, the most a job spends" in follower.limit_note
    assert follower.poll() == []


def test_the_budget_spans_the_jobs_attempts(tmp_path: Path) -> None:
    one = record(scalar(b"loss", 0.5, 1))
    (tmp_path / "events.out.tfevents.1").write_bytes(one * (MiB // len(one)))
    state = str(tmp_path.parent / f"{tmp_path.name}-spent.json")
    first = tbreader.DirectoryFollower(str(tmp_path), max_bytes=MiB // 4, state=state)
    taken = sum(len(first.poll()) for _ in range(5))
    assert taken and first.spent <= MiB // 8  # one file: half of the budget
    # The next attempt reads the same file from its start; what the first spent counts against the same budget.
    second = tbreader.DirectoryFollower(str(tmp_path), max_bytes=MiB // 4, state=state)
    assert second.spent == first.spent and second.cpu_spent > 0
    again = sum(len(second.poll()) for _ in range(5))
    assert second.spent <= MiB // 4 and 0 < again <= taken
    third = tbreader.DirectoryFollower(str(tmp_path), max_bytes=MiB // 4, state=state)
    assert sum(len(third.poll()) for _ in range(5)) == 0  # the job's budget is spent: nothing, by any attempt
    assert "the most a job reads" in third.limit_note
    # CPU too: an attempt that finds the job's CPU spent decodes nothing.
    (tmp_path.parent / "cpu-spent.json").write_text('{"bytes": 0, "cpu": 5.0}')
    spent_cpu = tbreader.DirectoryFollower(
        str(tmp_path), max_bytes=MiB, max_cpu=5.0, state=str(tmp_path.parent / "cpu-spent.json")
    )
    assert spent_cpu.poll() == [] and "of CPU" in spent_cpu.limit_note

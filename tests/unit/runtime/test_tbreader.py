"""TensorBoard event files, read with the standard library only, checked against the tensorboard package."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from kiln.injob import tbreader

# Without tensorboard the module still loads, and every test fails (or, opted out, skips) saying what to install.
pytestmark = pytest.mark.needs("tensorboard")
try:
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    from tensorboard.summary.writer.record_writer import RecordWriter
except ImportError:
    pass


def simple(tag: str, value: float, step: int, wall_time: float) -> event_pb2.Event:
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
    return event_pb2.Event(wall_time=wall_time, step=step, summary=summary)


def tensor_event(
    tag: str, tensor: tensor_pb2.TensorProto, step: int, plugin: str | None = "scalars"
) -> event_pb2.Event:
    value = summary_pb2.Summary.Value(tag=tag, tensor=tensor)
    if plugin is not None:
        value.metadata.plugin_data.plugin_name = plugin
    return event_pb2.Event(wall_time=1000.0 + step, step=step, summary=summary_pb2.Summary(value=[value]))


def write(logdir: Path, events: list[event_pb2.Event]) -> Path:
    writer = EventFileWriter(str(logdir))
    for event in events:
        writer.add_event(event)
    writer.close()
    (path,) = logdir.glob("events.out.tfevents.*")
    return path


def test_simple_values_as_torch_add_scalar_writes_them(tmp_path: Path) -> None:
    write(
        tmp_path, [simple("loss", 0.5, 1, 1000.5), simple("loss", 0.1, 2, 1001.0), simple("train/acc", 0.75, 2, 1001.0)]
    )
    follower = tbreader.DirectoryFollower(str(tmp_path))
    assert follower.poll() == [(1000.5, 1, "loss", 0.5), (1001.0, 2, "loss", 0.1), (1001.0, 2, "train/acc", 0.75)]
    assert follower.poll() == []  # nothing new


def test_scalar_tensors_as_tf2_writes_them(tmp_path: Path) -> None:
    f32 = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[0.25])
    f64 = tensor_pb2.TensorProto(dtype=types_pb2.DT_DOUBLE, double_val=[1.5])
    content = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_content=struct.pack("<f", 2.5))
    i64 = tensor_pb2.TensorProto(dtype=types_pb2.DT_INT64, int64_val=[-7])
    shaped = tensor_pb2.TensorProto(
        dtype=types_pb2.DT_FLOAT,
        float_val=[3.0],
        tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)]),
    )
    histogram = tensor_pb2.TensorProto(
        dtype=types_pb2.DT_DOUBLE,
        double_val=[0, 1, 2, 1, 2, 3],
        tensor_shape=tensor_shape_pb2.TensorShapeProto(
            dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=2), tensor_shape_pb2.TensorShapeProto.Dim(size=3)]
        ),
    )
    text = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[b"hello"])
    write(
        tmp_path,
        [
            tensor_event("epoch_loss", f32, 1),
            tensor_event("epoch_loss", tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[0.125]), 2, None),
            tensor_event("d", f64, 1),
            tensor_event("c", content, 1),
            tensor_event("i", i64, 1),
            tensor_event("s", shaped, 1),
            tensor_event("h", histogram, 1, "histograms"),
            tensor_event("t", text, 1, "text"),
            # a tag declared by another plugin once, then without metadata: still skipped
            tensor_event("img", f32, 1, "images"),
            tensor_event("img", f32, 2, None),
        ],
    )
    got = [(step, tag, value) for _, step, tag, value in tbreader.DirectoryFollower(str(tmp_path)).poll()]
    assert got == [
        (1, "epoch_loss", 0.25),
        (2, "epoch_loss", 0.125),
        (1, "d", 1.5),
        (1, "c", 2.5),
        (1, "i", -7.0),
        (1, "s", 3.0),
    ]


def test_subdirectories_name_the_run(tmp_path: Path) -> None:
    write(tmp_path / "train", [simple("epoch_loss", 0.5, 0, 1.0)])
    write(tmp_path / "validation", [simple("epoch_loss", 0.6, 0, 1.0)])
    got = sorted(tag for _, _, tag, _ in tbreader.DirectoryFollower(str(tmp_path)).poll())
    assert got == ["train/epoch_loss", "validation/epoch_loss"]


def record(event: event_pb2.Event) -> bytes:
    data = event.SerializeToString()
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", tbreader.masked_crc(header)) + data + struct.pack("<I", tbreader.masked_crc(data))


def test_the_crc_matches_the_tensorboard_record_writer(tmp_path: Path) -> None:
    path = tmp_path / "events.out.tfevents.1"
    with open(path, "wb") as fh:
        RecordWriter(fh).write(simple("a", 1.0, 1, 2.0).SerializeToString())
    assert path.read_bytes() == record(simple("a", 1.0, 1, 2.0))


def test_a_growing_file_leaves_a_partial_record_for_the_next_poll(tmp_path: Path) -> None:
    path = tmp_path / "events.out.tfevents.123.host"
    first, second = record(simple("loss", 1.0, 1, 10.0)), record(simple("loss", 2.0, 2, 11.0))
    path.write_bytes(first + second[:5])
    follower = tbreader.DirectoryFollower(str(tmp_path))
    assert follower.poll() == [(10.0, 1, "loss", 1.0)]
    with open(path, "ab") as fh:
        fh.write(second[5:20])
    assert follower.poll() == []
    with open(path, "ab") as fh:
        fh.write(second[20:])
    assert follower.poll() == [(11.0, 2, "loss", 2.0)]


def test_corrupt_records(tmp_path: Path) -> None:
    path = tmp_path / "events.out.tfevents.1"
    good = [record(simple("x", float(i), i, 100.0 + i)) for i in range(4)]
    bad_data = bytearray(good[1])
    bad_data[-6] ^= 0xFF  # a byte of the data: its checksum fails, the record is skipped
    bad_length = bytearray(good[3])
    bad_length[8] ^= 0xFF  # the length's checksum fails: nothing after it can be framed
    path.write_bytes(good[0] + bytes(bad_data) + good[2] + bytes(bad_length) + good[0])
    follower = tbreader.DirectoryFollower(str(tmp_path))
    assert [step for _, step, _, _ in follower.poll()] == [0, 2]
    ((_, problem),) = follower.problems()
    assert "corrupt record length" in problem
    reader = follower.readers[str(path)]
    assert reader.corrupt == 1 and reader.broken
    assert follower.poll() == []


def test_garbage_is_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "events.out.tfevents.x").write_bytes(b"\xff" * 100)
    follower = tbreader.DirectoryFollower(str(tmp_path))
    assert follower.poll() == []
    assert follower.problems()
    assert tbreader.parse_event(b"") == (0.0, 0, [])
    with pytest.raises(tbreader.ParseError):
        tbreader.parse_event(b"\x0a\xff")

"""TensorBoard event files with images, written with the ``tensorboard`` package's own protos and record framing:
what torch's ``SummaryWriter.add_image`` writes (``Summary.Value.image``) and what TF2's ``tf.summary.image``
writes (a string tensor [width, height, png...] with the "images" plugin's metadata on the tag's first event)."""

from __future__ import annotations

import io
import time

from PIL import Image
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.plugins.image import metadata as image_metadata
from tensorboard.summary.writer.record_writer import RecordWriter


def png(width: int = 3, height: int = 2, color: tuple[int, int, int] = (255, 0, 0)) -> bytes:
    """A real PNG of one colour."""
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, format="PNG")
    return out.getvalue()


def file_version(wall_time: float = 1_800_000_000.0) -> event_pb2.Event:
    """The first event of every file an EventFileWriter writes."""
    return event_pb2.Event(wall_time=wall_time, file_version="brain.Event:2")


def image_event(tag: str, step: int, data: bytes, width: int, height: int, wall_time: float = 0.0) -> event_pb2.Event:
    """torch's add_image: Summary.Value.image."""
    image = summary_pb2.Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=data)
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, image=image)])
    return event_pb2.Event(wall_time=wall_time or time.time(), step=step, summary=summary)


def tf2_image_event(
    tag: str, step: int, images: list[bytes], width: int, height: int, first: bool, wall_time: float = 0.0
) -> event_pb2.Event:
    """TF2's tf.summary.image: a DT_STRING tensor [width, height, image...]; the plugin's metadata on the tag's
    first event only (as TF writes it)."""
    strings = [str(width).encode(), str(height).encode(), *images]
    shape = tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=len(strings))])
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, tensor_shape=shape, string_val=strings)
    value = summary_pb2.Summary.Value(tag=tag, tensor=tensor)
    if first:
        value.metadata.CopyFrom(image_metadata.create_summary_metadata(display_name=tag, description=""))
    return event_pb2.Event(wall_time=wall_time or time.time(), step=step, summary=summary_pb2.Summary(value=[value]))


def scalar_event(tag: str, step: int, value: float) -> event_pb2.Event:
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
    return event_pb2.Event(wall_time=time.time(), step=step, summary=summary)


def event_file(events: list[event_pb2.Event]) -> tuple[bytes, list[int]]:
    """The events framed as TFRecords, as an event file holds them, and each record's byte offset."""
    out = io.BytesIO()
    writer = RecordWriter(out)
    offsets = []
    for event in events:
        offsets.append(out.tell())
        writer.write(event.SerializeToString())
    return out.getvalue(), offsets

"""The images in TensorBoard event files (kiln.metrics.tbimages): real files written by the ``tensorboard`` package's
EventFileWriter, in both forms (torch's Summary.Value.image and TF2's image tensor), their listing and the bytes
of one image; and files that are corrupt, cut short, too big or hold records that are no image."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
from tensorboard.plugins.text import metadata as text_metadata
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.summary.writer.record_writer import RecordWriter

from kiln.metrics import tbimages
from kiln.metrics.tbimages import NoImage, list_images, media_type, read_image
from tests.tensorboard_events import event_file, file_version, image_event, png, scalar_event, tf2_image_event

RED, GREEN, BLUE = png(3, 2, (255, 0, 0)), png(3, 2, (0, 255, 0)), png(5, 4, (0, 0, 255))


def _write(tmp_path: Path, events: list[event_pb2.Event]) -> bytes:
    """The events written by TensorBoard's own EventFileWriter (its file_version record first)."""
    writer = EventFileWriter(str(tmp_path))
    for event in events:
        writer.add_event(event)
    writer.close()
    (path,) = tmp_path.glob("events.out.tfevents.*")
    return path.read_bytes()


def _listed(data: bytes, **kw: int) -> tbimages.ImageListing:
    return list_images(io.BytesIO(data), **kw)


def test_both_forms_are_listed_with_their_step_and_served_byte_for_byte(tmp_path: Path) -> None:
    data = _write(
        tmp_path,
        [
            image_event("samples/torch", 0, RED, 3, 2, wall_time=1_800_000_000.5),
            scalar_event("loss", 0, 0.5),
            image_event("samples/torch", 10, GREEN, 3, 2),
            tf2_image_event("samples/tf", 1, [RED, BLUE], 3, 2, first=True),
            scalar_event("loss", 1, 0.25),
            tf2_image_event("samples/tf", 2, [GREEN], 3, 2, first=False),  # no metadata: known from the first
        ],
    )
    listing = _listed(data)
    assert not listing.truncated and listing.note == "" and listing.read == len(data)
    got = [(i.tag, i.step, i.index, i.width, i.height, i.media_type) for i in listing.images]
    assert got == [
        ("samples/torch", 0, 0, 3, 2, "image/png"),
        ("samples/torch", 10, 0, 3, 2, "image/png"),
        ("samples/tf", 1, 0, 3, 2, "image/png"),
        ("samples/tf", 1, 1, 3, 2, "image/png"),
        ("samples/tf", 2, 0, 3, 2, "image/png"),
    ]
    assert listing.images[0].wall_time == 1_800_000_000.5
    assert [i.size for i in listing.images] == [len(RED), len(GREEN), len(RED), len(BLUE), len(GREEN)]
    two = listing.images[2:4]
    assert two[0].offset == two[1].offset  # one record, two images
    for entry, expected in zip(listing.images, [RED, GREEN, RED, BLUE, GREEN], strict=True):
        assert read_image(io.BytesIO(data), entry.offset, entry.index) == (expected, "image/png")
    # The bytes are a real PNG of the colour written.
    served, _ = read_image(io.BytesIO(data), two[1].offset, 1)
    assert Image.open(io.BytesIO(served)).getpixel((0, 0)) == (0, 0, 255)


def test_a_record_that_is_no_image_is_refused_by_offset(tmp_path: Path) -> None:
    events = [image_event("img", 1, RED, 3, 2), scalar_event("loss", 1, 0.5)]
    data, offsets = event_file([file_version(), *events])
    image_at, scalar_at = offsets[1], offsets[2]
    assert read_image(io.BytesIO(data), image_at, 0) == (RED, "image/png")
    for offset, index, says in (
        (scalar_at, 0, "holds no image"),
        (offsets[0], 0, "holds no image"),  # the file_version record
        (image_at + 1, 0, "no record starts at byte"),  # inside a record
        (image_at, 1, "holds 1 image"),
        (len(data), 0, "no record at byte"),
        (10**15, 0, "no record at byte"),
    ):
        with pytest.raises(NoImage, match=says):
            read_image(io.BytesIO(data), offset, index)


def test_only_png_jpeg_gif_and_webp_are_served() -> None:
    kinds = {}
    for fmt in ("JPEG", "GIF", "WEBP", "BMP"):
        out = io.BytesIO()
        Image.new("RGB", (4, 3), (9, 9, 9)).save(out, format=fmt)
        kinds[fmt] = media_type(out.getvalue())
    assert kinds == {"JPEG": "image/jpeg", "GIF": "image/gif", "WEBP": "image/webp", "BMP": None}
    data, offsets = event_file([image_event("html", 1, b"<script>alert(1)</script>", 1, 1)])
    (entry,) = _listed(data).images
    assert entry.media_type is None and entry.size == 25
    with pytest.raises(NoImage, match="not a PNG, JPEG, GIF or WebP"):
        read_image(io.BytesIO(data), offsets[0], 0)


def test_dimensions_come_from_the_image_when_the_summary_omits_them() -> None:
    data, _ = event_file([image_event("img", 1, BLUE, 0, 0)])
    (entry,) = _listed(data).images
    assert (entry.width, entry.height) == (5, 4)


def test_other_string_tensors_are_not_images() -> None:
    text = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[b"3", b"2", RED])
    first = summary_pb2.Summary.Value(tag="notes", tensor=text)
    first.metadata.CopyFrom(text_metadata.create_summary_metadata(display_name="notes", description=""))
    later = summary_pb2.Summary.Value(tag="notes", tensor=text)
    events = [event_pb2.Event(step=s, summary=summary_pb2.Summary(value=[v])) for s, v in ((1, first), (2, later))]
    data, _ = event_file(events)
    assert _listed(data).images == []


def test_a_corrupt_length_ends_the_listing_and_a_corrupt_image_is_not_served() -> None:
    data, offsets = event_file(
        [file_version(), image_event("img", 1, RED, 3, 2), image_event("img", 2, GREEN, 3, 2), scalar_event("x", 3, 1)]
    )
    # The second image's length field damaged: the first image is listed, the rest of the file is skipped.
    broken = bytearray(data)
    broken[offsets[2] + 3] ^= 0xFF
    listing = _listed(bytes(broken))
    assert [i.step for i in listing.images] == [1]
    assert f"corrupt record length at byte {offsets[2]}" in listing.note
    # A byte of the first image's data damaged: still listed (a listing does not checksum data), never served.
    damaged = bytearray(data)
    damaged[offsets[2] - 10] ^= 0xFF
    assert [i.step for i in _listed(bytes(damaged)).images] == [1, 2]
    with pytest.raises(NoImage, match="fails its checksum"):
        read_image(io.BytesIO(bytes(damaged)), offsets[1], 0)
    # A record whose data is no protobuf: skipped, and said.
    garbage, _ = event_file([image_event("img", 1, RED, 3, 2)])
    junk = io.BytesIO()
    RecordWriter(junk).write(b"\x2a\x42\xff\xff")  # a summary key and a length that runs past the end
    listing = _listed(junk.getvalue() + garbage)
    assert [i.step for i in listing.images] == [1] and "1 record(s) could not be decoded" in listing.note


def test_a_file_cut_short_lists_its_whole_records() -> None:
    data, offsets = event_file([image_event("img", 1, RED, 3, 2), image_event("img", 2, GREEN, 3, 2)])
    cut = data[: offsets[1] + 20]  # the second record still being written
    listing = _listed(cut)
    assert [i.step for i in listing.images] == [1] and not listing.truncated and listing.note == ""
    with pytest.raises(NoImage, match="not whole"):
        read_image(io.BytesIO(cut), offsets[1], 0)


def test_the_work_is_bounded_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    data, offsets = event_file([image_event("img", step, RED, 3, 2) for step in range(5)])
    by_bytes = _listed(data, max_bytes=offsets[3])
    assert [i.step for i in by_bytes.images] == [0, 1, 2] and by_bytes.truncated and "MiB" in by_bytes.note
    by_count = _listed(data, max_images=2)
    assert [i.step for i in by_count.images] == [0, 1] and by_count.truncated and "first 2 images" in by_count.note
    # A record too big to be an image is stepped over unread.
    big = image_event("big", 9, b"\x89PNG\r\n\x1a\n" + b"\0" * 1000, 1, 1)
    data, offsets = event_file([big, image_event("img", 10, RED, 3, 2)])
    monkeypatch.setattr(tbimages, "MAX_IMAGE_RECORD", 500)
    assert [i.step for i in _listed(data).images] == [10]
    monkeypatch.setattr(tbimages, "CHUNK", 16)  # read a few bytes at a time: the big record is seeked past
    assert [(i.step, i.offset) for i in _listed(data).images] == [(10, offsets[1])]
    with pytest.raises(NoImage, match="too big to be an image"):
        read_image(io.BytesIO(data), offsets[0], 0)

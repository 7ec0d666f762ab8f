"""The images in a TensorBoard event file: where each is (the record's byte offset, its place in the record), its
tag and step, and its bytes when asked for one.

Framing and protobuf decoding are kiln.injob.tbreader's (the scalar reader the shim runs). Images come in two
forms:

    Summary.Value.image (field 4)  Image {height=1, width=2, colorspace=3, encoded_image_string=4}
                                   what torch's ``SummaryWriter.add_image`` (and TF1) writes
    Summary.Value.tensor (field 8) a DT_STRING TensorProto whose string_val (field 8) is
                                   [width, height, image, image...]: TF2's ``tf.summary.image``, its tag declared
                                   by the "images" plugin's metadata on the tag's first event in the file

An image is served only when its bytes start like a PNG, JPEG, GIF or WebP (``media_type``); listed ones that do
not carry ``media_type`` None.

Bounded: a file is read up to ``max_bytes`` (``MAX_FILE_BYTES``) and for at most ``max_images`` images; a listing
that stopped short says so (``truncated``, ``note``). Records over ``MAX_IMAGE_RECORD`` are skipped unread (no
image is that big). Record lengths are checked against their checksum (cached, cheap); a listing does not
checksum records' data (crc32c in pure Python is about 7 MB/s), one image's fetch does, up to ``MAX_CHECKED``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import IO

from kiln.injob.tbreader import MAX_RECORD, ParseError, _f64, _header_crc, _signed64, fields, masked_crc

MAX_FILE_BYTES = 256 * 1024 * 1024  # the most of one event file a listing reads
MAX_IMAGES = 10_000  # the most images one listing gives
MAX_IMAGE_RECORD = 64 * 1024 * 1024  # bigger records are skipped unread: no image summary is that big
MAX_CHECKED = 4 * 1024 * 1024  # a fetched record's data is checksummed up to this size
CHUNK = 4 * 1024 * 1024  # what is read from the file at a time
DT_STRING = 7
IMAGES_PLUGIN = "images"

_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)
MEDIA_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")


def media_type(data: bytes | memoryview) -> str | None:
    """The image type its first bytes say (PNG, JPEG, GIF, WebP); None for anything else."""
    head = bytes(data[:16])
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            return kind
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return None


def _dimensions(data: memoryview, kind: str | None) -> tuple[int, int]:
    """(width, height) from a PNG's or GIF's header, where the summary did not say."""
    if kind == "image/png" and len(data) >= 24:
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if kind == "image/gif" and len(data) >= 10:
        return int.from_bytes(data[6:8], "little"), int.from_bytes(data[8:10], "little")
    return 0, 0


@dataclass(frozen=True)
class FoundImage:
    tag: str
    width: int
    height: int
    data: memoryview


@dataclass(frozen=True)
class ImageEntry:
    tag: str
    step: int
    wall_time: float
    offset: int  # the byte offset of the record (its length field) in the file
    index: int  # which image of the record
    width: int
    height: int
    size: int
    media_type: str | None


@dataclass
class ImageListing:
    images: list[ImageEntry] = field(default_factory=list)
    truncated: bool = False  # stopped before the end of the file (``note`` says why)
    note: str = ""  # why it stopped short, or what was skipped
    read: int = 0  # bytes of the file gone through


def _decimal(value: memoryview) -> int | None:
    text = bytes(value)
    return int(text) if 0 < len(text) <= 9 and text.isdigit() else None


def _tensor_images(buf: memoryview, lenient: bool) -> tuple[int, int, list[memoryview]] | None:
    """(width, height, images) of an image tensor: DT_STRING, [width, height, image...]. ``lenient``: the tag's
    plugin is not known here (a fetch by offset): the two dimensions must be decimal."""
    dtype = 0
    strings: list[memoryview] = []
    for number, _wire, value in fields(buf):
        if number == 1 and isinstance(value, int):
            dtype = value
        elif number == 8 and isinstance(value, memoryview):
            strings.append(value)
    if dtype != DT_STRING or len(strings) < 2:
        return None
    width, height = _decimal(strings[0]), _decimal(strings[1])
    if lenient and (width is None or height is None):
        return None
    return width or 0, height or 0, strings[2:]


def record_images(
    data: memoryview | bytes, plugins: dict[str, str] | None = None, lenient: bool = False
) -> tuple[float, int, list[FoundImage]]:
    """(wall_time, step, images) of one serialized Event. ``plugins`` (tag → plugin, kept across one file's
    events) tells a TF2 image tensor without metadata from other tensors; ``lenient`` takes a string tensor of
    an unknown tag whose first two strings are numbers for one (a fetch, which sees one record only)."""
    plugins = {} if plugins is None else plugins
    wall_time, step = 0.0, 0
    found: list[FoundImage] = []
    for number, _wire, value in fields(memoryview(data)):
        if number == 1 and isinstance(value, int):
            wall_time = _f64(value)
        elif number == 2 and isinstance(value, int):
            step = _signed64(value)
        elif number == 5 and isinstance(value, memoryview):
            for n, _, item in fields(value):
                if n == 1 and isinstance(item, memoryview):
                    found.extend(_value_images(item, plugins, lenient))
    return wall_time, step, found


def _value_images(buf: memoryview, plugins: dict[str, str], lenient: bool) -> list[FoundImage]:
    tag = ""
    image: memoryview | None = None
    tensor: memoryview | None = None
    plugin: str | None = None
    for number, _wire, value in fields(buf):
        if number == 1 and isinstance(value, memoryview):
            tag = bytes(value).decode("utf-8", "replace")
        elif number == 4 and isinstance(value, memoryview):
            image = value
        elif number == 8 and isinstance(value, memoryview):
            tensor = value
        elif number == 9 and isinstance(value, memoryview):
            plugin = ""
            for n, _, item in fields(value):
                if n == 1 and isinstance(item, memoryview):
                    for pn, _, pv in fields(item):
                        if pn == 1 and isinstance(pv, memoryview):
                            plugin = bytes(pv).decode("utf-8", "replace")
    if plugin is not None:
        plugins[tag] = plugin
    if image is not None:
        width = height = 0
        encoded = memoryview(b"")
        for number, _wire, value in fields(image):
            if number == 1 and isinstance(value, int):
                height = value
            elif number == 2 and isinstance(value, int):
                width = value
            elif number == 4 and isinstance(value, memoryview):
                encoded = value
        return [FoundImage(tag, width, height, encoded)]
    if tensor is not None:
        known = plugins.get(tag)
        if known == IMAGES_PLUGIN or (known is None and lenient):
            shaped = _tensor_images(tensor, lenient=known is None)
            if shaped is not None:
                width, height, images = shaped
                return [FoundImage(tag, width, height, encoded) for encoded in images]
    return []


def _entry(image: FoundImage, step: int, wall_time: float, offset: int, index: int) -> ImageEntry:
    kind = media_type(image.data)
    width, height = image.width, image.height
    if not (width and height):
        width, height = _dimensions(image.data, kind)
    return ImageEntry(image.tag, step, wall_time, offset, index, width, height, len(image.data), kind)


class _Reader:
    """A file read forward in chunks, from ``offset``, never past ``limit``."""

    def __init__(self, fh: IO[bytes], limit: int) -> None:
        self.fh = fh
        self.limit = limit
        self.buf = b""
        self.base = 0  # the file offset of buf[0]
        self.pos = 0  # the current place in buf

    @property
    def offset(self) -> int:
        return self.base + self.pos

    def take(self, n: int) -> memoryview | None:
        """The next ``n`` bytes, or None where the file (or the limit) ends before them."""
        if len(self.buf) - self.pos < n:
            have = len(self.buf) - self.pos
            want = min(max(CHUNK, n - have), self.limit - (self.base + len(self.buf)))
            more = self.fh.read(want) if want > 0 else b""
            self.buf = self.buf[self.pos :] + more
            self.base += self.pos
            self.pos = 0
            if len(self.buf) < n:
                return None
        view = memoryview(self.buf)[self.pos : self.pos + n]
        self.pos += n
        return view

    def skip_to(self, offset: int) -> None:
        if offset <= self.base + len(self.buf):
            self.pos = offset - self.base
            return
        self.fh.seek(offset)
        self.buf, self.base, self.pos = b"", offset, 0


def list_images(
    fh: IO[bytes], size: int | None = None, max_bytes: int = MAX_FILE_BYTES, max_images: int = MAX_IMAGES
) -> ImageListing:
    """Every image in an event file read from its start: ``size`` is the file's (None: found by seeking)."""
    if size is None:
        size = fh.seek(0, 2)
    fh.seek(0)
    limit = min(size, max_bytes)
    out = ImageListing()
    reader = _Reader(fh, limit)
    plugins: dict[str, str] = {}
    undecoded = 0
    while True:
        offset = reader.offset
        header = reader.take(12)
        if header is None:
            if limit < size and offset + 12 <= size:
                out.truncated = True
                out.note = f"only the first {max_bytes / 1048576:g} MiB of the file were read"
            break  # the end (a last record still being written is left for the next listing)
        length = int.from_bytes(header[:8], "little")
        if int.from_bytes(header[8:12], "little") != _header_crc(bytes(header[:8])) or length > MAX_RECORD:
            out.note = f"corrupt record length at byte {offset}; the rest of the file is skipped"
            break
        end = offset + 12 + length + 4
        if end > limit:
            if end <= size:
                out.truncated = True
                out.note = f"only the first {max_bytes / 1048576:g} MiB of the file were read"
            break
        if length > MAX_IMAGE_RECORD:
            reader.skip_to(end)
            continue
        record = reader.take(length + 4)
        if record is None:
            break
        body = record[:length].tobytes()
        if b"\x22" not in body and b"\x42" not in body:
            continue  # no Value.image (field 4) nor tensor (field 8) key anywhere: no image (a scalar, mostly)
        try:
            wall_time, step, images = record_images(body, plugins)
        except ParseError:
            undecoded += 1
            continue
        for index, image in enumerate(images):
            if len(out.images) >= max_images:
                out.truncated = True
                out.note = f"only the first {max_images} images of the file are listed"
                break
            out.images.append(_entry(image, step, wall_time, offset, index))
        if out.truncated:
            break
    out.read = reader.offset
    if undecoded and not out.note:
        out.note = f"{undecoded} record(s) could not be decoded and were skipped"
    return out


class NoImage(ValueError):
    """There is no image to serve where one was asked for (the message says why)."""


def read_image(fh: IO[bytes], offset: int, index: int, size: int | None = None) -> tuple[bytes, str]:
    """(bytes, media type) of image ``index`` of the record at byte ``offset``: the record must start there (its
    length's checksum holds), be whole, pass its data checksum (up to ``MAX_CHECKED``), hold that image, and the
    image be a PNG, JPEG, GIF or WebP. Raises NoImage otherwise."""
    if size is None:
        size = fh.seek(0, 2)
    if offset < 0 or index < 0:
        raise NoImage("offset and index are at least 0")
    if offset + 12 > size:
        raise NoImage(f"no record at byte {offset}: the file has {size} bytes")
    fh.seek(offset)
    header = fh.read(12)
    length = int.from_bytes(header[:8], "little")
    if len(header) < 12 or int.from_bytes(header[8:12], "little") != _header_crc(header[:8]) or length > MAX_RECORD:
        raise NoImage(f"no record starts at byte {offset}")
    if length > MAX_IMAGE_RECORD:
        raise NoImage(f"the record at byte {offset} is too big to be an image ({length} bytes)")
    if offset + 12 + length + 4 > size:
        raise NoImage(f"the record at byte {offset} is not whole (still being written?)")
    data = fh.read(length + 4)
    if len(data) < length + 4:
        raise NoImage(f"the record at byte {offset} is not whole (still being written?)")
    record = memoryview(data)[:length]
    if length <= MAX_CHECKED and masked_crc(record) != int.from_bytes(data[length:], "little"):
        raise NoImage(f"the record at byte {offset} fails its checksum")
    try:
        _, _, images = record_images(record, lenient=True)
    except ParseError as exc:
        raise NoImage(f"the record at byte {offset} is not an event: {exc}") from None
    if not images:
        raise NoImage(f"the record at byte {offset} holds no image")
    if index >= len(images):
        raise NoImage(f"the record at byte {offset} holds {len(images)} image(s): there is no image {index}")
    encoded = images[index].data
    kind = media_type(encoded)
    if kind is None:
        raise NoImage(f"image {index} of the record at byte {offset} is not a PNG, JPEG, GIF or WebP image")
    return bytes(encoded), kind

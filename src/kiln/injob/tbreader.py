"""Scalars out of TensorBoard event files, with the standard library only (the shim runs without packages).

An event file is a sequence of TFRecords: ``uint64 length, uint32 masked crc32c(length), data,
uint32 masked crc32c(data)`` (little-endian). Each record's data is a protobuf ``Event``:

    Event        wall_time=1 double, step=2 int64, summary=5 Summary
    Summary      value=1 repeated Value
    Value        tag=1 string, simple_value=2 float, metadata=9 SummaryMetadata, tensor=8 TensorProto
    SummaryMetadata  plugin_data=1 {plugin_name=1 string}, data_class=4 enum
    TensorProto  dtype=1, tensor_shape=2 {dim=2 repeated {size=1}}, tensor_content=4 bytes,
                 float_val=5, double_val=6, int_val=7, int64_val=10, half_val=13

``simple_value`` is what ``torch.utils.tensorboard.SummaryWriter.add_scalar`` writes; TF2's
``tf.summary.scalar`` writes a scalar tensor (with the "scalars" plugin's metadata on a tag's first event only).
Everything else (images, histograms, text, graphs) is skipped without being decoded.

A record still being written at the end of a growing file is left for the next read. A record whose data
fails its checksum is skipped; a length that fails its checksum ends the file (nothing after it can be framed).
Data checksums are computed only for records that give scalars: crc32c in pure Python is slow, and big records
(images) are skipped anyway.

The shim reads a job's files as root, outside the job's CPU limit, so what it decodes is bounded: records over
``MAX_DECODED_RECORD`` are skipped without being decoded (a scalar event is a few dozen bytes), an event's first
``MAX_VALUES_PER_EVENT`` summary values are decoded and the rest skipped (a crafted record held 60,000), a packed
numeric field longer than one value is no scalar and is not unpacked, and one read returns at most
``MAX_POINTS_PER_READ`` points (the rest waits for the next): what a read holds in memory is bounded by
construction. A ``DirectoryFollower`` given ``max_bytes`` stops reading once its files' records add up to it (each
file at most half of it; ``record_cost``: small records count ``MIN_RECORD_COST``), given ``max_cpu`` once its
thread has spent that many CPU seconds (``time.thread_time``) decoding, and says so. Given ``state`` (a file the
job cannot write: in its job directory, root's), both are spent per job, not per attempt: what was spent is
written there after each poll and read back by the next attempt's follower, which reads the same files again from
their start (a job restarts up to 100 times). Pure-Python decoding costs up to about half a second of CPU per MiB
of crafted records.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
import time
from collections.abc import Iterator

MAX_RECORD = 256 * 1024 * 1024
MAX_DECODED_RECORD = 1024 * 1024  # bigger records (images, graphs, audio) are skipped without being decoded
MIN_RECORD_COST = 64  # what the smallest record counts against a budget (its framing costs as much)
MAX_FILES = 1000  # event files followed under one directory
MAX_SCAN_ENTRIES = 20_000  # directory entries one scan looks at
MAX_VALUES_PER_EVENT = 1000  # summary values decoded of one event (a model logs dozens); the rest are skipped
MAX_PACKED_SCALAR = 16  # bytes of a packed numeric field of a scalar tensor (one value); longer: no scalar
MAX_POINTS_PER_READ = 50_000  # points one read returns (and holds): the rest waits for the next read
DEFAULT_CPU_SECONDS = 30.0  # CPU a job's files may cost the shim in all, when its config names no other
_CRC_TABLE: list[int] = []
_HEADER_CRCS: dict[bytes, int] = {}  # a file's records mostly share a few lengths: their header checksums, cached


def crc32c(data: bytes | memoryview) -> int:
    table = _CRC_TABLE
    if not table:
        for n in range(256):
            c = n
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            table.append(c)
    crc = 0xFFFFFFFF
    for b in bytes(data):
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes | memoryview) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _header_crc(header: bytes) -> int:
    crc = _HEADER_CRCS.get(header)
    if crc is None:
        if len(_HEADER_CRCS) >= 4096:
            _HEADER_CRCS.clear()
        crc = _HEADER_CRCS[header] = masked_crc(header)
    return crc


def record_cost(length: int) -> int:
    """What a record of ``length`` data bytes counts against a reading budget: its framing and data when it is
    decoded, at least ``MIN_RECORD_COST``; only that when it is too big to be."""
    if length > MAX_DECODED_RECORD:
        return MIN_RECORD_COST
    return max(MIN_RECORD_COST, length + 16)


# -- protobuf wire format -------------------------------------------------------------------------------------


class ParseError(ValueError):
    pass


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ParseError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def fields(buf: memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value) of a message: ints for varints and fixed fields (raw bits), views for
    length-delimited ones."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        value: int | memoryview
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            if pos + 8 > end:
                raise ParseError("truncated fixed64")
            value = int.from_bytes(buf[pos : pos + 8], "little")
            pos += 8
        elif wire == 2:
            length, pos = _varint(buf, pos)
            if pos + length > end:
                raise ParseError("truncated field")
            value = buf[pos : pos + length]
            pos += length
        elif wire == 5:
            if pos + 4 > end:
                raise ParseError("truncated fixed32")
            value = int.from_bytes(buf[pos : pos + 4], "little")
            pos += 4
        else:
            raise ParseError(f"unsupported wire type {wire}")
        yield number, wire, value


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _f32(bits: int) -> float:
    value: float = struct.unpack("<f", bits.to_bytes(4, "little"))[0]
    if not math.isfinite(value):
        return value
    for digits in (6, 7, 8, 9):  # the shortest decimal that is the same float32: 0.1, not 0.10000000149
        short = float(f"{value:.{digits}g}")
        if struct.pack("<f", short) == struct.pack("<f", value):
            return short
    return value


def _f64(bits: int) -> float:
    value: float = struct.unpack("<d", bits.to_bytes(8, "little"))[0]
    return value


DT_FLOAT, DT_DOUBLE, DT_INT32, DT_UINT8, DT_INT16, DT_INT8, DT_INT64, DT_BOOL, DT_HALF = 1, 2, 3, 4, 5, 6, 9, 10, 19
_CONTENT_FORMATS = {
    DT_FLOAT: "<f",
    DT_DOUBLE: "<d",
    DT_INT32: "<i",
    DT_UINT8: "<B",
    DT_INT16: "<h",
    DT_INT8: "<b",
    DT_INT64: "<q",
    DT_BOOL: "<?",
    DT_HALF: "<e",
}


def _packed(value: int | memoryview, wire: int, kind: str) -> list[int]:
    """The raw values of a repeated numeric field, packed or not."""
    if isinstance(value, int):
        return [value]
    out: list[int] = []
    if kind == "varint":
        pos = 0
        while pos < len(value):
            item, pos = _varint(value, pos)
            out.append(item)
    else:
        size = 4 if kind == "fixed32" else 8
        for pos in range(0, len(value) - size + 1, size):
            out.append(int.from_bytes(value[pos : pos + size], "little"))
    return out


def tensor_scalar(buf: memoryview) -> float | None:
    """The value of a numeric TensorProto with one element; None for anything else."""
    dtype = 0
    dims: list[int] = []
    content: memoryview | None = None
    floats: list[int] = []
    doubles: list[int] = []
    ints: list[int] = []
    int64s: list[int] = []
    halves: list[int] = []
    for number, wire, value in fields(buf):
        if number == 1 and isinstance(value, int):
            dtype = value
        elif number == 2 and isinstance(value, memoryview):
            for n, _, dim in fields(value):
                if n == 2 and isinstance(dim, memoryview):
                    size = 1
                    for dn, _, dv in fields(dim):
                        if dn == 1 and isinstance(dv, int):
                            size = _signed64(dv)
                    dims.append(size)
                elif n == 3:
                    return None  # unknown rank
        elif number == 4 and isinstance(value, memoryview):
            content = value
        elif number in (5, 6, 7, 10, 13) and isinstance(value, memoryview) and len(value) > MAX_PACKED_SCALAR:
            return None  # more than one value: no scalar, and not unpacked (a crafted one held thousands)
        elif number == 5:
            floats += _packed(value, wire, "fixed32")
        elif number == 6:
            doubles += _packed(value, wire, "fixed64")
        elif number == 7:
            ints += _packed(value, wire, "varint")
        elif number == 10:
            int64s += _packed(value, wire, "varint")
        elif number == 13:
            halves += _packed(value, wire, "varint")
    if any(size != 1 for size in dims) or dtype not in _CONTENT_FORMATS:
        return None
    if content is not None and len(content):
        fmt = _CONTENT_FORMATS[dtype]
        if len(content) != struct.calcsize(fmt):
            return None
        raw = struct.unpack(fmt, bytes(content))[0]
        return _f32(int.from_bytes(bytes(content), "little")) if dtype == DT_FLOAT else float(raw)
    if dtype == DT_FLOAT and len(floats) == 1:
        return _f32(floats[0])
    if dtype == DT_DOUBLE and len(doubles) == 1:
        return _f64(doubles[0])
    if dtype in (DT_INT32, DT_INT16, DT_INT8, DT_UINT8, DT_BOOL) and len(ints) == 1:
        value32 = ints[0] & 0xFFFFFFFF
        return float(value32 - (1 << 32) if value32 >= 1 << 31 else value32)
    if dtype == DT_INT64 and len(int64s) == 1:
        return float(_signed64(int64s[0]))
    if dtype == DT_HALF and len(halves) == 1:
        return float(struct.unpack("<e", (halves[0] & 0xFFFF).to_bytes(2, "little"))[0])
    return None


def parse_event(
    data: memoryview | bytes, plugins: dict[str, str] | None = None
) -> tuple[float, int, list[tuple[str, float]]]:
    """(wall_time, step, [(tag, value)]) of one serialized Event; only scalar summary values.

    ``plugins`` (tag → plugin name, kept across the events of one file) lets a tensor value whose tag was
    declared by another plugin (a histogram, say) be skipped even when its event carries no metadata.
    """
    plugins = {} if plugins is None else plugins
    wall_time, step = 0.0, 0
    scalars: list[tuple[str, float]] = []
    buf = memoryview(data)
    for number, _wire, value in fields(buf):
        if number == 1 and isinstance(value, int):
            wall_time = _f64(value)
        elif number == 2 and isinstance(value, int):
            step = _signed64(value)
        elif number == 5 and isinstance(value, memoryview):
            seen = 0
            for n, _, item in fields(value):
                if n == 1 and isinstance(item, memoryview):
                    seen += 1
                    if seen > MAX_VALUES_PER_EVENT:
                        break  # the rest of a crafted summary is skipped, undecoded
                    scalar = _summary_value(item, plugins)
                    if scalar is not None:
                        scalars.append(scalar)
    return wall_time, step, scalars


def _summary_value(buf: memoryview, plugins: dict[str, str]) -> tuple[str, float] | None:
    tag = ""
    simple: float | None = None
    tensor: memoryview | None = None
    plugin: str | None = None
    data_class = 0
    for number, _wire, value in fields(buf):
        if number == 1 and isinstance(value, memoryview):
            tag = bytes(value).decode("utf-8", "replace")
        elif number == 2 and isinstance(value, int):
            simple = _f32(value)
        elif number == 8 and isinstance(value, memoryview):
            tensor = value
        elif number == 9 and isinstance(value, memoryview):
            plugin = ""
            for n, _, item in fields(value):
                if n == 1 and isinstance(item, memoryview):
                    for pn, _, pv in fields(item):
                        if pn == 1 and isinstance(pv, memoryview):
                            plugin = bytes(pv).decode("utf-8", "replace")
                elif n == 4 and isinstance(item, int):
                    data_class = item
    if plugin is not None:
        plugins[tag] = plugin if data_class in (0, 1) else f"{plugin}#{data_class}"
    if not tag:
        return None
    if simple is not None:
        return tag, simple
    if tensor is not None and plugins.get(tag, "scalars") in ("scalars", ""):
        scalar = tensor_scalar(tensor)
        if scalar is not None:
            return tag, scalar
    return None


# -- files ----------------------------------------------------------------------------------------------------


def open_beneath(root: str, path: str) -> int:
    """A read-only fd of the regular file ``path`` under ``root``, opened one component at a time without
    following a link: the job owns the directory and could swap any part of the path for a link to files it
    must not read, which the shim (root, outside the sandbox) would otherwise read for it. Raises OSError."""
    rel = os.path.relpath(path, root)
    parts = rel.split(os.sep)
    if rel.startswith("..") or os.path.isabs(rel):
        raise OSError(f"{path} is not under {root}")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        leaf = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(leaf).st_mode):  # a FIFO or device would block or never end
        os.close(leaf)
        raise OSError(f"{path} is not a regular file")
    return leaf


class EventFileReader:
    """Follows one growing event file: each ``read()`` returns the scalars of the records completed since."""

    def __init__(self, path: str, root: str | None = None, max_bytes: float = math.inf) -> None:
        self.path = path
        self.root = root or os.path.dirname(path)
        self.offset = 0
        self.plugins: dict[str, str] = {}
        self.broken = ""  # why the file cannot be read further (a length failed its checksum)
        self.corrupt = 0  # records skipped because their data failed its checksum
        self.problem = ""  # the latest problem, for one event per file
        self.limit = max_bytes  # the most this file's records may cost in all (``record_cost``)
        self.spent = 0  # what they cost so far

    def read(
        self, max_bytes: int = 16 * 1024 * 1024, allowance: float = math.inf, cpu_until: float = math.inf
    ) -> list[tuple[float, int, str, float]]:
        """The scalars of the records completed since the last read, from at most ``max_bytes`` of the file,
        taking at most ``allowance`` of the budget (``record_cost`` each; ``spent`` adds up), stopping before a
        record once this thread's CPU time (``time.thread_time``) passes ``cpu_until`` or the read holds
        ``MAX_POINTS_PER_READ`` points (the rest is read next time)."""
        out: list[tuple[float, int, str, float]] = []
        if self.broken:
            return out
        allowance = min(allowance, self.limit - self.spent)
        if allowance < MIN_RECORD_COST:
            if self.spent >= self.limit - MIN_RECORD_COST and not self.problem.startswith("stopped"):
                self.problem = (
                    f"stopped after {self.spent / 1048576:.1f} MiB of records, the most one file is read for "
                    "metrics; the rest is skipped"
                )
            return out
        try:
            with os.fdopen(open_beneath(self.root, self.path), "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(max_bytes)
                size = os.fstat(fh.fileno()).st_size
        except OSError:
            return out
        view = memoryview(data)
        pos = spent = 0
        while len(view) - pos >= 12:
            if len(out) >= MAX_POINTS_PER_READ or time.thread_time() > cpu_until:
                break
            header = view[pos : pos + 8]
            length = int.from_bytes(header, "little")
            if int.from_bytes(view[pos + 8 : pos + 12], "little") != _header_crc(bytes(header)) or length > MAX_RECORD:
                self.broken = self.problem = f"corrupt record length at byte {self.offset + pos}; the rest is skipped"
                break
            cost = record_cost(length)
            if spent + cost > allowance:
                break  # the budget is spent: the rest waits (for ever, unless the budget grows)
            end = pos + 12 + length + 4
            if length > MAX_DECODED_RECORD:
                # Skipped without being decoded (it cannot be a scalar), once it is all written.
                if end <= len(view) or size >= self.offset + end:
                    pos = end
                    spent += cost
                    continue
                break
            if end > len(view):
                break  # still being written, or beyond this read: the next read gets it
            spent += cost
            record = view[pos + 12 : pos + 12 + length]
            crc = int.from_bytes(view[pos + 12 + length : end], "little")
            pos = end
            try:
                wall_time, step, scalars = parse_event(record, self.plugins)
            except ParseError:
                scalars, wall_time, step = [], 0.0, 0
                if masked_crc(record) != crc:
                    self._corrupt()
                continue
            if scalars:
                if masked_crc(record) != crc:
                    self._corrupt()
                    continue
                out.extend((wall_time, step, tag, value) for tag, value in scalars)
        self.offset += pos
        self.spent += spent
        return out

    def _corrupt(self) -> None:
        self.corrupt += 1
        self.problem = f"{self.corrupt} record(s) failed their checksum and were skipped"


class DirectoryFollower:
    """Every ``events.out.tfevents.*`` file under a directory (recursively), read as it grows. Scalars from a
    file in a subdirectory are named ``<subdir>/<tag>`` (as TensorBoard shows runs): Keras writes ``train/`` and
    ``validation/`` with the same tags.

    ``max_bytes``: what all the files' records may cost in all (``record_cost``), each file at most half of it;
    ``max_cpu``: the CPU seconds its polls may take in all. Once either is spent nothing more is read and
    ``limit_note`` says so. ``state``: where what was spent is kept across attempts (see the module's doc)."""

    def __init__(
        self, root: str, max_bytes: float | None = None, max_cpu: float | None = None, state: str | None = None
    ) -> None:
        self.root = root
        self.readers: dict[str, EventFileReader] = {}
        self.last_scan = 0.0
        self.reported: dict[str, str] = {}
        self.max_bytes = math.inf if max_bytes is None else max_bytes
        self.max_cpu = math.inf if max_cpu is None else max_cpu
        self.limit_note = ""  # why the files are no longer (all) read
        self.state = state
        self.earlier_bytes, self.earlier_cpu = _load_spent(state)  # by this job's earlier attempts
        self.cpu = 0.0  # CPU seconds this follower's polls took
        self._saved = (0, 0.0)

    @property
    def spent(self) -> int:
        """What the job's records cost so far: this attempt's reads and the earlier attempts'."""
        return self.earlier_bytes + sum(reader.spent for reader in self.readers.values())

    @property
    def cpu_spent(self) -> float:
        return self.earlier_cpu + self.cpu

    def scan(self) -> None:
        seen = 0
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames.sort()
            seen += len(dirnames) + len(filenames)
            for name in sorted(filenames):
                if name.startswith("events.out.tfevents.") and not name.endswith(".tmp"):
                    path = os.path.join(dirpath, name)
                    if path not in self.readers and len(self.readers) < MAX_FILES:
                        self.readers[path] = EventFileReader(path, self.root, self.max_bytes / 2)
            if seen > MAX_SCAN_ENTRIES or len(self.readers) >= MAX_FILES:
                break  # the files found first are followed; the rest of a huge tree is left alone
        self.last_scan = time.monotonic()

    def poll(self, rescan: bool = True, deadline: float = float("inf")) -> list[tuple[float, int, str, float]]:
        started = time.thread_time()
        try:
            return self._poll(rescan, deadline, started)
        finally:
            self.cpu += time.thread_time() - started
            self._save()

    def _poll(self, rescan: bool, deadline: float, started: float) -> list[tuple[float, int, str, float]]:
        out: list[tuple[float, int, str, float]] = []
        if self.limit_note:
            return out  # the budget was spent: nothing is scanned or read again
        cpu_left = self.max_cpu - self.cpu_spent
        if cpu_left <= 0:
            self.limit_note = (
                f"TensorBoard event files: {self.cpu_spent:.1f} s of CPU spent decoding them for metrics, the most "
                "a job spends; the rest is not read"
            )
            return out
        if rescan:
            self.scan()
        spent = self.spent
        for path, reader in self.readers.items():
            if time.monotonic() > deadline:
                break
            left = self.max_bytes - spent
            if left < MIN_RECORD_COST:
                self.limit_note = (
                    f"TensorBoard event files: {spent / 1048576:.1f} MiB of records read for metrics, the most a "
                    "job reads (all its attempts); the rest is not read"
                )
                break
            rel = os.path.relpath(os.path.dirname(path), self.root)
            prefix = "" if rel in (".", "") else rel.replace(os.sep, "/") + "/"
            before = reader.spent
            for wall_time, step, tag, value in reader.read(allowance=left, cpu_until=started + cpu_left):
                out.append((wall_time, step, (prefix + tag)[:200], value))
            spent += reader.spent - before
        return out

    def problems(self) -> list[tuple[str, str]]:
        return [(path, reader.problem) for path, reader in self.readers.items() if reader.problem]

    def _save(self) -> None:
        """What the job has spent, into ``state`` (when it changed): the next attempt starts from there."""
        now = (self.spent, round(self.cpu_spent, 3))
        if self.state is None or now == self._saved:
            return
        self._saved = now
        tmp = f"{self.state}.tmp"
        try:
            with open(tmp, "w") as fh:
                json.dump({"bytes": now[0], "cpu": now[1]}, fh)
            os.replace(tmp, self.state)
        except OSError:
            pass  # not kept: the next attempt has this attempt's budget again, no more


def _load_spent(state: str | None) -> tuple[int, float]:
    """(bytes, CPU seconds) an earlier attempt of the job recorded in ``state``; nothing when there is none."""
    if state is None:
        return 0, 0.0
    try:
        with open(state) as fh:
            data = json.load(fh)
        return max(0, int(data.get("bytes", 0))), max(0.0, float(data.get("cpu", 0.0)))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0, 0.0

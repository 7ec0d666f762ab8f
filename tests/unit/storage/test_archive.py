"""validate_archive: a code bundle is checked completely before anything is stored."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest

from kiln.errors import InvalidArchive
from kiln.storage.archive import validate_archive

LIMITS = {"max_members": 100, "max_unpacked_bytes": 10 * 1024**2}


def file_member(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    return info, data


def dir_member(name: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    return info, None


def link_member(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, None


def special_member(name: str, kind: bytes) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.devmajor, info.devminor = 1, 3
    return info, None


def make_archive(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def check(path: Path, **limits: int) -> int:
    return validate_archive(path, **{**LIMITS, **limits})


def refused(path: Path, **limits: int) -> str:
    with pytest.raises(InvalidArchive) as info:
        check(path, **limits)
    assert info.value.code == "invalid_archive"
    assert info.value.status == 400
    return info.value.message


def good_members() -> list[tuple[tarfile.TarInfo, bytes | None]]:
    return [
        dir_member("pkg"),
        file_member("pkg/__init__.py", b""),
        file_member("pkg/model.py", b"import torch\n"),
        file_member("train.py", b"print('hi')\n"),
        link_member("latest.py", "train.py"),
        link_member("pkg/up.py", "../train.py"),
        link_member("hard.py", "train.py", tarfile.LNKTYPE),
        file_member("./dot/inside.txt", b"ok"),
    ]


def test_good_archive_passes_and_counts_members(tmp_path: Path) -> None:
    assert check(make_archive(tmp_path / "good.tar.gz", good_members())) == 8


def test_plain_uncompressed_tar_is_accepted_too(tmp_path: Path) -> None:
    path = tmp_path / "plain.tar"
    with tarfile.open(path, "w") as tar:
        info, data = file_member("a.py", b"1")
        tar.addfile(info, io.BytesIO(data))
    assert check(path) == 1


def test_empty_archive_passes_with_zero_members(tmp_path: Path) -> None:
    assert check(make_archive(tmp_path / "empty.tar.gz", [])) == 0


@pytest.mark.parametrize("name", ["/etc/passwd", "/abs/file.py"])
def test_absolute_paths_are_refused(tmp_path: Path, name: str) -> None:
    message = refused(make_archive(tmp_path / "a.tar.gz", [file_member(name)]))
    assert name in message or name.lstrip("/") in message


@pytest.mark.parametrize("name", ["../evil", "a/../../evil", "..", "pkg/../../../etc/x"])
def test_dot_dot_paths_are_refused(tmp_path: Path, name: str) -> None:
    message = refused(make_archive(tmp_path / "a.tar.gz", [file_member(name)]))
    assert "escapes the bundle" in message
    assert repr(name) in message


def test_an_escaping_member_after_good_ones_is_still_refused(tmp_path: Path) -> None:
    refused(make_archive(tmp_path / "a.tar.gz", [*good_members(), file_member("../evil")]))


@pytest.mark.parametrize("target", ["/etc/passwd", "..", "../x", "a/../../x", "../../../../root/.ssh"])
def test_symlinks_escaping_are_refused(tmp_path: Path, target: str) -> None:
    message = refused(make_archive(tmp_path / "a.tar.gz", [link_member("link", target)]))
    assert "symlink leaves the bundle" in message


def test_symlink_target_is_relative_to_the_links_directory(tmp_path: Path) -> None:
    # sub/link -> ../x stays inside; top -> ../x leaves.
    assert check(make_archive(tmp_path / "ok.tar.gz", [dir_member("sub"), link_member("sub/link", "../x")])) == 2
    refused(make_archive(tmp_path / "bad.tar.gz", [link_member("sub/deeper/link", "../../../x")]))


def test_symlink_escaping_through_an_earlier_symlinked_directory_is_refused(tmp_path: Path) -> None:
    # Regression test (found by this suite, since fixed):
    # (src/kiln/storage/archive.py, validate_archive): link targets are normalised lexically, ignoring links earlier
    # in the same archive. "a/b/up" -> ".." makes "a/b/up" the directory "a", so "a/b/up/esc" -> "../.." resolves to
    # the parent of the bundle root, yet posixpath.normpath("a/b/up/../..") == "a" looks inside. Python's tarfile
    # "data" filter refuses to extract it (LinkOutsideDestinationError), so the shim's second line of defence holds,
    # but the server stores a bundle its own contract says it refuses.
    members = [dir_member("a"), dir_member("a/b"), link_member("a/b/up", ".."), link_member("a/b/up/esc", "../..")]
    refused(make_archive(tmp_path / "chain.tar.gz", members))


@pytest.mark.parametrize("target", ["/etc/passwd", "../outside", "x/../../outside"])
def test_hardlinks_escaping_are_refused(tmp_path: Path, target: str) -> None:
    message = refused(make_archive(tmp_path / "a.tar.gz", [link_member("hard", target, tarfile.LNKTYPE)]))
    assert "hard link leaves the bundle" in message


@pytest.mark.parametrize(
    ("kind", "label"),
    [(tarfile.CHRTYPE, "char device"), (tarfile.BLKTYPE, "block device"), (tarfile.FIFOTYPE, "fifo")],
)
def test_devices_and_fifos_are_refused(tmp_path: Path, kind: bytes, label: str) -> None:
    message = refused(make_archive(tmp_path / "a.tar.gz", [special_member("dev_node", kind)]))
    assert "not a file, directory or link" in message, label
    assert "dev_node" in message


def test_too_many_members(tmp_path: Path) -> None:
    path = make_archive(tmp_path / "many.tar.gz", [file_member(f"f{i}.py") for i in range(6)])
    assert check(path, max_members=6) == 6
    assert refused(path, max_members=5) == "archive has more than 5 members"


def test_too_big_unpacked(tmp_path: Path) -> None:
    path = make_archive(tmp_path / "big.tar.gz", [file_member("a.bin", b"\0" * 600), file_member("b.bin", b"\0" * 600)])
    assert check(path, max_unpacked_bytes=1200) == 2
    assert refused(path, max_unpacked_bytes=1199) == "archive unpacks to more than 1199 bytes"


def test_a_gzip_bomb_is_refused_by_size_without_unpacking_it_all(tmp_path: Path) -> None:
    path = tmp_path / "bomb.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("zeros.bin")
        info.size = 64 * 1024**2
        tar.addfile(info, io.BytesIO(b"\0" * info.size))
    assert path.stat().st_size < 200_000
    assert "unpacks to more than" in refused(path, max_unpacked_bytes=1024**2)


def random_archive(tmp_path: Path) -> bytes:
    data = os.urandom(40_000)  # incompressible, so every cut lands inside member data
    path = make_archive(tmp_path / "src.tar.gz", [file_member("data.bin", data), file_member("train.py", b"1")])
    return path.read_bytes()


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9])
def test_truncated_gzip_is_refused(tmp_path: Path, fraction: float) -> None:
    raw = random_archive(tmp_path)
    path = tmp_path / "cut.tar.gz"
    path.write_bytes(raw[: int(len(raw) * fraction)])
    assert "not a valid tar archive" in refused(path)


def test_corrupt_compressed_stream_is_refused(tmp_path: Path) -> None:
    path = make_archive(
        tmp_path / "src.tar.gz", [file_member(f"f{i}.py", b"print('hello world')\n" * 200) for i in range(5)]
    )
    raw = bytearray(path.read_bytes())
    for i in range(20, len(raw) - 20):
        raw[i] ^= 0x5A
    path.write_bytes(bytes(raw))
    assert "not a valid tar archive" in refused(path)


@pytest.mark.parametrize("damage", ["drop the trailer", "flip the crc"])
def test_gzip_integrity_trailer_is_checked(tmp_path: Path, damage: str) -> None:
    # Regression test (found by this suite, since fixed):
    # (src/kiln/storage/archive.py, validate_archive): tarfile stops at the end-of-archive blocks and never reads
    # the gzip trailer (CRC-32 + size), so a gzip stream with its last 8 bytes missing, or with a wrong CRC, passes
    # although `gzip -t` rejects it. Reading the compressed stream to its end would catch both.
    raw = bytearray(random_archive(tmp_path))
    if damage == "drop the trailer":
        raw = raw[:-8]
    else:
        raw[-8] ^= 0xFF
    path = tmp_path / "damaged.tar.gz"
    path.write_bytes(bytes(raw))
    with pytest.raises((EOFError, gzip.BadGzipFile)):
        gzip.decompress(bytes(raw))  # the stream really is broken
    refused(path)


@pytest.mark.parametrize("content", [b"", b"not an archive at all", b"\x1f\x8b\x08\x00garbage", os.urandom(2048)])
def test_garbage_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "junk.tar.gz"
    path.write_bytes(content)
    assert "not a valid tar archive" in refused(path)


def test_missing_file_is_refused(tmp_path: Path) -> None:
    refused(tmp_path / "does-not-exist.tar.gz")

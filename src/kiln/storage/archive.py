"""Validation of uploaded code bundles (gzip'd tar): everything is checked before anything is stored.

Refused: unreadable or corrupt archives, absolute names, ``..``, links that point outside the bundle (on their
own, or resolved through the bundle's other links: ``injob/tarlinks.py``; 422), device
files and FIFOs, and bundles over the member-count or unpacked-size limits. The shim extracts with Python's
``data`` filter as a second line of defence.
"""

from __future__ import annotations

import gzip
import posixpath
import tarfile
import zlib
from pathlib import Path

from kiln.errors import ArchiveLinkEscapes, InvalidArchive
from kiln.injob.tarlinks import escaping_link


def _inside(path: str) -> bool:
    norm = posixpath.normpath(path)
    return not (norm.startswith("/") or norm == ".." or norm.startswith("../"))


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def validate_archive(path: Path, *, max_members: int, max_unpacked_bytes: int) -> int:
    """Check a bundle; returns its member count or raises InvalidArchive naming the first problem."""
    count = 0
    total = 0
    links: set[str] = set()
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                count += 1
                if count > max_members:
                    raise InvalidArchive(f"archive has more than {max_members} members")
                name = member.name
                if "\x00" in name or not name:
                    raise InvalidArchive("archive member with an empty or invalid name")
                if name.startswith("/") or not _inside(name):
                    raise InvalidArchive(f"archive member escapes the bundle: {name!r}")
                norm = posixpath.normpath(name)
                parents = norm.split("/")[:-1]
                if any("/".join(parents[: i + 1]) in links for i in range(len(parents))):
                    # A chain of links checked one by one can still leave the tree: refuse paths through links.
                    raise InvalidArchive(f"archive member lies under a symlink: {name!r}")
                if member.issym():
                    links.add(norm)
                    target = member.linkname
                    if target.startswith("/") or not _inside(posixpath.join(posixpath.dirname(name), target)):
                        raise InvalidArchive(f"symlink leaves the bundle: {name!r} -> {target!r}")
                elif member.islnk():
                    if member.linkname.startswith("/") or not _inside(member.linkname):
                        raise InvalidArchive(f"hard link leaves the bundle: {name!r} -> {member.linkname!r}")
                elif not (member.isfile() or member.isdir()):
                    raise InvalidArchive(f"archive member is not a file, directory or link: {name!r}")
                total += max(member.size, 0)
                if total > max_unpacked_bytes:
                    raise InvalidArchive(f"archive unpacks to more than {max_unpacked_bytes} bytes")
                if member.isfile():
                    # Read through the data so a truncated or corrupt stream fails here, not at extraction.
                    fh = tar.extractfile(member)
                    if fh is not None:
                        while fh.read(1024 * 1024):
                            pass
            why = escaping_link(tar.getmembers())  # each link through all the others, whatever their order
            if why:
                raise ArchiveLinkEscapes(why)
        if _is_gzip(path):
            # tarfile stops at the end-of-archive blocks and never reaches the gzip trailer: check it too.
            with gzip.open(path, "rb") as gz:
                while gz.read(1024 * 1024):
                    pass
    except InvalidArchive:
        raise
    except (tarfile.TarError, EOFError, zlib.error, OSError, ValueError, gzip.BadGzipFile) as exc:
        raise InvalidArchive(f"not a valid tar archive: {type(exc).__name__}: {exc}") from exc
    return count

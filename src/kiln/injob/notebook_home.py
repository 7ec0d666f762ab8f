"""A notebook's home as the launcher (kiln.injob.notebook) keeps it: a stored home extracted without ever writing
through a symbolic link, what a save holds (its signature), the archive a save sends, and the job's inputs linked
in. Standard library only, as every module of kiln.injob."""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

INPUTS_LINK = "data"  # in the home: the job's inputs (a link to the work dir's data/)
CHUNK = 1024 * 1024
MAX_SAID = 20  # skipped entries named one by one; the rest are counted
# Under the home and never saved: caches, JupyterLab's runtime files, the trash (what was deleted stays deleted).
NOT_SAVED = (".cache", ".local/share/jupyter/runtime", ".local/share/Trash", ".npm/_cacache", ".npm/_logs")


def say(message: str, *, error: bool = False) -> None:
    print(f"kiln: {message}", file=sys.stderr if error else sys.stdout, flush=True)


# --- extracting a stored home ----------------------------------------------------------------------------------


class _Refused(Exception):
    pass


def _member_parts(member: tarfile.TarInfo) -> list[str]:
    """The member's path in the home as components, or _Refused."""
    name = member.name
    if name.startswith("/"):
        raise _Refused("an absolute name")
    if "\0" in name:
        raise _Refused("a NUL in its name")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise _Refused("a '..' in its name")
    return parts


def _refusal(member: tarfile.TarInfo, parts: list[str], home: str) -> str | None:
    """Why ``member`` is not written into ``home``, or None."""
    if member.islnk():
        return "a hard link"
    if member.ischr() or member.isblk():
        return "a device"
    if member.isfifo():
        return "a fifo"
    if not (member.isreg() or member.isdir() or member.issym()):
        return f"an entry of type {member.type!r}"
    if member.issym():
        if not member.linkname or "\0" in member.linkname:
            return "a symbolic link to nothing"
        if member.linkname.startswith("/"):
            return f"a symbolic link to an absolute path ({member.linkname})"
        resolved = os.path.normpath(os.path.join(*parts[:-1], member.linkname) if parts[:-1] else member.linkname)
        if resolved == ".." or resolved.startswith("../"):
            return f"a symbolic link out of the home ({member.linkname})"
    data_filter = getattr(tarfile, "data_filter", None)  # Python 3.11.4+: its checks too, against what is there now
    if data_filter is not None:
        try:
            data_filter(member, home)
        except tarfile.TarError as exc:
            return str(exc)
    return None


def _open_dirs(root_fd: int, parts: list[str]) -> int:
    """A descriptor of the directory ``parts`` under ``root_fd``, made where missing, never through a link."""
    fd = os.dup(root_fd)
    try:
        for index, part in enumerate(parts):
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                raise _Refused(f"{'/'.join(parts[: index + 1])} is not a directory ({exc.strerror})") from exc
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, root_fd: int, parts: list[str]) -> None:
    if member.isdir():
        os.close(_open_dirs(root_fd, parts))
        return
    parent = _open_dirs(root_fd, parts[:-1])
    name = parts[-1]
    try:
        try:
            there = os.lstat(name, dir_fd=parent)
        except FileNotFoundError:
            pass
        else:
            if stat.S_ISDIR(there.st_mode):
                raise _Refused("a directory is in its place")
            os.unlink(name, dir_fd=parent)  # a file or a link: replaced, never written through
        if member.issym():
            os.symlink(member.linkname, name, dir_fd=parent)
            return
        source = tar.extractfile(member)
        if source is None:
            raise _Refused("no data")
        mode = (member.mode & 0o755) | 0o600  # no setuid/setgid/sticky, no group or other write
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=parent)
        with os.fdopen(fd, "wb") as out:
            while chunk := source.read(CHUNK):
                out.write(chunk)
            out.flush()
            os.fchmod(out.fileno(), mode)
            os.utime(out.fileno(), (member.mtime, member.mtime))
    finally:
        os.close(parent)


def extract_home(stream: IO[bytes], home: Path) -> tuple[int, list[str]]:
    """Extract the gzip'd tar read from ``stream`` into ``home``: (entries written, ``"name: why"`` of each entry
    skipped: what could harm or leave the home). Raises tarfile.TarError (or zlib.error, EOFError) for a stream
    that is not one, OSError for what could not be written: a home restored in part must not be saved over the
    whole one."""
    root = os.path.realpath(home)
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    written, skipped = 0, []
    try:
        with tarfile.open(fileobj=stream, mode="r|gz") as tar:
            for member in tar:
                try:
                    parts = _member_parts(member)
                    if not parts:
                        continue  # the home itself
                    reason = _refusal(member, parts, root)
                    if reason is not None:
                        raise _Refused(reason)
                    _write_member(tar, member, root_fd, parts)
                    written += 1
                except _Refused as exc:  # anything else (a full disk, a broken stream) fails the restore
                    skipped.append(f"{member.name}: {exc}")
    finally:
        os.close(root_fd)
    return written, skipped


# --- saving the home -------------------------------------------------------------------------------------------


def _walk(home: Path, excluded: tuple[str, ...], problems: list[str]) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """(relative path, entry) of every directory, symbolic link and regular file under ``home``, parents first,
    in a stable order, never following a link; what cannot be read is added to ``problems``."""
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            with os.scandir(home / rel if rel else home) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError as exc:
            problems.append(f"{rel or '.'}: {exc.strerror}")
            continue
        subdirs = []
        for entry in entries:
            path = f"{rel}/{entry.name}" if rel else entry.name
            if path in excluded:
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append(path)
                elif not (entry.is_symlink() or entry.is_file(follow_symlinks=False)):
                    continue  # sockets, fifos, devices: not a home's
            except OSError:
                continue
            yield path, entry
        stack.extend(reversed(subdirs))


def _excluded(config_home: Path, work_dir: Path | None) -> tuple[str, ...]:
    excluded: tuple[str, ...] = NOT_SAVED
    if work_dir is not None and work_dir != config_home and work_dir.is_relative_to(config_home):
        excluded += (work_dir.relative_to(config_home).as_posix(),)  # the state file holds the token
    if work_dir is not None and _is_inputs_link(config_home / INPUTS_LINK, work_dir):
        excluded += (INPUTS_LINK,)  # the job's inputs, linked in: not the home's to keep
    return excluded


def _is_inputs_link(link: Path, work_dir: Path) -> bool:
    try:
        return link.is_symlink() and os.readlink(link) == str(work_dir / INPUTS_LINK)
    except OSError:
        return False


def link_inputs(home: Path, work_dir: Path) -> None:
    """The job's inputs (staged under the work dir's ``data/``) as ``data`` in the home, where JupyterLab's file
    browser and a notebook's relative paths find them (``data/NAME``), unless the home has a ``data`` of its own."""
    staged, link = work_dir / INPUTS_LINK, home / INPUTS_LINK
    if not staged.is_dir():
        return
    if link.is_symlink():
        link.unlink()  # a link saved by an earlier start (or made by the user): this start's inputs replace it
    if link.exists():
        say(f"inputs: {link} is the home's own, so the inputs are at {staged} (and $KILN_INPUT_<NAME>)")
        return
    link.symlink_to(staged, target_is_directory=True)
    say(f"inputs: at {link} (and $KILN_INPUT_<NAME>)")


def home_signature(home: Path, work_dir: Path | None = None) -> str:
    """A digest of what a save of ``home`` would hold: each entry's path and kind, a file's size and mtime_ns,
    a link's target. Equal digests: nothing to save."""
    digest = hashlib.sha256()
    for path, entry in _walk(home, _excluded(home, work_dir), []):
        try:
            info = entry.stat(follow_symlinks=False)
            if entry.is_symlink():
                line = f"l {path}\0{os.readlink(entry.path)}"
            elif stat.S_ISDIR(info.st_mode):
                line = f"d {path}"
            else:
                line = f"f {path}\0{info.st_size}\0{info.st_mtime_ns}"
        except OSError:
            continue
        digest.update(line.encode("utf-8", "surrogateescape") + b"\n")
    return digest.hexdigest()


def build_archive(home: Path, target: Path, work_dir: Path | None = None) -> list[str]:
    """Write ``home`` as a gzip'd tar to ``target`` (mode 0600): directories, regular files and symbolic links
    (as links), without ``NOT_SAVED``. Returns ``"path: why"`` of what could not be read."""
    problems: list[str] = []
    target.unlink(missing_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz", compresslevel=6) as tar:
        for path, entry in _walk(home, _excluded(home, work_dir), problems):
            try:
                if entry.is_symlink() or entry.is_dir(follow_symlinks=False):
                    info = tar.gettarinfo(entry.path, arcname=path)
                    _anonymous(info)
                    tar.addfile(info)
                    continue
                file_fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError as exc:
                problems.append(f"{path}: {exc.strerror}")
                continue
            with os.fdopen(file_fd, "rb") as fh:
                if not stat.S_ISREG(os.fstat(file_fd).st_mode):
                    continue  # replaced by something else since it was listed
                info = tar.gettarinfo(arcname=path, fileobj=fh)
                _anonymous(info)
                tar.addfile(info, _Exactly(fh, info.size))  # type: ignore[arg-type]
        raw.flush()
        os.fsync(raw.fileno())
    return problems


def _anonymous(info: tarfile.TarInfo) -> None:
    info.uid = info.gid = 0
    info.uname = info.gname = ""


def _said(items: list[str]) -> str:
    more = f" (and {len(items) - MAX_SAID} more)" if len(items) > MAX_SAID else ""
    return "; ".join(items[:MAX_SAID]) + more


class _Exactly:
    """``size`` bytes of ``fh``: a file that shrank while it was read is padded with zeros (it changed, so the
    next round saves it again), one that grew is cut."""

    def __init__(self, fh: IO[bytes], size: int) -> None:
        self.fh, self.left = fh, size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = self.fh.read(n)
        data += b"\0" * (n - len(data))
        self.left -= n
        return data

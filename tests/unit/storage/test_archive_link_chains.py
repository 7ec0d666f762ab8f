"""Links that leave the bundle only once resolved through its other links: ``p -> q/..`` and ``q -> .`` each look
inside, together ``p`` is the work dir's parent. Refused at upload (422, naming the member) and, should such a
bundle reach a job anyway, by the shim before it extracts anything."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from kiln.errors import ArchiveLinkEscapes
from kiln.injob import shimprep
from kiln.injob.tarlinks import escaping_link
from kiln.storage.archive import validate_archive

LIMITS = {"max_members": 100, "max_unpacked_bytes": 10 * 1024**2}


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def bundle(path: Path, members: list[tarfile.TarInfo]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info in members:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    return path


# Each chain and the member it is refused for.
CHAINS = {
    "p then q": ([link("p", "q/.."), link("q", ".")], "p"),
    "q then p": ([link("q", "."), link("p", "q/..")], "p"),
    "deeper": ([link("a", "b/c/../.."), link("b", "d"), link("d", ".")], "a"),
    "loop": ([link("x", "y/z"), link("y", "x")], "x"),
    "hard link through a link": ([link("q", "."), link("h", "q/../etc", tarfile.LNKTYPE)], "h"),
}


@pytest.mark.parametrize(("members", "name"), CHAINS.values(), ids=CHAINS.keys())
def test_a_link_leaving_through_another_is_refused_at_upload_naming_it(
    tmp_path: Path, members: list, name: str
) -> None:
    with pytest.raises(ArchiveLinkEscapes) as refused:
        validate_archive(bundle(tmp_path / "b.tar.gz", members), **LIMITS)
    assert (refused.value.status, refused.value.code) == (422, "archive_link_escapes")
    assert refused.value.message.startswith(("symlink leaves the bundle: ", "hard link leaves the bundle: "))
    assert f"{name!r} -> " in refused.value.message


def test_links_through_links_that_stay_inside_are_kept(tmp_path: Path) -> None:
    sub = tarfile.TarInfo("sub/f")
    sub.size = 1
    members = [
        sub,
        link("lib64", "sub"),
        link("f", "lib64/f"),
        link("up", "lib64/.."),
        link("h", "sub/f", tarfile.LNKTYPE),
    ]
    assert escaping_link(members) is None
    assert validate_archive(bundle(tmp_path / "ok.tar.gz", members), **LIMITS) == len(members)


class _Shim(shimprep.Preparation):
    def __init__(self, archive: Path, work: Path) -> None:
        self.cfg = {"code_archive": str(archive), "work_dir": str(work)}
        self.said: list[str] = []

    def say(self, text: str) -> None:
        self.said.append(text)


def test_the_shim_refuses_such_a_bundle_before_extracting_anything(tmp_path: Path) -> None:
    archive = bundle(tmp_path / "b.tar.gz", [link("p", "q/.."), link("q", "."), link("p/escaped", ".")])
    work = tmp_path / "work"
    with pytest.raises(tarfile.TarError, match="'p'"):
        _Shim(archive, work).extract_code()
    assert list(work.iterdir()) == []  # nothing extracted, not even the members before the bad one

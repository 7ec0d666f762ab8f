"""Packaging a working directory: ignore files, determinism, size cap."""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln.errors import InvalidInput
from kiln.sdk.packaging import Bundle, build_bundle, collect_files
from kiln.storage.archive import validate_archive

MB = 1024**2


def tree(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


def names(root: Path) -> list[str]:
    return [p.as_posix() for p in collect_files(root)]


@pytest.fixture
def bundles() -> Iterator[list[Bundle]]:
    made: list[Bundle] = []
    yield made
    for bundle in made:
        bundle.path.unlink(missing_ok=True)


def build(root: Path, made: list[Bundle], max_bytes: int = 100 * MB) -> Bundle:
    bundle = build_bundle(root, max_bytes)
    made.append(bundle)
    return bundle


def test_root_gitignore_is_honoured(tmp_path: Path) -> None:
    root = tree(
        tmp_path / "proj",
        {
            ".gitignore": "*.log\n!keep.log\ndata/\n/only_root.txt\nbuild\n",
            "train.py": "",
            "run.log": "",
            "keep.log": "",
            "only_root.txt": "",
            "sub/only_root.txt": "",
            "sub/deep/run.log": "",
            "data/big.csv": "",
            "build/x.o": "",
            "sub/build/y.o": "",
        },
    )
    assert names(root) == [".gitignore", "keep.log", "sub/only_root.txt", "train.py"]


def test_nested_gitignore_applies_below_its_directory_only(tmp_path: Path) -> None:
    root = tree(
        tmp_path / "proj",
        {
            "sub/.gitignore": "secret.txt\n/anchored.txt\n",
            "secret.txt": "",
            "anchored.txt": "",
            "sub/secret.txt": "",
            "sub/anchored.txt": "",
            "sub/deep/secret.txt": "",
            "sub/deep/anchored.txt": "",
            "other/secret.txt": "",
        },
    )
    assert names(root) == [
        "anchored.txt",
        "other/secret.txt",
        "secret.txt",
        "sub/.gitignore",
        "sub/deep/anchored.txt",
    ]


def test_nested_gitignore_negation_overrides_the_parent(tmp_path: Path) -> None:
    # Regression test (found by this suite, since fixed):
    # (src/kiln/sdk/packaging.py, collect_files.ignored): a path is dropped when *any* ignore file matches it, so a
    # negation in a deeper .gitignore cannot re-include what a parent ignored. Git gives lower-level files
    # precedence ("git add -A" adds sub/keep.log here), so such a file is silently missing from the bundle.
    root = tree(tmp_path / "proj", {".gitignore": "*.log\n", "sub/.gitignore": "!keep.log\n", "sub/keep.log": "x"})
    assert names(root) == [".gitignore", "sub/.gitignore", "sub/keep.log"]


def test_kilnignore_is_honoured_at_every_level(tmp_path: Path) -> None:
    root = tree(
        tmp_path / "proj",
        {
            ".kilnignore": "outputs/\n*.ckpt\n",
            "sub/.kilnignore": "scratch.py\n",
            "train.py": "",
            "model.ckpt": "",
            "outputs/o.txt": "",
            "sub/scratch.py": "",
            "sub/keep.py": "",
            "scratch.py": "",
        },
    )
    assert names(root) == [".kilnignore", "scratch.py", "sub/.kilnignore", "sub/keep.py", "train.py"]


def test_gitignore_and_kilnignore_in_one_directory_combine(tmp_path: Path) -> None:
    root = tree(
        tmp_path / "proj", {".gitignore": "a.txt\n", ".kilnignore": "b.txt\n", "a.txt": "", "b.txt": "", "c.txt": ""}
    )
    assert names(root) == [".gitignore", ".kilnignore", "c.txt"]


def test_always_ignored_directories_and_files(tmp_path: Path) -> None:
    root = tree(
        tmp_path / "proj",
        {
            ".git/config": "",
            ".git/objects/ab/cd": "",
            "sub/.git/HEAD": "",
            ".kiln/state": "",
            "__pycache__/m.cpython-311.pyc": "",
            "pkg/__pycache__/x.pyc": "",
            "pkg/stray.pyc": "",
            ".venv/bin/python": "",
            ".mypy_cache/x": "",
            ".pytest_cache/y": "",
            "pkg/mod.py": "",
            ".gitattributes": "",
        },
    )
    assert names(root) == [".gitattributes", "pkg/mod.py"]


def test_a_gitignore_cannot_unignore_dot_git(tmp_path: Path) -> None:
    root = tree(tmp_path / "proj", {".gitignore": "!.git/\n!.git/config\n", ".git/config": "", "a.py": ""})
    assert names(root) == [".gitignore", "a.py"]


def test_links_inside_are_kept_and_links_outside_are_dropped(tmp_path: Path) -> None:
    outside = tree(tmp_path / "outside", {"secret": "s"})
    root = tree(tmp_path / "proj", {"a.py": "", "lib/m.py": ""})
    (root / "alias.py").symlink_to("a.py")
    (root / "libdir").symlink_to("lib")
    (root / "escape").symlink_to(outside / "secret")
    (root / "escape_dir").symlink_to(outside)
    assert names(root) == ["a.py", "alias.py", "lib/m.py", "libdir"]


def test_bundle_contents_are_normalised(tmp_path: Path, bundles: list[Bundle]) -> None:
    root = tree(
        tmp_path / "proj", {"train.py": "print(1)\n", "run.sh": "#!/bin/sh\n", ".gitignore": "*.tmp\n", "x.tmp": ""}
    )
    os.chmod(root / "run.sh", 0o700)
    os.chmod(root / "train.py", 0o600)
    (root / "alias.py").symlink_to("train.py")
    bundle = build(root, bundles)
    assert (bundle.files, bundle.unpacked_bytes) == (4, len("print(1)\n") + len("#!/bin/sh\n") + 6 + len("train.py"))
    assert bundle.size == bundle.path.stat().st_size
    with tarfile.open(bundle.path) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert sorted(members) == [".gitignore", "alias.py", "run.sh", "train.py"]
        assert [m.name for m in tar.getmembers()] == sorted(members)
        assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members.values()} == {(0, 0, 0, "", "")}
        assert members["run.sh"].mode == 0o755
        assert members["train.py"].mode == 0o644
        assert members["alias.py"].issym() and members["alias.py"].linkname == "train.py"
        fh = tar.extractfile("train.py")
        assert fh is not None and fh.read() == b"print(1)\n"
    assert validate_archive(bundle.path, max_members=10, max_unpacked_bytes=MB) == 4


def test_gzip_header_carries_no_file_name_or_time(tmp_path: Path, bundles: list[Bundle]) -> None:
    # Regression test (found by this suite, since fixed):
    # (src/kiln/sdk/packaging.py, build_bundle): gzip.GzipFile(fileobj=raw, ...) takes the file name from raw.name,
    # so the gzip header's FNAME field holds the random temporary name ("kiln-bundle-XXXXXXXX.tar"). Every build of
    # the same tree then has a different sha256 and the upload is never deduplicated. Passing filename="" to
    # GzipFile fixes it. The three determinism tests below fail for this same reason.
    bundle = build(tree(tmp_path / "proj", {"a.py": "1"}), bundles)
    header = bundle.path.read_bytes()[:10]
    assert header[:3] == b"\x1f\x8b\x08"
    assert header[3] & 0x08 == 0, "FNAME flag set: the temporary file name is in the gzip header"
    assert header[4:8] == b"\0\0\0\0"  # mtime 0


def test_identical_trees_give_identical_sha256(tmp_path: Path, bundles: list[Bundle]) -> None:
    # Fails today because of the gzip FNAME bug described in test_gzip_header_carries_no_file_name_or_time.
    files = {
        "train.py": "print(1)\n",
        "pkg/__init__.py": "",
        "pkg/model.py": "x = 1\n",
        "data/w.bin": b"\x00\x01" * 500,
    }
    first = tree(tmp_path / "one", files)
    second = tree(tmp_path / "two" / "nested", dict(reversed(list(files.items()))))
    os.utime(second / "train.py", (1_000_000, 1_000_000))
    a, b, again = build(first, bundles), build(second, bundles), build(first, bundles)
    assert a.sha256 == b.sha256 == again.sha256
    assert a.path.read_bytes() == b.path.read_bytes()
    assert a.path != again.path


def test_ignored_files_do_not_change_the_hash(tmp_path: Path, bundles: list[Bundle]) -> None:
    # Fails today because of the gzip FNAME bug described in test_gzip_header_carries_no_file_name_or_time.
    root = tree(tmp_path / "proj", {".gitignore": "*.log\n", "a.py": "1"})
    before = build(root, bundles).sha256
    tree(root, {"noise.log": "lots of noise", ".git/HEAD": "ref", "__pycache__/a.pyc": "x"})
    assert build(root, bundles).sha256 == before


def test_content_changes_change_the_hash(tmp_path: Path, bundles: list[Bundle]) -> None:
    root = tree(tmp_path / "proj", {"a.py": "1"})
    before = build(root, bundles).sha256
    (root / "a.py").write_text("2")
    assert build(root, bundles).sha256 != before


def test_size_cap_error_names_the_biggest_files(tmp_path: Path) -> None:
    sizes = {"huge.bin": 9000, "big.bin": 7000, "mid.bin": 5000, "four.bin": 4000, "five.bin": 3000, "tiny.py": 10}
    root = tree(tmp_path / "proj", {name: b"\0" * n for name, n in sizes.items()})
    before = set(Path(tempfile.gettempdir()).glob("kiln-bundle-*"))
    with pytest.raises(InvalidInput) as info:
        build_bundle(root, max_bytes=20_000)
    message = info.value.message
    assert "over the 19.5 KiB limit" in message
    assert message.index("huge.bin (8.8 KiB)") < message.index("big.bin") < message.index("mid.bin")
    assert "four.bin" in message and "five.bin" in message
    assert "tiny.py" not in message  # only the five largest
    assert ".kilnignore" in message
    assert set(Path(tempfile.gettempdir()).glob("kiln-bundle-*")) == before  # nothing written


def test_ignored_files_do_not_count_towards_the_cap(tmp_path: Path, bundles: list[Bundle]) -> None:
    root = tree(tmp_path / "proj", {".kilnignore": "data/\n", "data/huge.bin": b"\0" * 50_000, "a.py": "1"})
    assert build(root, bundles, max_bytes=1000).files == 2


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="not a directory"):
        build_bundle(tmp_path / "missing", MB)


def test_a_copied_tree_with_ignored_dirs_hashes_like_the_original(tmp_path: Path, bundles: list[Bundle]) -> None:
    # Fails today because of the gzip FNAME bug described in test_gzip_header_carries_no_file_name_or_time.
    root = tree(tmp_path / "proj", {".gitignore": "out/\n", "a.py": "1", "out/x": "2"})
    copy = tmp_path / "copy"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("out"))
    assert build(root, bundles).sha256 == build(copy, bundles).sha256

"""What `kiln jobs download` wrote is not packed back up as code: marked destinations, the examples' ignore files,
and the digests a bundle keeps of what it packed."""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
from pathlib import Path

from kiln.sdk.code_manifest import compare, manifest_path, remember
from kiln.sdk.download_marks import MARKER, mark_download, read_mark
from kiln.sdk.packaging import build_bundle, collect, collect_files

REPO = Path(__file__).resolve().parents[3]
MB = 1024**2


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_marked_directory_is_left_out_and_said_so(tmp_path: Path) -> None:
    root = write(tmp_path / "proj", {"train.py": "", "out/model.pkl": "weights", "out/sub/metrics.json": "{}"})
    mark_download(root / "out", "job-abc", [root / "out/model.pkl", root / "out/sub/metrics.json"])
    found = collect(root)
    assert [p.as_posix() for p in found.files] == ["train.py"]
    assert len(found.skipped) == 1
    message = found.skipped[0].describe()
    assert message.startswith("skipped out/: a `kiln jobs download` destination (job-abc")
    assert f"out/{MARKER}" in message


def test_a_download_into_the_code_directory_leaves_out_only_what_it_wrote(tmp_path: Path) -> None:
    root = write(tmp_path / "proj", {"train.py": "", "model.pkl": "w", "plots/loss.png": "p", "plots/keep.py": ""})
    mark_download(root, "job-1", [root / "model.pkl"])
    mark_download(root, "job-2", [root / "plots/loss.png"])  # a second download adds to the first's files
    mark = read_mark(root)
    assert mark is not None and mark.job == "job-2" and mark.files == {"model.pkl", "plots/loss.png"}
    found = collect(root)
    assert [p.as_posix() for p in found.files] == ["plots/keep.py", "train.py"]  # the marker itself neither
    assert [s.describe() for s in found.skipped] == [
        "skipped 2 file(s) that `kiln jobs download` wrote into the code directory (job-2)"
    ]


def test_an_unreadable_marker_still_marks_its_directory(tmp_path: Path) -> None:
    root = write(tmp_path / "proj", {"a.py": "", "out/x": "", f"out/{MARKER}": "not json"})
    assert collect_files(root) == [Path("a.py")]


def test_the_examples_ignore_their_outputs(tmp_path: Path) -> None:
    examples = sorted(p for p in (REPO / "examples").iterdir() if p.is_dir())
    assert examples
    for example in examples:
        copy = shutil.copytree(example, tmp_path / example.name)
        write(copy, {"out/model.pkl": "weights", "out/metrics.json": "{}"})  # no marker: an older download
        packed = [p.as_posix() for p in collect_files(copy)]
        assert not [p for p in packed if p.startswith("out/")], (example.name, packed)
        assert [p for p in packed if p.endswith(".py")], (example.name, packed)  # the code itself is packed


def test_a_bundle_keeps_the_digest_of_every_file(tmp_path: Path) -> None:
    root = write(tmp_path / "proj", {"train.py": "print(1)\n", "lib/util.py": "x = 2\n"})
    bundle = build_bundle(root, MB)
    try:
        assert bundle.digests == {
            "lib/util.py": hashlib.sha256(b"x = 2\n").hexdigest(),
            "train.py": hashlib.sha256(b"print(1)\n").hexdigest(),
        }
        with tarfile.open(bundle.path) as tar:  # hashing on the way did not change what was packed
            member = tar.extractfile("train.py")
            assert member is not None and member.read() == b"print(1)\n"
    finally:
        bundle.path.unlink()


def test_changes_since_the_last_run_from_a_directory(tmp_path: Path) -> None:
    base = tmp_path / "client"
    code = tmp_path / "proj"
    code.mkdir()
    first = compare(code, {"a.py": "1", "b.py": "2"}, base)
    assert first.first
    remember(code, {"a.py": "1", "b.py": "2"}, base)
    later = compare(code, {"a.py": "1", "b.py": "3", "c.py": "4"}, base)
    assert (later.first, later.new, later.changed, later.removed) == (False, ["c.py"], ["b.py"], [])
    gone = compare(code, {"a.py": "1"}, base)
    assert (gone.new, gone.changed, gone.removed) == ([], [], ["b.py"])
    assert compare(tmp_path, {"a.py": "1"}, base).first  # another directory has its own manifest
    saved = json.loads(manifest_path(code, base).read_text())
    assert saved["directory"] == str(code.resolve())


def test_a_download_that_wrote_nothing_marks_nothing(tmp_path: Path) -> None:
    root = write(tmp_path / "proj", {"train.py": "", "out/notes.txt": ""})
    mark_download(root / "out", "job-empty", [])
    assert read_mark(root / "out") is None
    assert [p.as_posix() for p in collect_files(root)] == ["out/notes.txt", "train.py"]

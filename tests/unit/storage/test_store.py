"""The object store: safe keys and a local-directory ObjectStore."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kiln.errors import BadRequest, NotFound
from kiln.storage.logs import LogStore
from kiln.storage.store import ObjectStore, safe_key

# -- safe_key -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parts", "key"),
    [
        (("a",), "a"),
        (("orgs", "o1", "blobs/x.tar.gz"), "orgs/o1/blobs/x.tar.gz"),
        (("a//b/",), "a/b"),
        (("a b", "ü.txt"), "a b/ü.txt"),
        (("..a", "b..", ".hidden"), "..a/b../.hidden"),
        (("./a",), "a"),
    ],
)
def test_safe_key_joins_parts(parts: tuple[str, ...], key: str) -> None:
    assert safe_key(*parts) == key


@pytest.mark.parametrize(
    ("parts", "why"),
    [
        (("..",), "'.' and '..'"),
        (("a/../b",), "'.' and '..'"),
        (("a", "../b"), "'.' and '..'"),
        (("a/..",), "'.' and '..'"),
        (("/etc/passwd",), "absolute"),
        (("a", "/etc/passwd"), "absolute"),
        (("//server/share",), "absolute"),
        (("a\x00b",), "invalid path"),
        (("a\\..\\b",), "invalid path"),
        (("a\\b",), "invalid path"),
        (("",), "empty path"),
        ((), "empty path"),
    ],
)
def test_safe_key_refuses(parts: tuple[str, ...], why: str) -> None:
    with pytest.raises(BadRequest) as info:
        safe_key(*parts)
    assert why in info.value.message
    assert info.value.status == 400


def test_dot_components_are_refused() -> None:
    # PurePosixPath drops inner "." components, so only a lone "." reaches the check.
    with pytest.raises(BadRequest):
        safe_key(".")
    assert safe_key("a/./b") == "a/b"


# -- ObjectStore on a local directory -----------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> ObjectStore:
    return ObjectStore(str(tmp_path / "store"))


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_creates_its_root_and_is_local(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path / "new" / "root") + "/")
    assert (tmp_path / "new" / "root").is_dir()
    assert store.is_local


def test_put_then_open_read_size_exists(store: ObjectStore, tmp_path: Path) -> None:
    src = write(tmp_path / "src.bin", b"hello object")
    store.put_file(src, "orgs/o1/blobs/abc.tar.gz")
    assert store.exists("orgs/o1/blobs/abc.tar.gz")
    assert store.size("orgs/o1/blobs/abc.tar.gz") == 12
    with store.open("orgs/o1/blobs/abc.tar.gz") as fh:
        assert fh.read() == b"hello object"
    assert b"".join(store.iter_bytes("orgs/o1/blobs/abc.tar.gz", chunk=5)) == b"hello object"
    assert store.local_path("orgs/o1/blobs/abc.tar.gz") == Path(store.root) / "orgs/o1/blobs/abc.tar.gz"
    assert (Path(store.root) / "orgs/o1/blobs/abc.tar.gz").read_bytes() == b"hello object"


def test_put_replaces_and_leaves_no_temporary_files(store: ObjectStore, tmp_path: Path) -> None:
    store.put_file(write(tmp_path / "a", b"one"), "k/obj")
    store.put_file(write(tmp_path / "b", b"two!"), "k/obj")
    with store.open("k/obj") as fh:
        assert fh.read() == b"two!"
    assert os.listdir(Path(store.root) / "k") == ["obj"]


def test_missing_objects_are_not_found(store: ObjectStore) -> None:
    assert not store.exists("nope")
    with pytest.raises(NotFound):
        store.open("nope")
    with pytest.raises(NotFound):
        store.size("nope")


def test_opening_a_directory_is_not_found(store: ObjectStore, tmp_path: Path) -> None:
    store.put_file(write(tmp_path / "a", b"1"), "dir/a")
    with pytest.raises(NotFound):
        store.open("dir")


def test_list_is_relative_sorted_and_sized(store: ObjectStore, tmp_path: Path) -> None:
    for key, data in [("jobs/j1/out/b.txt", b"bb"), ("jobs/j1/out/a.txt", b"a"), ("jobs/j1/out/sub/c.bin", b"ccc")]:
        store.put_file(write(tmp_path / "x", data), key)
    store.put_file(write(tmp_path / "y", b"other"), "jobs/j2/out/z.txt")
    assert store.list("jobs/j1/out") == [("a.txt", 1), ("b.txt", 2), ("sub/c.bin", 3)]
    assert store.list("jobs/j2") == [("out/z.txt", 5)]
    assert store.list("jobs/j3") == []


def test_put_tree_uploads_regular_files_only(store: ObjectStore, tmp_path: Path) -> None:
    root = tmp_path / "outputs"
    write(root / "model.pt", b"weights")
    write(root / "logs" / "train.csv", b"a,b\n")
    (root / "link").symlink_to(root / "model.pt")
    os.mkfifo(root / "pipe")
    assert store.put_tree(root, "jobs/j1/artifacts") == (2, len(b"weights") + len(b"a,b\n"))
    assert store.list("jobs/j1/artifacts") == [("logs/train.csv", 4), ("model.pt", 7)]


def test_download(store: ObjectStore, tmp_path: Path) -> None:
    store.put_file(write(tmp_path / "a", b"payload"), "b/c")
    dest = tmp_path / "dl" / "deep" / "c"
    store.download("b/c", dest)
    assert dest.read_bytes() == b"payload"
    assert not dest.with_name("c.part").exists()


@pytest.mark.parametrize("key", ["../escape", "/etc/passwd", "a/../../x", "a\x00", "a\\b"])
def test_every_operation_refuses_unsafe_keys(store: ObjectStore, tmp_path: Path, key: str) -> None:
    src = write(tmp_path / "src", b"x")
    for op in (
        lambda: store.put_file(src, key),
        lambda: store.open(key),
        lambda: store.exists(key),
        lambda: store.list(key),
        lambda: store.size(key),
    ):
        with pytest.raises(BadRequest):
            op()
    assert not (tmp_path / "escape").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src", "store"]


# -- LogStore (uses safe_key for the job id) ----------------------------------------------------------------------


def test_log_store_reads_whole_lines_from_offsets(tmp_path: Path) -> None:
    logs = LogStore(tmp_path / "logs")
    logs.path("job-1").write_bytes(b"line one\nline two\npartial")
    assert logs.size("job-1") == 25
    assert logs.read("job-1") == (b"line one\nline two\n", 18)
    assert logs.read("job-1", 9) == (b"line two\n", 18)
    assert logs.read("job-1", 18) == (b"", 18)  # a partial line waits for its end
    assert logs.read("job-1", 18, limit=4) == (b"part", 22)  # unless the buffer is full
    assert logs.read("nope", 5) == (b"", 5)
    assert logs.size("nope") == 0


def test_log_store_system_lines(tmp_path: Path) -> None:
    logs = LogStore(tmp_path / "logs")
    logs.append_system("job-1", "restarting (attempt 2)")
    data, _ = logs.read("job-1")
    stamp, stream, text = data.decode().rstrip("\n").split(" ", 2)
    assert (stream, text) == ("K", "restarting (attempt 2)")
    assert stamp.endswith("Z")


def test_log_store_refuses_unsafe_job_ids(tmp_path: Path) -> None:
    with pytest.raises(BadRequest):
        LogStore(tmp_path / "logs").path("../../etc/passwd")


def test_copy_on_a_local_store_is_a_link_that_a_replaced_source_leaves_alone(tmp_path: Path) -> None:
    """What registering a logged model does with each of its files (no bytes copied): the copy is the source's
    inode; the source replaced (every store write is a rename) leaves the copy as it was, deleted as well."""
    store = ObjectStore(str(tmp_path / "store"))
    (tmp_path / "weights").write_bytes(b"v1" * 1000)
    store.put_file(tmp_path / "weights", "models/m/data/model.pth")
    store.copy("models/m/data/model.pth", "data/sha256/ab/abcd")
    src, dst = store.local_path("models/m/data/model.pth"), store.local_path("data/sha256/ab/abcd")
    assert src is not None and dst is not None and src.stat().st_ino == dst.stat().st_ino
    (tmp_path / "weights").write_bytes(b"v2")
    store.put_file(tmp_path / "weights", "models/m/data/model.pth")
    store.delete("models/m/data/model.pth")
    assert dst.read_bytes() == b"v1" * 1000
    assert [p.name for p in dst.parent.iterdir()] == ["abcd"]  # no temporary name left behind
    with pytest.raises(NotFound):
        store.copy("models/m/data/gone", "data/x")

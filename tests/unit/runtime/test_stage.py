"""Datasets staged into jobs through the content-addressed cache (runtime/stage.py)."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kiln.injob import stage
from kiln.injob.stage import StageError, StageStopped

RUNTIME_DIR = os.path.dirname(os.path.abspath(stage.__file__))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_input(
    name: str,
    version: int,
    files: dict[str, bytes],
    source: Any,
    path: str | None = None,
    mode: str = "stage",
) -> dict:
    """An input as the shim passes it; ``source(relpath, data)`` gives each file's source."""
    return {
        "name": name,
        "version": version,
        "path": f"/data/{name}" if path is None else path,
        "env": "KILN_INPUT_" + name.upper().replace("-", "_").replace(".", "_"),
        "mode": mode,
        "files": [
            {"path": rel, "size": len(data), "sha256": sha(data), "source": source(rel, data)}
            for rel, data in files.items()
        ],
    }


class LocalStore:
    """The default object store: one local file per blob."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def __call__(self, rel: str, data: bytes) -> str:
        path = self.root / sha(data)
        path.write_bytes(data)
        return str(path)


class Server:
    """A tiny HTTP object store: GET /<sha256>?X-Amz-Signature=... serves the blob's bytes."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.requests: list[str] = []
        self.corrupt: set[str] = set()
        self.status: dict[str, list[int]] = {}  # statuses to answer first, per blob
        self.delay = 0.0
        self.stall: set[str] = set()
        self.short: set[str] = set()  # sent with a full Content-Length, then cut off
        self.lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                key = self.path.split("?", 1)[0].lstrip("/")
                with server.lock:
                    server.requests.append(key)
                    codes = server.status.get(key)
                    code = codes.pop(0) if codes else 200
                data = server.blobs.get(key)
                if data is None or code != 200:
                    self.send_error(404 if data is None else code)
                    return
                if key in server.corrupt:
                    data = bytes([data[0] ^ 1]) + data[1:]
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if key in server.short:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if key in server.stall:
                    self.wfile.write(data[:1])
                    self.wfile.flush()
                    time.sleep(20)
                    return
                time.sleep(server.delay)
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def __call__(self, rel: str, data: bytes) -> str:
        self.blobs[sha(data)] = data
        port = self.httpd.server_address[1]
        return f"http://127.0.0.1:{port}/{sha(data)}?X-Amz-Signature=secret{len(self.blobs)}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[Server]:
    srv = Server()
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "store")


@pytest.fixture
def cache(tmp_path: Path) -> dict:
    return {"dir": str(tmp_path / "cache"), "max_bytes": 10 * 1024 * 1024}


class Log(list):
    def __call__(self, text: str) -> None:
        self.append(text)


def run(inputs: list[dict], cache: dict, work: Path, holder: str = "job1-1-worker0", **kwargs: Any) -> tuple[dict, Log]:
    log = Log()
    return stage.stage_inputs(inputs, cache, str(work), log=log, holder=holder, **kwargs), log


def trees(cache: dict) -> list[str]:
    return sorted(n for n in os.listdir(os.path.join(cache["dir"], "trees")) if not n.startswith("."))


def blobs(cache: dict) -> list[str]:
    root = os.path.join(cache["dir"], "blobs")
    return sorted(b for d in os.listdir(root) for b in os.listdir(os.path.join(root, d)))


def leftovers(cache: dict) -> list[str]:
    """Temp files and half-built trees (there should be none once staging has returned)."""
    root = cache["dir"]
    return os.listdir(os.path.join(root, "tmp")) + [
        n for n in os.listdir(os.path.join(root, "trees")) if n.startswith(".")
    ]


FILES = {"train/a.npy": b"A" * 1000, "train/b.npy": b"B" * 2000, "labels.txt": b"0\n1\n"}


# -- staging and placement ----------------------------------------------------------------------------------


def test_local_sources_are_staged_verified_and_linked(tmp_path: Path, store: LocalStore, cache: dict) -> None:
    work = tmp_path / "work"
    env, log = run([make_input("mnist", 3, FILES, store)], cache, work)
    tree = env["KILN_INPUT_MNIST"]
    assert os.path.isabs(tree) and tree == os.path.realpath(tree)
    assert os.path.basename(tree).startswith("mnist@3-")
    assert os.path.dirname(tree) == os.path.join(os.path.realpath(cache["dir"]), "trees")
    for rel, data in FILES.items():
        assert (work / "data/mnist" / rel).read_bytes() == data
        blob = Path(cache["dir"], "blobs", sha(data)[:2], sha(data))
        assert os.path.samefile(blob, Path(tree, rel))  # a hardlink, not a copy
        assert stat.S_IMODE(blob.stat().st_mode) == 0o444
    assert os.readlink(work / "data/mnist") == tree
    assert leftovers(cache) == []
    assert os.listdir(os.path.join(cache["dir"], "locks")) == []
    [line] = log
    assert "input mnist@3: 3 files" in line and "3 downloaded" in line and "0 from the cache" in line
    assert "/data/mnist" in line and "$KILN_INPUT_MNIST" in line


def test_second_staging_is_a_cache_hit_without_touching_the_sources(
    tmp_path: Path, store: LocalStore, cache: dict
) -> None:
    item = make_input("mnist", 3, FILES, store)
    env1, _ = run([item], cache, tmp_path / "w1", holder="job1-1-w0")
    for path in store.root.iterdir():  # no source may be opened again
        path.unlink()
    env2, log = run([item], cache, tmp_path / "w2", holder="job2-1-w0")
    assert env1 == env2
    assert (tmp_path / "w2/data/mnist/train/b.npy").read_bytes() == FILES["train/b.npy"]
    assert "all from the cache" in log[0]


def test_http_sources_are_fetched_once_and_then_hit(tmp_path: Path, server: Server, cache: dict) -> None:
    files = dict(FILES, **{"dup/a.npy": FILES["train/a.npy"]})  # same content twice: one blob, one request
    item = make_input("mnist", 3, files, server)
    env, log = run([item], cache, tmp_path / "w1", holder="job1-1-w0")
    assert sorted(server.requests) == sorted({sha(d) for d in files.values()})
    assert (tmp_path / "w1/data/mnist/dup/a.npy").read_bytes() == FILES["train/a.npy"]
    assert "4 downloaded" in log[0]
    server.requests.clear()
    env2, log2 = run([item], cache, tmp_path / "w2", holder="job2-1-w0")
    assert "all from the cache" in log2[0]
    assert server.requests == [] and env2 == env
    # A new version sharing blobs downloads only what is new.
    item2 = make_input("mnist", 4, dict(files, **{"new.txt": b"new"}), server)
    run([item2], cache, tmp_path / "w3", holder="job3-1-w0")
    assert server.requests == [sha(b"new")]


def test_corrupted_download_fails_and_leaves_the_cache_clean(tmp_path: Path, server: Server, cache: dict) -> None:
    item = make_input("mnist", 3, {"ok.txt": b"fine", "bad.bin": b"x" * 5000}, server)
    server.corrupt.add(sha(b"x" * 5000))
    with pytest.raises(StageError) as err:
        run([item], cache, tmp_path / "work")
    message = str(err.value)
    assert "mnist@3" in message and "bad.bin" in message and "SHA-256" in message
    assert "secret" not in message  # the presigned URL's signature stays out of logs
    assert sha(b"x" * 5000) not in blobs(cache)
    assert trees(cache) == [] and leftovers(cache) == []
    assert not (tmp_path / "work/data/mnist").exists()


def test_wrong_size_and_missing_source_name_the_file(tmp_path: Path, store: LocalStore, cache: dict) -> None:
    item = make_input("mnist", 3, {"a.txt": b"abc"}, store)
    item["files"][0]["size"] = 2
    with pytest.raises(StageError, match=r"mnist@3: file a\.txt: .*more than the manifest's 2 bytes"):
        run([item], cache, tmp_path / "work")
    item = make_input("mnist", 3, {"a.txt": b"abc"}, lambda rel, data: str(tmp_path / "nowhere"))
    with pytest.raises(StageError, match=r"mnist@3: file a\.txt: cannot read .*nowhere"):
        run([item], cache, tmp_path / "work")
    assert blobs(cache) == [] and leftovers(cache) == []


def test_http_errors_expired_url_and_retry(
    tmp_path: Path, server: Server, cache: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    item = make_input("mnist", 3, {"a.txt": b"abc"}, server)
    server.status[sha(b"abc")] = [403]
    with pytest.raises(StageError, match=r"mnist@3: file a\.txt: HTTP 403 .*expired"):
        run([item], cache, tmp_path / "work")
    assert len(server.requests) == 1  # not retried
    server.requests.clear()
    server.status[sha(b"abc")] = [503]
    monkeypatch.setattr(stage.time, "sleep", lambda s: None)
    run([item], cache, tmp_path / "work")  # a transient error is retried
    assert len(server.requests) == 2


def test_truncated_response_is_retried_then_fails(
    tmp_path: Path, server: Server, cache: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = b"t" * 50_000
    item = make_input("mnist", 3, {"cut.bin": data}, server)
    server.short.add(sha(data))
    monkeypatch.setattr(stage.time, "sleep", lambda s: None)
    with pytest.raises(StageError, match=r"input mnist@3: file cut\.bin: .*\(3 tries\)"):
        run([item], cache, tmp_path / "work")
    assert len(server.requests) == 3
    assert blobs(cache) == [] and leftovers(cache) == []


def test_progress_lines_while_downloading(
    tmp_path: Path, store: LocalStore, cache: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stage, "PROGRESS_SECONDS", 0.0)
    _, log = run([make_input("mnist", 3, FILES, store)], cache, tmp_path / "work")
    assert any(line.startswith("input mnist@3: downloaded ") and " of 2.9 KiB (" in line for line in log)
    assert log[-1].startswith("input mnist@3: 3 files")


def test_tree_is_read_only(tmp_path: Path, store: LocalStore, cache: dict) -> None:
    env, _ = run([make_input("mnist", 3, FILES, store)], cache, tmp_path / "work")
    tree = Path(env["KILN_INPUT_MNIST"])
    # Tests run as root here, where permission bits do not stop writes: the mode bits are what is checked;
    # as another user, writing is refused as well.
    for path in [tree, tree / "train"]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o555
    for path in [tree / "labels.txt", tree / "train/a.npy"]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o444
    if os.geteuid() != 0:
        with pytest.raises(PermissionError):
            (tree / "labels.txt").write_bytes(b"changed")
        with pytest.raises(PermissionError):
            (tree / "new.txt").write_bytes(b"new")


def test_link_failure_falls_back_to_copies(
    tmp_path: Path, store: LocalStore, cache: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_link(src: str, dst: str) -> None:
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(stage.os, "link", no_link)
    env, log = run([make_input("mnist", 3, FILES, store)], cache, tmp_path / "work")
    tree = Path(env["KILN_INPUT_MNIST"])
    assert (tree / "train/a.npy").read_bytes() == FILES["train/a.npy"]
    assert stat.S_IMODE((tree / "train/a.npy").stat().st_mode) == 0o444
    assert "copied (no hardlinks)" in log[0]
    index = json.loads(Path(cache["dir"], "index", os.path.basename(tree) + ".json").read_text())
    assert index["copied_bytes"] == sum(len(d) for d in FILES.values())


def test_placement_absolute_and_relative_paths(tmp_path: Path, store: LocalStore, cache: dict) -> None:
    work = tmp_path / "work"
    inputs = [
        make_input("mnist", 3, FILES, store, path="/data/mnist"),
        make_input("cifar", 1, {"x": b"x"}, store, path="inputs//cifar/./v1"),
    ]
    env, _ = run(inputs, cache, work)
    assert os.readlink(work / "data/mnist") == env["KILN_INPUT_MNIST"]
    assert os.readlink(work / "inputs/cifar/v1") == env["KILN_INPUT_CIFAR"]
    assert (work / "inputs/cifar/v1/x").read_bytes() == b"x"
    env2, _ = run(inputs, cache, work)  # a second attempt in the same work dir replaces the symlinks
    assert env2 == env and os.readlink(work / "data/mnist") == env["KILN_INPUT_MNIST"]


def test_placement_never_leaves_the_work_dir(tmp_path: Path, store: LocalStore, cache: dict) -> None:
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (work / "data").symlink_to(outside)  # e.g. from the job's code
    with pytest.raises(StageError, match=r"mnist@3: cannot place it at /data/mnist: data in the work dir"):
        run([make_input("mnist", 3, FILES, store)], cache, work)
    assert list(outside.iterdir()) == []
    (work / "data").unlink()
    (work / "data/mnist").mkdir(parents=True)
    with pytest.raises(StageError, match="already exists in the work dir"):
        run([make_input("mnist", 3, FILES, store)], cache, work)


@pytest.mark.parametrize("bad", ["../x", "/a/../../b", "a\\b", "a/../b", "a//b", "./a", "", "a\x00b", "a/"])
def test_traversal_in_the_manifest_is_refused(tmp_path: Path, store: LocalStore, cache: dict, bad: str) -> None:
    item = make_input("mnist", 3, {"ok": b"ok"}, store)
    item["files"].append({"path": bad, "size": 1, "sha256": sha(b"z"), "source": store("z", b"z")})
    with pytest.raises(StageError, match=r"input mnist@3: file .* refused"):
        run([item], cache, tmp_path / "work")
    assert not (tmp_path / "work").exists()
    assert not os.path.exists(cache["dir"]) or (blobs(cache) == [] and trees(cache) == [])


@pytest.mark.parametrize("bad", ["../x", "/a/../../b", "a\\b", "/", "", "x/.."])
def test_traversal_in_the_path_is_refused(tmp_path: Path, store: LocalStore, cache: dict, bad: str) -> None:
    item = make_input("mnist", 3, {"ok": b"ok"}, store, path=bad)
    with pytest.raises(StageError, match=r"input mnist@3: path .* refused"):
        run([item], cache, tmp_path / "work")
    assert not (tmp_path / "work").exists() and not (tmp_path / "x").exists()


def test_manifest_checks(tmp_path: Path, store: LocalStore, cache: dict) -> None:
    item = make_input("mnist", 3, {"a": b"1", "a/b": b"2"}, store)
    with pytest.raises(StageError, match="a is both a file and a directory"):
        run([item], cache, tmp_path / "work")
    item = make_input("mnist", 3, {"a": b"1"}, store)
    item["files"].append(dict(item["files"][0]))
    with pytest.raises(StageError, match="listed twice"):
        run([item], cache, tmp_path / "work")
    item = make_input("mnist", 3, {"a": b"1"}, store)
    item["files"][0]["sha256"] = "../../etc"
    with pytest.raises(StageError, match="not a SHA-256"):
        run([item], cache, tmp_path / "work")
    item = make_input("mnist", 3, {"a": b"1"}, store)
    item["name"] = "../evil"
    with pytest.raises(StageError, match="not a dataset name"):
        run([item], cache, tmp_path / "work")
    a, b = make_input("mnist", 3, {"a": b"1"}, store), make_input("other", 1, {"a": b"1"}, store)
    b["path"] = "/data/mnist/sub"
    with pytest.raises(StageError, match="overlap"):
        run([a, b], cache, tmp_path / "work")
    with pytest.raises(StageError, match="not a cache holder name"):
        run([a], cache, tmp_path / "work", holder="../x")


# -- LRU eviction -------------------------------------------------------------------------------------------


def dataset(name: str, store: LocalStore, size: int = 1000, version: int = 1) -> dict:
    return make_input(name, version, {"f.bin": name.encode() * (size // len(name))}, store)


def age(cache: dict, env: dict, seconds: float) -> None:
    """Make a tree's last use ``seconds`` ago."""
    for tree in env.values():
        index = os.path.join(cache["dir"], "index", os.path.basename(tree) + ".json")
        when = time.time() - seconds
        os.utime(index, (when, when))


def test_lru_eviction_keeps_trees_in_use_and_evicts_old_ones(tmp_path: Path, store: LocalStore, cache: dict) -> None:
    cache["max_bytes"] = 2500
    env_a, _ = run([dataset("aaaa", store)], cache, tmp_path / "wa", holder="ja-1-w0")
    stage.release(cache, "ja-1-w0")
    age(cache, env_a, 300)
    env_b, _ = run([dataset("bbbb", store)], cache, tmp_path / "wb", holder="jb-1-w0")  # kept in use
    age(cache, env_b, 600)  # the oldest, but in use
    env_c, log = run([dataset("cccc", store)], cache, tmp_path / "wc", holder="jc-1-w0")
    assert trees(cache) == sorted(os.path.basename(t) for t in [*env_b.values(), *env_c.values()])
    assert sha(b"aaaa" * 250) not in blobs(cache)
    assert any("evicted 1 trees and 1 blobs" in line for line in log)
    assert not os.path.exists(os.path.join(cache["dir"], "index", os.path.basename(env_a["KILN_INPUT_AAAA"])))
    # Everything in use: over the limit, nothing evicted, staging still succeeds.
    env_d, log = run([dataset("dddd", store)], cache, tmp_path / "wd", holder="jd-1-w0")
    assert len(trees(cache)) == 3 and any("over its limit" in line for line in log)
    # Released trees go, least recently used first.
    for holder in ("jb-1-w0", "jc-1-w0"):
        stage.release(cache, holder)
    age(cache, env_c, 100)
    age(cache, env_b, 50)
    stage.evict(cache)
    assert trees(cache) == sorted(os.path.basename(t) for t in [*env_b.values(), *env_d.values()])


def test_a_kept_tree_keeps_its_blobs(tmp_path: Path, store: LocalStore, cache: dict) -> None:
    shared = b"s" * 1500
    v1 = make_input("ds", 1, {"shared.bin": shared, "old.bin": b"o" * 1000}, store)
    v2 = make_input("ds", 2, {"shared.bin": shared, "new.bin": b"n" * 1000}, store)
    env1, _ = run([v1], cache, tmp_path / "w1", holder="j1-1-w0")
    stage.release(cache, "j1-1-w0")
    age(cache, env1, 100)
    cache["max_bytes"] = 3000
    env2, _ = run([v2], cache, tmp_path / "w2", holder="j2-1-w0")
    assert trees(cache) == [os.path.basename(env2["KILN_INPUT_DS"])]
    assert blobs(cache) == sorted([sha(shared), sha(b"n" * 1000)])  # the shared blob stays
    stage.release(cache, "j2-1-w0")
    cache["max_bytes"] = 0
    stage.evict(cache)
    assert trees(cache) == [] and blobs(cache) == []


def test_stale_holder_is_ignored_and_removed(tmp_path: Path, store: LocalStore, cache: dict) -> None:
    env_a, _ = run([dataset("aaaa", store)], cache, tmp_path / "wa", holder="ja-1-w0")
    record = Path(cache["dir"], "inuse", "ja-1-w0")
    data = json.loads(record.read_text())
    assert data["pid"] == os.getpid() and data["trees"] == [os.path.basename(env_a["KILN_INPUT_AAAA"])]
    dead = subprocess.Popen(["true"])
    dead.wait()
    data["pid"] = dead.pid
    record.write_text(json.dumps(data))
    age(cache, env_a, 300)
    cache["max_bytes"] = 1500
    run([dataset("bbbb", store)], cache, tmp_path / "wb", holder="jb-1-w0")
    assert not record.exists()
    assert len(trees(cache)) == 1 and "bbbb" in trees(cache)[0]
    # A reused pid (same number, another process start) is stale as well.
    assert not stage.alive(os.getpid(), "1")
    assert stage.alive(os.getpid(), stage.proc_start(os.getpid()))


def test_release_is_idempotent_and_marks_last_use(tmp_path: Path, store: LocalStore, cache: dict) -> None:
    env, _ = run([dataset("aaaa", store)], cache, tmp_path / "wa", holder="ja-1-w0")
    age(cache, env, 1000)
    stage.release(cache, "ja-1-w0")
    stage.release(cache, "ja-1-w0")
    index = os.path.join(cache["dir"], "index", os.path.basename(env["KILN_INPUT_AAAA"]) + ".json")
    assert time.time() - os.stat(index).st_mtime < 60
    assert os.listdir(os.path.join(cache["dir"], "inuse")) == []


def test_leftovers_of_dead_stagers_are_swept(tmp_path: Path, store: LocalStore, cache: dict) -> None:
    run([dataset("aaaa", store)], cache, tmp_path / "wa", holder="ja-1-w0")
    dead = subprocess.Popen(["true"])
    dead.wait()
    root = cache["dir"]
    Path(root, "tmp", f"{dead.pid}.abcd.{'0' * 64}").write_bytes(b"partial")
    Path(root, "trees", f".tmp.{dead.pid}.abcd.x@1-000000000000", "sub").mkdir(parents=True)
    os.chmod(Path(root, "trees", f".tmp.{dead.pid}.abcd.x@1-000000000000", "sub"), 0o555)
    mine = Path(root, "tmp", f"{os.getpid()}.abcd.{'1' * 64}")
    mine.write_bytes(b"in progress")
    stage.evict(cache)  # under the limit: only sweeps
    assert leftovers(cache) == [mine.name]


# -- concurrency --------------------------------------------------------------------------------------------


def test_concurrent_threads_share_one_download(tmp_path: Path, server: Server, cache: dict) -> None:
    server.delay = 0.2
    item = make_input("mnist", 3, FILES, server)
    results: dict[int, Any] = {}

    def job(i: int) -> None:
        try:
            results[i] = run([item], cache, tmp_path / f"w{i}", holder=f"job{i}-1-w0")[0]
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=job, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(isinstance(r, dict) for r in results.values()), results
    assert len({r["KILN_INPUT_MNIST"] for r in results.values()}) == 1
    assert sorted(server.requests) == sorted(sha(d) for d in FILES.values())  # each blob fetched once
    for i in range(3):
        assert (tmp_path / f"w{i}/data/mnist/train/b.npy").read_bytes() == FILES["train/b.npy"]
    assert leftovers(cache) == [] and len(trees(cache)) == 1


CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import stage
inputs, cache, work, holder = json.loads(sys.argv[2])
print(json.dumps(stage.stage_inputs(inputs, cache, work, log=lambda line: None, holder=holder)))
"""


def test_concurrent_processes_isolated_standard_library_only(tmp_path: Path, store: LocalStore, cache: dict) -> None:
    files = {f"part{i}.bin": os.urandom(3 * 1024 * 1024) for i in range(4)}
    item = make_input("big", 1, files, store)
    procs = [
        subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", CHILD, RUNTIME_DIR,
             json.dumps([[item], cache, str(tmp_path / f"w{i}"), f"job{i}-1-w0"])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(3)
    ]  # fmt: skip
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [o[1] for o in outs]
    envs = [json.loads(out) for out, _ in outs]
    assert envs[0] == envs[1] == envs[2]
    tree = Path(envs[0]["KILN_INPUT_BIG"])
    for rel, data in files.items():
        assert hashlib.sha256((tree / rel).read_bytes()).hexdigest() == sha(data)
        assert (tmp_path / "w2/data/big" / rel).stat().st_size == len(data)
    assert blobs(cache) == sorted(sha(d) for d in files.values())
    assert leftovers(cache) == [] and len(trees(cache)) == 1


# -- stop --------------------------------------------------------------------------------------------------


def test_stop_aborts_a_stalled_download(tmp_path: Path, server: Server, cache: dict) -> None:
    data = b"q" * 100_000
    item = make_input("mnist", 3, {"slow.bin": data}, server)
    server.stall.add(sha(data))
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    started = time.monotonic()
    with pytest.raises(StageStopped, match=r"mnist@3: stopped while downloading slow\.bin"):
        run([item], cache, tmp_path / "work", stop=stop)
    assert time.monotonic() - started < 5
    assert blobs(cache) == [] and leftovers(cache) == []


def test_no_inputs_touch_nothing(tmp_path: Path, cache: dict) -> None:
    assert run([], cache, tmp_path / "work")[0] == {}
    assert not os.path.exists(cache["dir"])


def test_http_length_differing_from_the_manifest_is_not_retried(tmp_path: Path, server: Server, cache: dict) -> None:
    item = make_input("mnist", 3, {"a.txt": b"abcdef"}, server)
    item["files"][0]["size"] = 4
    with pytest.raises(StageError, match=r"mnist@3: file a\.txt: .* has 6 bytes, the manifest says 4"):
        run([item], cache, tmp_path / "work")
    assert len(server.requests) == 1 and blobs(cache) == [] and leftovers(cache) == []


def test_a_tree_being_built_keeps_its_blobs(tmp_path: Path, store: LocalStore, cache: dict) -> None:
    shared = b"s" * 1000
    env_x, _ = run([make_input("xx", 1, {"s.bin": shared}, store)], cache, tmp_path / "wx", holder="jx-1-w0")
    stage.release(cache, "jx-1-w0")
    # Another job has registered a tree with the same blob and is still building it.
    other = stage.Input(make_input("yy", 1, {"s.bin": shared, "y.bin": b"y"}, store))
    stage.register(os.path.realpath(cache["dir"]), "jy-1-w0", [other], None)
    cache["max_bytes"] = 0
    stage.evict(cache)
    assert trees(cache) == [] and blobs(cache) == [sha(shared)]
    assert os.path.exists(os.path.join(cache["dir"], "index", other.tree + ".json"))
    assert not os.path.exists(os.path.join(cache["dir"], "index", os.path.basename(env_x["KILN_INPUT_XX"]) + ".json"))


def test_a_tree_an_unsandboxed_job_saw_is_hashed_again_before_reuse(tmp_path: Path, cache: dict) -> None:
    """As root and unsandboxed, a job writes through the read-only modes into the hard-linked blob, size unchanged;
    the next job must still read the dataset's bytes, not the job's."""
    files = {"f.txt": b"original bytes\n", "g.txt": b"other\n"}
    item = make_input("toy", 1, files, LocalStore(tmp_path / "store"))
    env, _ = run([item], cache, tmp_path / "w1", "job1-1-worker0", exposed=True)
    tree = Path(env["KILN_INPUT_TOY"])
    target = tree / "f.txt"
    os.chmod(target, 0o644)  # what root could do anyway
    with open(target, "r+b") as fh:
        fh.write(b"X")
    os.chmod(target, 0o444)
    stage.release(cache, "job1-1-worker0")
    env, log = run([item], cache, tmp_path / "w2", "job2-1-worker0")
    assert (Path(env["KILN_INPUT_TOY"]) / "f.txt").read_bytes() == b"original bytes\n"
    assert any("damaged" in line and "SHA-256" in line for line in log), log
    # Hashed and found intact once, a tree used only by sandboxed jobs is not hashed again.
    stage.release(cache, "job2-1-worker0")
    env, log = run([item], cache, tmp_path / "w3", "job3-1-worker0")
    assert any("all from the cache" in line for line in log) and not any("SHA-256" in line for line in log), log

"""``mode: mount`` inputs through real FUSE filesystems: rclone over a local store and over an S3-protocol server
(moto), s3fs over the same, as the shim mounts them (``kiln.injob.stage`` / ``kiln.injob.mount``)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kiln.injob import mount as mount_module
from kiln.injob import stage
from kiln.injob.stage import StageError
from tests.s3server import ACCESS_KEY, REGION, SECRET_KEY, S3Server

pytestmark = pytest.mark.needs("fuse")

ORG_PREFIX = "orgs/org1/data/sha256"
FILES = {"a.txt": b"alpha\n", "sub/b.bin": os.urandom(300_000), "sub/deeper/c.csv": b"x,y\n1,2\n"}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def mount_input(files: dict[str, bytes], name: str = "digits", path: str | None = None) -> dict:
    return {
        "name": name,
        "version": 2,
        "path": path or f"/data/{name}",
        "env": f"KILN_INPUT_{name.upper()}",
        "mode": "mount",
        "files": [{"path": rel, "size": len(data), "sha256": sha(data)} for rel, data in files.items()],
    }


def put_local(root: Path, files: dict[str, bytes]) -> None:
    for data in files.values():
        blob = root / ORG_PREFIX / sha(data)[:2] / sha(data)
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)


class Log(list):
    def __call__(self, text: str) -> None:
        self.append(text)


def mounts_under(path: Path) -> list[tuple[str, str]]:
    """(mount point, filesystem type) of every mount below ``path``."""
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            fstype = fields[fields.index("-") + 1]
            if fields[4].startswith(str(path)):
                found.append((fields[4], fstype))
    return found


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    server = S3Server().start()
    yield server
    server.stop()


def s3_source(s3: S3Server, files: dict[str, bytes], bucket: str) -> dict:
    s3.create_bucket(bucket)
    client = s3.client()
    for data in files.values():
        client.put_object(Bucket=bucket, Key=f"kiln/{ORG_PREFIX}/{sha(data)[:2]}/{sha(data)}", Body=data)
    # Another organisation's blob, right beside this one's prefix: it must stay out of sight.
    client.put_object(Bucket=bucket, Key=f"kiln/orgs/org2/data/sha256/{sha(b'theirs')[:2]}/{sha(b'theirs')}", Body=b"x")
    return {"kind": "s3", "bucket": bucket, "prefix": f"kiln/{ORG_PREFIX}", "endpoint": s3.endpoint, "region": REGION}


def run_mount(
    tmp_path: Path, source: dict, tools: list[str], inputs: list[dict], holder: str = "job1-1-worker0", **kwargs: Any
) -> tuple:
    log: Log = Log()
    helpers: set[int] = set()
    cfg = {"tools": tools, "source": source, "dir": str(tmp_path / "attempt/mount"), **kwargs}
    env = stage.stage_inputs(
        inputs,
        {"dir": str(tmp_path / "cache")},
        str(tmp_path / "work"),
        log=log,
        holder=holder,
        mount=cfg,
        helpers=helpers,
    )
    return env, log, helpers


def assert_mounted_view(tmp_path: Path, env: dict, fstype: str) -> Path:
    tree = Path(env["KILN_INPUT_DIGITS"])
    seen = tmp_path / "work/data/digits"
    assert seen.resolve() == tree.resolve()
    for rel, data in FILES.items():
        assert (seen / rel).read_bytes() == data
        target = Path(os.readlink(tree / rel))
        assert target.parent.name == sha(data)[:2] and target.name == sha(data)
    assert mounts_under(tmp_path / "attempt") == [(str(tmp_path / "attempt/mount/mnt"), fstype)]
    # The dataset's bytes are read-only for everyone, root included: the filesystem itself refuses writes.
    for rel in FILES:
        with pytest.raises(OSError) as caught:
            (seen / rel).write_bytes(b"no")
        assert caught.value.errno == errno.EROFS
    assert oct(tree.stat().st_mode & 0o777) == "0o555" and oct((tree / "sub").stat().st_mode & 0o777) == "0o555"
    assert not (tmp_path / "cache").exists()  # nothing was staged, nothing downloaded
    return tree


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] in ("Z", "X")
    except FileNotFoundError:
        return True


def assert_unmounted(tmp_path: Path) -> None:
    """Nothing mounted, and of the mount's directory only its lock and the tool's log are left."""
    assert mounts_under(tmp_path / "attempt") == []
    left = sorted(os.listdir(tmp_path / "attempt/mount"))
    assert set(left) <= {"lock", "rclone.log", "s3fs.log"}, left


def assert_released(tmp_path: Path, helpers: set[int], holder: str = "job1-1-worker0") -> None:
    stage.release({"dir": str(tmp_path / "cache")}, holder)
    assert_unmounted(tmp_path)
    assert all(gone(pid) for pid in helpers)
    assert (tmp_path / "work/data/digits").is_symlink()  # the link stays; it leads nowhere now


def test_rclone_mounts_a_local_store_read_only_and_unmounts(tmp_path: Path) -> None:
    put_local(tmp_path / "store", FILES)
    put_local(tmp_path / "store", {"theirs": b"org2"})  # (in this org's prefix: every blob of it is visible)
    source = {"kind": "local", "path": str(tmp_path / "store" / ORG_PREFIX)}
    env, log, helpers = run_mount(tmp_path, source, ["rclone"], [mount_input(FILES)])
    assert_mounted_view(tmp_path, env, "fuse.rclone")
    assert len(helpers) == 1
    assert len(log) == 1 and "input digits@2: 3 files" in log[0]
    assert "mounted read-only with rclone, nothing downloaded" in log[0] and "($KILN_INPUT_DIGITS)" in log[0]
    assert_released(tmp_path, helpers)


@pytest.mark.parametrize("tool", ["rclone", "s3fs"])
def test_an_s3_store_is_mounted_at_the_organisations_prefix_only(tmp_path: Path, s3: S3Server, tool: str) -> None:
    source = s3_source(s3, FILES, f"mount-{tool}-{os.getpid()}")
    secret = tmp_path / "attempt" / mount_module.SECRET_FILE
    secret.parent.mkdir(parents=True)
    secret.write_text(json.dumps({"access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY}))
    env, log, helpers = run_mount(tmp_path, source, [tool], [mount_input(FILES)], secret_file=str(secret))
    assert_mounted_view(tmp_path, env, f"fuse.{tool}")
    assert f"mounted read-only with {tool}" in log[0]
    point = tmp_path / "attempt/mount/mnt"
    assert not list(point.glob(f"*/{sha(b'theirs')}"))  # organisation 2's blob is outside the mount
    assert not (point / "orgs").exists() and not (point.parent / "private").exists()
    # The credentials are gone from disk once mounted, and never were in the tool's command line.
    assert not secret.exists()
    (pid,) = helpers
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        cmdline += Path(f"/proc/{child}/cmdline").read_bytes()
    assert SECRET_KEY.encode() not in cmdline
    assert_released(tmp_path, helpers)


def test_staged_and_mounted_inputs_side_by_side(tmp_path: Path) -> None:
    put_local(tmp_path / "store", FILES)
    labels = {"labels.txt": b"0\n1\n"}
    blob = tmp_path / "blobs" / sha(labels["labels.txt"])
    blob.parent.mkdir()
    blob.write_bytes(labels["labels.txt"])
    staged = {
        "name": "labels",
        "version": 1,
        "path": "/data/labels",
        "env": "KILN_INPUT_LABELS",
        "mode": "stage",
        "files": [{"path": "labels.txt", "size": 4, "sha256": sha(labels["labels.txt"]), "source": str(blob)}],
    }
    source = {"kind": "local", "path": str(tmp_path / "store" / ORG_PREFIX)}
    env, log, helpers = run_mount(tmp_path, source, ["rclone"], [mount_input(FILES), staged])
    assert (Path(env["KILN_INPUT_LABELS"]) / "labels.txt").read_bytes() == b"0\n1\n"
    assert (tmp_path / "work/data/labels/labels.txt").stat().st_nlink >= 2  # a hardlink into the cache
    assert (tmp_path / "work/data/digits/a.txt").read_bytes() == b"alpha\n"
    assert [line.split(":")[0] for line in log] == ["input digits@2", "input labels@1"]
    assert_released(tmp_path, helpers)


def test_the_members_of_an_attempt_share_one_mount_until_the_last_leaves(tmp_path: Path) -> None:
    put_local(tmp_path / "store", FILES)
    source = {"kind": "local", "path": str(tmp_path / "store" / ORG_PREFIX)}
    env0, _, helpers0 = run_mount(tmp_path, source, ["rclone"], [mount_input(FILES)], holder="job1-1-worker0")
    env1, log1, helpers1 = run_mount(tmp_path, source, ["rclone"], [mount_input(FILES)], holder="job1-1-worker1")
    assert env0 == env1 and len(helpers0) == 1 and helpers1 == set()  # the second joined the first one's mount
    assert "mounted read-only with rclone" in log1[0]
    assert len(mounts_under(tmp_path / "attempt")) == 1
    stage.release({"dir": str(tmp_path / "cache")}, "job1-1-worker0")  # the one that mounted leaves first
    assert (tmp_path / "work/data/digits/sub/b.bin").read_bytes() == FILES["sub/b.bin"]
    assert not any(gone(pid) for pid in helpers0)
    assert_released(tmp_path, helpers0, holder="job1-1-worker1")


def test_an_input_without_files_is_an_empty_tree(tmp_path: Path) -> None:
    (tmp_path / "store" / ORG_PREFIX).mkdir(parents=True)
    source = {"kind": "local", "path": str(tmp_path / "store" / ORG_PREFIX)}
    env, log, helpers = run_mount(tmp_path, source, ["rclone"], [mount_input({})])
    assert os.listdir(env["KILN_INPUT_DIGITS"]) == [] and "0 files" in log[0]
    assert_released(tmp_path, helpers)


def test_a_blob_missing_from_the_store_fails_before_the_command_and_unmounts(tmp_path: Path) -> None:
    put_local(tmp_path / "store", {"other": b"something else"})
    source = {"kind": "local", "path": str(tmp_path / "store" / ORG_PREFIX)}
    with pytest.raises(StageError, match=r"input digits@2: file a\.txt cannot be read through the rclone mount"):
        run_mount(tmp_path, source, ["rclone"], [mount_input(FILES)])
    assert_unmounted(tmp_path)


def test_a_store_that_is_down_fails_with_what_the_tool_said(tmp_path: Path, s3: S3Server) -> None:
    source = dict(s3_source(s3, FILES, f"mount-down-{os.getpid()}"), endpoint="http://127.0.0.1:9")
    secret = tmp_path / "attempt" / mount_module.SECRET_FILE
    secret.parent.mkdir(parents=True)
    secret.write_text(json.dumps({"access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY}))
    started = time.monotonic()
    with pytest.raises(StageError, match=r"input digits@2: file a\.txt cannot be read through the rclone mount"):
        run_mount(tmp_path, source, ["rclone"], [mount_input(FILES)], secret_file=str(secret))
    assert time.monotonic() - started < 60
    assert_unmounted(tmp_path)
    assert not secret.exists()


def test_a_tool_that_cannot_mount_names_itself_and_its_words(tmp_path: Path, s3: S3Server) -> None:
    source = dict(s3_source(s3, FILES, f"mount-words-{os.getpid()}"), bucket="no-such-bucket")
    with pytest.raises(StageError, match=r"s3fs could not mount the store \(exit code \d+\): .*bucket"):
        run_mount(tmp_path, source, ["s3fs"], [mount_input(FILES)])
    assert_unmounted(tmp_path)
    local = {"kind": "local", "path": str(tmp_path / "store")}
    with pytest.raises(StageError, match=r"mode 'mount' is not available on this machine: s3fs cannot mount a local"):
        run_mount(tmp_path, local, ["s3fs"], [mount_input(FILES)])


def test_a_mount_whose_shims_were_killed_is_cleaned_up_by_the_executor(tmp_path: Path) -> None:
    """SIGKILL leaves a shim no chance to leave the mount: it outlives it (another member could still read
    through it) until the executor's cleanup of the lost attempt unmounts it and stops the tool."""
    put_local(tmp_path / "store", FILES)
    source = {"kind": "local", "path": str(tmp_path / "store" / ORG_PREFIX)}
    script = textwrap.dedent(
        f"""
        import json, sys, time
        from kiln.injob import stage
        cfg = {{"tools": ["rclone"], "source": {source!r}, "dir": {str(tmp_path / "attempt/mount")!r}}}
        env = stage.stage_inputs([json.loads(sys.argv[1])], {{"dir": {str(tmp_path / "cache")!r}}},
                                 {str(tmp_path / "work")!r}, log=print, holder="job1-1-worker0", mount=cfg)
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, json.dumps(mount_input(FILES))], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("ready"):
            break
    daemon = json.loads((tmp_path / "attempt/mount/daemon.json").read_text())["pid"]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert len(mounts_under(tmp_path / "attempt")) == 1 and not gone(daemon)
    secret = tmp_path / "attempt" / mount_module.SECRET_FILE
    secret.write_text("{}")
    mount_module.cleanup(str(tmp_path / "attempt/mount"), str(secret))
    assert_unmounted(tmp_path)
    assert gone(daemon) and not secret.exists()


def test_probe_mounts_an_empty_directory(tmp_path: Path) -> None:
    assert mount_module.probe("rclone", str(tmp_path / "probe")) is None
    assert not (tmp_path / "probe").exists() and mounts_under(tmp_path) == []
    assert mount_module.probe("s3fs", str(tmp_path / "probe")) is None  # s3fs cannot mount a directory: no probe

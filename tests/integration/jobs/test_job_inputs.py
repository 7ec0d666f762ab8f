"""Jobs read versioned datasets and write artifacts, on the local store and on an S3-protocol server (moto):
inputs are pinned at submit, staged read-only through the machine's cache (a second job downloads nothing), and
seen at their path inside the work dir and at $KILN_INPUT_<NAME>."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln.errors import InvalidInput
from tests.helpers import log_text, wait_for
from tests.kilnserver import KilnServer
from tests.s3server import S3Server

READER = r"""
import hashlib, os, pathlib
root = pathlib.Path(os.environ["KILN_INPUT_DIGITS"])
here = pathlib.Path("data/digits")  # /data/digits, inside the job's own root (its work dir)
assert here.resolve() == root.resolve(), (here.resolve(), root)
total = hashlib.sha256()
for f in sorted(p for p in root.rglob("*") if p.is_file()):
    total.update(f.relative_to(root).as_posix().encode() + f.read_bytes())
try:
    (root / "x").write_text("no")
    writable = True
except OSError:
    writable = False
print("digest", total.hexdigest())
print("mode", oct(root.stat().st_mode & 0o777))
print("writable" if writable else "read-only")
pathlib.Path(os.environ["KILN_OUTPUT_DIR"], "result.txt").write_text(total.hexdigest())
"""


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    server = S3Server().start()
    yield server
    server.stop()


@pytest.fixture(params=["local", "s3"])
def server(request: pytest.FixtureRequest, make_server) -> KilnServer:  # type: ignore[no-untyped-def]
    if request.param == "local":
        return make_server()  # type: ignore[no-any-return]
    s3: S3Server = request.getfixturevalue("s3")
    bucket = s3.create_bucket(f"kiln-inputs-{os.getpid()}")
    return make_server(**s3.kiln_settings(bucket))  # type: ignore[no-any-return]


def _tree(root: Path) -> str:
    files = {"a.txt": b"alpha\n", "sub/b.bin": os.urandom(200_000), "sub/deeper/c.csv": b"x,y\n1,2\n"}
    total = hashlib.sha256()
    for rel, data in sorted(files.items()):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        total.update(rel.encode() + data)
    return total.hexdigest()


def test_jobs_read_a_dataset_and_write_an_artifact(server: KilnServer, tmp_path: Path) -> None:
    client = server.client()
    digest = _tree(tmp_path / "digits")
    client.put_dataset(tmp_path / "digits", "digits")
    spec = {
        "command": [sys.executable, "-c", READER],
        "runtime": {"python": sys.executable},
        "inputs": [{"dataset": "digits"}],
    }
    first = client.submit(spec)
    assert first.spec.inputs[0].dataset == "digits@1"  # pinned at submit
    done = wait_for(client, first.id, timeout=60)
    assert done.state == "SUCCEEDED", (done.message, log_text(client, first.id))
    assert log_text(client, first.id) == [f"digest {digest}", "mode 0o555", "read-only"]
    out = client.download(first.id, tmp_path / "out")
    assert [p.read_text() for p in out] == [digest]  # the artifact went through the store
    # A second job reading the same version downloads nothing: the machine's cache has every blob.
    second = wait_for(client, client.submit(spec).id, timeout=60)
    assert second.state == "SUCCEEDED", second.message

    def staged(job_id: str) -> str:
        lines = [
            ln.text
            for ln in client.stream_logs(job_id, follow=False)
            if ln.source == "kiln" and "input digits@1" in ln.text
        ]
        assert len(lines) == 1, lines
        return lines[0]

    assert "all from the cache" not in staged(first.id)
    assert "all from the cache" in staged(second.id)


MOUNTED = r"""
import os, pathlib
link = pathlib.Path("data/digits/a.txt")
real = os.path.realpath(link)
points = {}
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    points[fields[4]] = fields[fields.index("-") + 1]
point = max((p for p in points if real.startswith(p + "/")), key=len)
print("served by", points[point])
try:
    open(link, "ab")
    print("writable")
except OSError as exc:
    print("write refused:", exc.strerror)
"""


@pytest.mark.needs("fuse")
def test_jobs_read_a_mounted_dataset_and_write_an_artifact(server: KilnServer, tmp_path: Path) -> None:
    client = server.client()
    digest = _tree(tmp_path / "digits")
    client.put_dataset(tmp_path / "digits", "digits")
    spec = {
        "command": [sys.executable, "-c", READER + MOUNTED],
        "runtime": {"python": sys.executable},
        "inputs": [{"dataset": "digits", "mode": "mount"}],
    }
    job = client.submit(spec)
    done = wait_for(client, job.id, timeout=60)
    assert done.state == "SUCCEEDED", (done.message, log_text(client, job.id))
    assert log_text(client, job.id) == [
        f"digest {digest}",
        "mode 0o555",
        "read-only",
        "served by fuse.rclone",
        "write refused: Read-only file system",
    ]
    assert [p.read_text() for p in client.download(job.id, tmp_path / "out")] == [digest]
    kiln_lines = [
        ln.text
        for ln in client.stream_logs(job.id, follow=False)
        if ln.source == "kiln" and "input digits@1" in ln.text
    ]
    assert len(kiln_lines) == 1 and "3 files" in kiln_lines[0]
    assert "mounted read-only with rclone, nothing downloaded" in kiln_lines[0]
    # Nothing was staged, and nothing stays mounted once the job has ended.
    assert not (server.home / "cache" / "data" / "blobs").exists()
    assert not any(str(server.home / "jobs") in line for line in Path("/proc/self/mountinfo").read_text().splitlines())
    assert not list((server.home / "jobs" / job.id).rglob("mount-secret.json"))


@pytest.mark.needs("fuse")
def test_each_member_of_a_gang_mounts_its_inputs(make_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = make_server(cpus="2")
    client = server.client()
    digest = _tree(tmp_path / "digits")
    client.put_dataset(tmp_path / "digits", "digits")
    spec = {
        "command": [sys.executable, "-c", READER.replace("print(", "print(os.environ['RANK'], ")],
        "runtime": {"python": sys.executable},
        "resources": {"cpus": 1},
        "distributed": {"framework": "pytorch", "workers": 2},
        "inputs": [{"dataset": "digits", "mode": "mount"}],
    }
    job = client.submit(spec)
    done = wait_for(client, job.id, timeout=60)
    assert done.state == "SUCCEEDED", (done.message, log_text(client, job.id))
    assert sorted(log_text(client, job.id)) == [
        f"0 digest {digest}",
        "0 mode 0o555",
        "0 read-only",
        f"1 digest {digest}",
        "1 mode 0o555",
        "1 read-only",
    ]
    mounted = [ln for ln in client.stream_logs(job.id, follow=False) if "mounted read-only with rclone" in ln.text]
    assert len(mounted) == 2  # one mount per member
    assert not any(str(server.home / "jobs") in line for line in Path("/proc/self/mountinfo").read_text().splitlines())


def test_a_missing_dataset_is_refused_at_submit(server: KilnServer) -> None:
    client = server.client()
    with pytest.raises(InvalidInput, match=r"inputs\[0\]\.dataset"):
        client.submit({"command": "true", "inputs": [{"dataset": "nope"}]})


def test_mount_is_refused_at_submit_where_it_cannot_work(make_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    client = make_server(mount_tools="").client()
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_text("x")
    client.put_dataset(tmp_path / "d", "digits")
    with pytest.raises(
        InvalidInput,
        match=r"inputs\[0\]\.mode: mount is not available on this machine: .*"
        r"mounting is turned off on this server \(KILN_MOUNT_TOOLS is empty\); use mode: stage",
    ):
        client.submit({"command": "true", "inputs": [{"dataset": "digits", "mode": "mount"}]})
    assert client.list_jobs() == []


WRITER = r"""
import os, pathlib
out = pathlib.Path(os.environ["KILN_OUTPUT_DIR"])
(out / "model").mkdir()
(out / "model" / "weights.bin").write_bytes(bytes(range(256)) * 40)
(out / "rows.txt").write_text("1200\n")
"""

READ_PREP = r"""
import hashlib, os, pathlib
root = pathlib.Path(os.environ["KILN_INPUT_PREP"])
print(sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()))
weights = (root / "model" / "weights.bin").read_bytes()
print((root / "rows.txt").read_text().strip(), hashlib.sha256(weights).hexdigest())
"""


def test_a_job_reads_an_ended_jobs_outputs(server: KilnServer) -> None:
    """``inputs: [{job: ID, name: prep}]``: the outputs of a job that succeeded, staged read-only at /data/prep
    ($KILN_INPUT_PREP), each file checked against the hash read at submit; refused at submit (naming the field)
    while the job runs, when it failed, and when it is not the caller's organisation's."""
    from tests.tenancy_helpers import Api, create_tenant

    client = server.client()
    py = {"runtime": {"python": sys.executable}}
    first = client.submit({"command": [sys.executable, "-c", WRITER + "import time; time.sleep(2)"], **py})
    with pytest.raises(InvalidInput, match=r"inputs\[0\]\.job: job .* is (QUEUED|STARTING|RUNNING); its outputs"):
        client.submit({"command": "true", "inputs": [{"job": first.id}]})
    assert wait_for(client, first.id, timeout=60).state == "SUCCEEDED"
    reader = client.submit(
        {"command": [sys.executable, "-c", READ_PREP], "inputs": [{"job": first.id, "name": "prep"}], **py}
    )
    done = wait_for(client, reader.id, timeout=60)
    assert done.state == "SUCCEEDED", (done.message, log_text(client, reader.id))
    weights = hashlib.sha256(bytes(range(256)) * 40).hexdigest()
    assert log_text(client, reader.id) == ["['model/weights.bin', 'rows.txt']", f"1200 {weights}"]

    failed = wait_for(client, client.submit({"command": "exit 3"}).id, timeout=60)
    assert failed.state == "FAILED"
    with pytest.raises(InvalidInput, match=r"inputs\[0\]\.job: job .* is FAILED"):
        client.submit({"command": "true", "inputs": [{"job": failed.id}]})
    with pytest.raises(ValueError, match=r"outputs are staged \(mode: stage\), not mounted"):  # the spec's own rule
        client.submit({"command": "true", "inputs": [{"job": first.id, "mode": "mount"}]})

    stranger = create_tenant(Api.admin(server), "outsiders", ("member",))["member"].api
    answer = stranger.request("POST", "/jobs", json_body={"spec": {"command": "true", "inputs": [{"job": first.id}]}})
    assert answer.status_code == 422 and f"no job {first.id} in this organisation" in answer.text, answer.text

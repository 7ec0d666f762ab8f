"""`kiln run` and the job verbs from a new user's side, against a real server: the job is checked before its code
is uploaded (and `--dry-run` shows what the server would run), what `kiln jobs download` wrote is not packed back
up, `--input` reads a dataset, `kiln jobs rerun` and `kiln jobs delete`, and why a waiting job waits in the list."""

from __future__ import annotations

import io
import re
import tarfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from kiln.errors import InvalidInput
from kiln.sdk.client import Client
from kiln.sdk.packaging import build_bundle
from tests.e2e.test_cli import JOB_ID, PY, base_env, kiln
from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Api, close_all, create_tenant

WRITE_MODEL = (
    "import os\n"
    "open(os.path.join(os.environ['KILN_OUTPUT_DIR'], 'model.pkl'), 'w').write('weights')\n"
    "print('trained')\n"
)


@pytest.fixture
def env(shared_server: KilnServer, tmp_path: Path) -> dict[str, str]:
    return {
        **base_env(tmp_path),
        **shared_server.credentials(),
        "KILN_ENDPOINT": shared_server.url,
        "KILN_CLIENT_DIR": str(tmp_path / "client"),
    }


@pytest.fixture
def client(shared_server: KilnServer) -> Client:
    return shared_server.client()


def project(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def bundle_sha(directory: Path) -> str:
    bundle = build_bundle(directory, 1 << 20)
    bundle.path.unlink()
    return bundle.sha256


def packed(client: Client, job_id: str) -> list[str]:
    data = client.request("GET", f"/jobs/{job_id}/code").content
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return sorted(tar.getnames())


def test_a_job_the_server_refuses_uploads_no_code(env, client, tmp_path) -> None:  # type: ignore[no-untyped-def]
    code = project(tmp_path / "code", {"train.py": f"print('{uuid.uuid4().hex}')\n"})  # a bundle nobody has
    (tmp_path / "data.yaml").write_text(f"command: [{PY}, train.py]\ninputs: [{{dataset: no-such-data}}]\n")
    sha = bundle_sha(code)
    since = time.time()
    refusals = [
        (["--python", PY, "--cpus", "1000", "--", PY, "train.py"], "resources: the job asks 1000 CPUs"),
        (["--runtime", "no-such-framework", "--", "python", "train.py"], "unknown framework 'no-such-framework'"),
        (["--python", PY, "-f", str(tmp_path / "data.yaml")], "inputs[0].dataset: no dataset 'no-such-data'"),
    ]
    for args, message in refusals:
        result = kiln(env, "run", *args, cwd=code)
        assert result.returncode == 2, result.stderr
        assert "error: the server refused the job: " in result.stderr and message in result.stderr, result.stderr
        assert "uploaded code" not in result.stderr and "Traceback" not in result.stderr
        assert result.stdout == ""
        assert not client.has_blob(sha), args  # packed here, never sent
    # The server was asked (a dry run), nothing was submitted. The shared server's other tests submit too (one just
    # before this, whose audit row is written after its answer): only a job of this bundle would be one of these.
    submits = client.audit(since=datetime.fromtimestamp(since - 1, UTC), action="submit_job")
    mine = [
        row
        for row in submits
        if row.outcome != "success" or client.get_job(row.resource.removeprefix("id=")).code_sha256 == sha
    ]
    assert mine == [], mine

    ok = kiln(env, "run", "--python", PY, "--follow", "--", PY, "train.py", cwd=code)
    assert ok.returncode == 0, ok.stderr
    assert client.has_blob(sha) and f"uploaded code bundle {sha[:12]}" in ok.stderr
    again = kiln(env, "run", "--python", PY, "--", PY, "train.py", cwd=code)
    assert again.returncode == 0, again.stderr
    assert f"code bundle {sha[:12]} is on the server already" in again.stderr
    assert "uploaded code" not in again.stderr


def test_the_sdk_checks_before_it_uploads(client, tmp_path) -> None:  # type: ignore[no-untyped-def]
    code = project(tmp_path / "sdk-code", {"train.py": f"print('{uuid.uuid4().hex}')\n"})
    sha = bundle_sha(code)
    spec = {"command": [PY, "train.py"], "runtime": {"python": PY}}
    with pytest.raises(InvalidInput, match="resources: the job"):
        client.run({**spec, "resources": {"cpus": 1000}}, code_dir=code)
    assert not client.has_blob(sha)
    checked = client.dry_run(spec, sha)
    assert (checked.code_sha256, checked.code_stored, checked.spec.command) == (sha, False, [PY, "train.py"])
    job = client.run(spec, code_dir=code)
    assert job.code_sha256 == sha and client.has_blob(sha)
    assert client.wait(job.id, timeout=60).state == "SUCCEEDED"


def test_dry_run_prints_the_resolved_spec_and_creates_nothing(env, client, tmp_path) -> None:  # type: ignore[no-untyped-def]
    name = f"dry-{uuid.uuid4().hex[:8]}"
    data = project(tmp_path / "data", {"rows.csv": "1,2\n"})
    client.put_dataset(data, name, state_dir=tmp_path / "uploads")
    code = project(tmp_path / "code", {"train.py": f"print('{uuid.uuid4().hex}')\n"})
    sha = bundle_sha(code)
    result = kiln(
        env, "run", "--dry-run", "--python", PY, "--name", name, "--input", f"{name}:mount", "--input", name + "-x",
        "--", PY, "train.py", cwd=code,
    )  # fmt: skip
    assert result.returncode == 2 and f"no dataset '{name}-x'" in result.stderr, result.stderr  # checked too

    result = kiln(
        env, "run", "--dry-run", "--python", PY, "--name", name, "--input", f"{name}:mount", "--cpus", "0.5",
        "--", PY, "train.py", cwd=code,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    spec = yaml.safe_load(result.stdout)
    assert spec["name"] == name and spec["command"] == [PY, "train.py"] and spec["resources"]["cpus"] == 0.5
    assert spec["inputs"] == [{"dataset": f"{name}@1", "mode": "mount"}]  # the version the job would read
    assert "nothing was uploaded or created" in result.stderr and "a run would upload it" in result.stderr
    assert not client.has_blob(sha)
    assert name not in {job.name for job in client.list_jobs(limit=500)}


def test_run_leaves_out_what_downloads_wrote_and_says_what_changed(env, client, tmp_path) -> None:  # type: ignore[no-untyped-def]
    code = project(tmp_path / "example", {"train.py": WRITE_MODEL})
    first = kiln(env, "run", "--python", PY, "--follow", "--", PY, "train.py", cwd=code)
    assert first.returncode == 0, first.stderr
    assert "packed 1 file" in first.stderr and "since the last run" not in first.stderr
    job_id = first.stdout.splitlines()[0]
    got = kiln(env, "jobs", "download", job_id, "--dest", "out", cwd=code)
    assert got.returncode == 0, got.stderr
    assert (code / "out" / "model.pkl").read_text() == "weights"
    assert job_id in (code / "out" / ".kiln-download").read_text()

    second = kiln(env, "run", "--python", PY, "--follow", "--", PY, "train.py", cwd=code)
    assert second.returncode == 0, second.stderr
    assert "skipped out/: a `kiln jobs download` destination" in second.stderr, second.stderr
    assert "unchanged since the last run from ." in second.stderr
    assert packed(client, second.stdout.splitlines()[0]) == ["train.py"]

    (code / "train.py").write_text(WRITE_MODEL + "print('more')\n")
    (code / "util.py").write_text("X = 1\n")
    third = kiln(env, "run", "--python", PY, "--", PY, "train.py", cwd=code)
    assert third.returncode == 0, third.stderr
    assert "packed 2 files" in third.stderr
    assert "since the last run from .: 1 new (util.py), 1 changed (train.py)" in third.stderr, third.stderr

    # A download into the code directory itself: what it wrote is left out, the code is not.
    here = kiln(env, "jobs", "download", job_id, cwd=code)
    assert here.returncode == 0, here.stderr
    fourth = kiln(env, "run", "--python", PY, "--", PY, "train.py", cwd=code)
    assert fourth.returncode == 0, fourth.stderr
    assert "skipped 1 file(s) that `kiln jobs download` wrote into the code directory" in fourth.stderr
    assert packed(client, fourth.stdout.splitlines()[0]) == ["train.py", "util.py"]


def test_rerun_and_delete_from_the_cli(env, client, tmp_path) -> None:  # type: ignore[no-untyped-def]
    code = project(tmp_path / "code", {"train.py": WRITE_MODEL})
    first = kiln(env, "run", "--python", PY, "--follow", "--", PY, "train.py", cwd=code)
    assert first.returncode == 0, first.stderr
    job_id = first.stdout.splitlines()[0]

    rerun = kiln(env, "jobs", "rerun", job_id, "--name", "again", "--follow")
    assert rerun.returncode == 0, rerun.stderr
    new_id, *lines = rerun.stdout.splitlines()
    assert JOB_ID.match(new_id) and new_id != job_id and lines == ["trained"]
    assert f"a rerun of {job_id}" in rerun.stderr and "SUCCEEDED" in rerun.stderr
    original, copy = client.get_job(job_id), client.get_job(new_id)
    assert copy.name == "again" and copy.code_sha256 == original.code_sha256
    assert copy.spec.model_copy(update={"name": None}) == original.spec

    unconfirmed = kiln(env, "jobs", "delete", new_id, stdin="")
    assert unconfirmed.returncode == 2 and "pass --yes" in unconfirmed.stderr, unconfirmed.stderr
    deleted = kiln(env, "jobs", "delete", new_id, "--yes")
    assert deleted.returncode == 0 and f"deleted job {new_id}" in deleted.stderr, deleted.stderr
    gone = kiln(env, "jobs", "show", new_id)
    assert gone.returncode == 1 and f"job {new_id} not found" in gone.stderr

    running = kiln(env, "run", "--python", PY, "--no-code", "--", "sleep 60")
    assert running.returncode == 0, running.stderr
    running_id = running.stdout.strip()
    busy = kiln(env, "jobs", "delete", running_id, "--yes")
    assert busy.returncode == 1 and "cancel it first" in busy.stderr, busy.stderr
    assert kiln(env, "jobs", "cancel", running_id).returncode == 0


def test_the_list_says_why_a_job_waits(shared_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    admin = Api.admin(shared_server)
    team = create_tenant(admin, f"list-{uuid.uuid4().hex[:6]}", ("member",))
    member = team["member"]
    try:
        admin.ok("PUT", f"/orgs/{team.id}/quota", json_body={"category": "train", "cpus": 1})
        holder = member.api.submit([PY, "-c", "import time; time.sleep(60)"], resources={"cpus": 1})
        member.api.wait(holder["id"], "RUNNING")
        waiting = member.api.submit("true", resources={"cpus": 1})
        reason = f"quota: cpus 1 of 1 in use (org {team.name}, category train)"
        member.api.wait_message(waiting["id"], reason)
        env = {
            **base_env(tmp_path),
            "KILN_ENDPOINT": shared_server.url,
            "KILN_ACCESS_KEY": member.key_id,
            "KILN_SECRET_KEY": member.secret,
        }
        listed = kiln(env, "jobs", "list")
        assert listed.returncode == 0, listed.stderr
        row = next(line for line in listed.stdout.splitlines() if line.startswith(waiting["id"]))
        assert re.search(r"QUEUED\s+quota: cpus 1 of 1 in use", row), listed.stdout
        assert "Submitted" not in row
    finally:
        for job_id in [j["id"] for j in member.api.ok("GET", "/jobs")["items"]]:
            member.api.post(f"/jobs/{job_id}/cancel")
        close_all(team)
        admin.close()


def test_run_again_with_its_idempotency_key_prints_the_job_it_submitted_and_submits_none(env, client) -> None:  # type: ignore[no-untyped-def]
    name = f"idem-{uuid.uuid4().hex[:8]}"
    key = f"cli-{uuid.uuid4()}"
    args = ("run", "--python", PY, "--no-code", "--name", name, "--idempotency-key", key, "--")
    first, second = kiln(env, *args, "true"), kiln(env, *args, "true")  # a shell's retry loop, say
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    job_id = first.stdout.splitlines()[0]
    assert JOB_ID.match(job_id) and second.stdout.splitlines()[0] == job_id
    assert [job.id for job in client.list_jobs(limit=200) if job.name == name] == [job_id]
    other = kiln(env, *args, "echo", "another job")
    assert other.returncode == 1, other.stderr
    assert f"Idempotency-Key '{key}' was used for a different request (POST /api/v1/jobs" in other.stderr
    bad = kiln(env, "run", "--no-code", "--idempotency-key", " padded", "--", "true")
    assert bad.returncode == 2 and "--idempotency-key: the key starts or ends with a space" in bad.stderr

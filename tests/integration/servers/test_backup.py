"""``kiln admin backup`` while a server runs a job, ``kiln admin restore`` into a new home (and, on PostgreSQL, a new
database): a server started on the restored home answers the same jobs, events, logs, metrics and datasets with
the same credentials (the server key came back: the stored secrets decrypt). A backup whose file was altered is
refused, naming the file, and nothing is restored."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kiln.sdk.client import Client
from tests.conftest import _pg_connect
from tests.helpers import log_text, spec, wait_for
from tests.kilnserver import KilnServer

DONE = (
    "import kiln\n"
    "for step in range(20):\n"
    "    print('line', step, flush=True)\n"
    "    kiln.log({'loss': 1 / (step + 1)}, step=step)\n"
    "kiln.flush()\n"
)
# Runs for the whole backup, printing and logging metrics: the database and its logs change while they are copied.
BUSY = (
    "import time, kiln\n"
    "step = 0\n"
    "while True:\n"
    "    print('busy', step, flush=True)\n"
    "    kiln.log({'rate': step}, step=step)\n"
    "    step += 1\n"
    "    time.sleep(0.02)\n"
)


def kiln_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kiln", *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.fixture
def second_pg_database() -> Iterator[str]:
    """A second, empty PostgreSQL database: where the backup is restored."""
    name = f"kiln_test_{secrets.token_hex(6)}"
    with _pg_connect() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with _pg_connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def answers(client: Client, job_id: str) -> dict[str, Any]:
    """What the API says of an ended job and the organisation's dataset."""
    job = client.get_job(job_id).model_dump(mode="json")
    return {
        "job": job,
        "events": [e.model_dump(mode="json") for e in client.events(job_id)],
        "logs": log_text(client, job_id),
        "metrics": [s.model_dump(mode="json") for s in client.metrics(job_id, names=["loss"])],
        "datasets": [d.model_dump(mode="json") for d in client.datasets()],
        "manifest": client.dataset_manifest("digits").model_dump(mode="json"),
    }


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_backup_taken_while_a_job_runs_restores_a_server_that_answers_the_same(
    kind: str, request: pytest.FixtureRequest, make_server: Any, tmp_path: Path
) -> None:
    source_url = request.getfixturevalue("postgres_url") if kind == "postgresql" else None
    target_url = request.getfixturevalue("second_pg_database") if kind == "postgresql" else None
    server = make_server(source_url, home=tmp_path / "home")
    client = server.client()
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("alpha\n")
    (data / "b.bin").write_bytes(os.urandom(300_000))
    client.put_dataset(data, "digits", state_dir=tmp_path / "client")
    done = client.submit(spec(["python", "-c", DONE], name="done"))
    wait_for(client, done.id, "SUCCEEDED")
    busy = client.submit(spec(["python", "-c", BUSY], name="busy", timeout=600))
    wait_for(client, busy.id, "RUNNING")
    before = answers(client, done.id)

    env = dict(server.env)
    backup_dir = tmp_path / "backup"
    made = kiln_cli("admin", "backup", str(backup_dir), env=env)
    assert made.returncode == 0, made.stderr
    assert "backed up" in made.stderr
    assert client.get_job(busy.id).state == "RUNNING"  # the server and its job went on through the backup
    manifest = json.loads((backup_dir / "manifest.json").read_text())
    assert manifest["database"]["kind"] == kind
    assert manifest["kiln_version"].startswith("0.2.0")
    names = {f["path"] for f in manifest["files"]}
    assert "keys/server.key" in names
    assert ("database/kiln.db" if kind == "sqlite" else "database/kiln.pgdump") in names
    assert any(n.startswith("store/") for n in names) and any(n.startswith("logs/") for n in names)

    # A damaged copy is refused, naming the file, and leaves no home behind.
    damaged = tmp_path / "damaged"
    subprocess.run(["cp", "-a", str(backup_dir), str(damaged)], check=True)
    victim = next(n for n in sorted(names) if n.startswith("store/"))
    with open(damaged / victim, "r+b") as fh:
        first = fh.read(1)
        fh.seek(0)
        fh.write(bytes([first[0] ^ 0xFF]))
    restore_env = {k: v for k, v in env.items() if k != "KILN_DATABASE_URL"}
    restore_env["KILN_HOME"] = str(tmp_path / "restored")
    if target_url:
        restore_env["KILN_DATABASE_URL"] = target_url
    refused = kiln_cli("admin", "restore", str(damaged), env=restore_env)
    assert refused.returncode == 1
    assert victim in refused.stderr and "does not match" in refused.stderr
    assert not (tmp_path / "restored").exists()

    restored = kiln_cli("admin", "restore", str(backup_dir), env=restore_env)
    assert restored.returncode == 0, restored.stderr
    again = kiln_cli("admin", "restore", str(backup_dir), env=restore_env)
    assert again.returncode == 1 and "not empty" in again.stderr
    server.stop()  # its job too: the restored server must answer from the copy alone

    copy = KilnServer(tmp_path / "restored", target_url).start()
    try:
        copied = copy.client()  # admin.env came back, and the key works: the server key decrypts its secret
        assert answers(copied, done.id) == before
        assert {j.id for j in copied.list_jobs(limit=10)} == {done.id, busy.id}
        assert copied.get_job(busy.id).name == "busy"
    finally:
        copy.stop()

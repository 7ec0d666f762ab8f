"""What a user reads of a job does not depend on which server answers: two servers with their own KILN_HOME on one
PostgreSQL, one store and one server key. A job runs on the first; a follow through the second sees its lines
while it runs (shipped to the store: kiln.storage.logs) and ends with the job; once the first is killed (-9) the
second still serves the job's whole log and its artifacts. A second job ends while the first server is dead: the
second server, on the same machine, adopts its attempt once the first's lease ran out, and serves its whole log and
its artifacts too (what the attempt wrote under the first server's home). Who holds what reads the same: before the
kill the servers' list (GET /api/v1/admin/servers) has the first holding the job, and the takeover after the kill is
an event of the job naming both servers (issue 44)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet

from kiln.sdk.client import Client
from tests.helpers import log_text, spec, wait_for

LINES = [f"line {i}" for i in range(10)]
# Half its lines, then it waits for the test's word (the file go in its work dir), then the rest and an artifact.
# Its timeout ends it (and a follow that never saw its lines) on code where only its server has its log.
SCRIPT = (
    "import os, time\n"
    "for i in range(10):\n"
    "    print(f'line {i}', flush=True)\n"
    "    while i == 4 and not os.path.exists('go'):\n"
    "        time.sleep(0.05)\n"
    "open(os.path.join(os.environ['KILN_OUTPUT_DIR'], 'result.txt'), 'w').write('42')\n"
)


def test_a_jobs_log_and_artifacts_read_the_same_through_a_server_that_did_not_run_it(
    make_server: Any, postgres_url: str, tmp_path: Path
) -> None:
    shared = {
        "server_key": Fernet.generate_key().decode(),
        "storage_url": str(tmp_path / "store"),
        "lease_seconds": "4",  # the second adopts the first's job soon after the first died
    }
    first = make_server(postgres_url, instance_id="logs-first", **shared)
    client = first.client()
    job, late = (client.submit(spec(["python", "-c", SCRIPT], timeout=240)) for _ in range(2))
    wait_for(client, job.id, "RUNNING")
    wait_for(client, late.id, "RUNNING")
    # Started once both run on the first: the second never places them.
    second = make_server(postgres_url, instance_id="logs-second", **shared)
    creds = first.credentials()
    other = Client(second.url, creds["KILN_ACCESS_KEY"], creds["KILN_SECRET_KEY"])
    servers = {server.id: server for server in other.servers().items}
    assert sorted(servers) == ["logs-first", "logs-second"] and all(x.live for x in servers.values()), servers
    assert servers["logs-first"].job_ids == [job.id, late.id] and servers["logs-second"].job_ids == []
    assert servers["logs-first"].pid == first.proc.pid and servers["logs-second"].pid == second.proc.pid  # type: ignore[union-attr]

    def go(job_id: str) -> None:
        (first.home / "jobs" / job_id / "work" / "go").write_text("")

    followed: list[str] = []
    for line in other.stream_logs(job.id, follow=True):
        if line.source == "kiln":
            continue
        followed.append(line.text)
        if line.text == "line 4":  # the job waits here: these lines came while it runs on the first server
            assert followed == LINES[:5]
            go(job.id)
    assert followed == LINES  # the follow ended with the job, every line in it
    assert wait_for(other, job.id).state == "SUCCEEDED"

    first.kill()
    go(late.id)  # it ends while its server is dead
    for ended in (job, late):
        assert wait_for(other, ended.id).state == "SUCCEEDED"
        taken = [e.message for e in other.events(ended.id) if e.reason == "TakenOver"]
        # The job that ended before the kill was never moved; the other was, once, by the survivor.
        assert taken == ([] if ended is job else ["Adopted by logs-second after logs-first stopped renewing"])
        assert log_text(other, ended.id) == LINES
        assert [a.path for a in other.artifacts(ended.id)] == ["result.txt"]
        (path,) = other.download(ended.id, tmp_path / ended.id)
        assert path.read_text() == "42"

"""The control plane may die at any moment: no job is lost, failed wrongly or run twice.

Real servers killed with SIGKILL (no shutdown hook runs) and started again on the same home, database and port,
on SQLite and on PostgreSQL, while a user's script submits through the SDK (whose retries carry the same
Idempotency-Key): every job ends SUCCEEDED in its first attempt with its whole log, exactly once."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from kiln.sdk.client import Client
from tests.helpers import log_text, spec
from tests.kilnserver import KilnServer

# A job that says it started, lives half a second (kills land while jobs start, run and end) and says it ended.
JOB = spec("echo start; sleep 0.5; echo done", resources={"cpus": 0.01, "memory": "64M"}, max_restarts=0)


class Restartable:
    """One server home, database and port, killed and started again: the SDK's client keeps its endpoint."""

    def __init__(self, home: Path, database_url: str) -> None:
        self.home = home
        self.database_url = database_url
        self.port = 0
        self.server: KilnServer | None = None
        self.starts = 0

    def start(self) -> KilnServer:
        server = KilnServer(self.home, self.database_url)
        if self.port:
            server.port = self.port
            server.env["KILN_PORT"] = str(self.port)
        self.port = server.port
        self.server = server.start()
        self.starts += 1
        return server

    def kill(self) -> None:
        assert self.server is not None
        self.server.kill()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


@pytest.fixture
def restartable(database_url: str, tmp_path: Path) -> Iterator[Restartable]:
    server = Restartable(tmp_path / "home", database_url)
    try:
        yield server
    finally:
        server.stop()


def _states(database_url: str, ids: list[str]) -> dict[str, str]:
    """The jobs' states straight from the database (the server may be dead)."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT id, state FROM jobs")).all()
    finally:
        engine.dispose()
    wanted = set(ids)
    return {job_id: state for job_id, state in rows if job_id in wanted}


def _check_each_ran_once(client: Client, ids: list[str]) -> None:
    for job_id in ids:
        job = client.wait(job_id, timeout=120)
        events = client.events(job_id)
        assert (job.state, job.attempt) == ("SUCCEEDED", 1), (job_id, job.reason, job.message, events)
        assert job.exit_code == 0
        assert log_text(client, job_id) == ["start", "done"], job_id
        moves = [(e.from_state, e.to_state) for e in events if e.to_state is not None]
        assert moves.count(("RUNNING", "SUCCEEDED")) == 1 and moves.count(("QUEUED", "STARTING")) == 1, moves
        reasons = [e.reason for e in events]
        # A re-attachment is claimed only where a supervisor was found: never just before launching it.
        for before, after in itertools.pairwise(reasons):
            assert (before, after) != ("Reattached", "Relaunched"), reasons


def test_five_kills_during_a_hundred_jobs_lose_fail_and_double_nothing(restartable: Restartable) -> None:
    restartable.start()
    client = Client(
        f"http://127.0.0.1:{restartable.port}", **_keys(restartable), retry_seconds=300
    )  # the SDK's own retries (same Idempotency-Key) carry the submits across the kills
    ids: list[str] = []
    failures: list[BaseException] = []

    def submit() -> None:
        try:
            for i in range(100):
                ids.append(client.submit({**JOB, "name": f"crash-{i}"}).id)
        except BaseException as exc:
            failures.append(exc)

    submitter = threading.Thread(target=submit)
    submitter.start()
    for delay in (0.5, 0.3, 0.0, 0.8, 1.5):  # after each start: mid-submit, mid-burst, at once, mid-run, mid-end
        time.sleep(delay)
        restartable.kill()
        restartable.start()
    submitter.join(180)
    assert not submitter.is_alive() and not failures, failures
    assert len(ids) == 100 and len(set(ids)) == 100
    names = [j.name for j in _all_jobs(client)]
    assert sorted(names) == sorted(f"crash-{i}" for i in range(100)), "a retried submit made a second job"
    _check_each_ran_once(client, ids)
    assert restartable.starts == 6


def test_kills_as_a_pass_starts_forty_queued_jobs_lose_none(restartable: Restartable, database_url: str) -> None:
    """Forty jobs wait behind one that holds every CPU; it is cancelled, one pass places all forty, and the
    server is killed at an offset after the first of them leaves QUEUED (at once: inside the pass's starts; a
    little later: some started, some not): after each restart every one runs once, none fails."""
    client = restartable.start().client()
    for round_, offset in enumerate((0.0, 0.08)):
        blocker = client.submit(spec("sleep 600", resources={"cpus": 2}))
        _wait_state(client, blocker.id, "RUNNING")
        ids = [client.submit({**JOB, "name": f"queued-{round_}-{i}"}).id for i in range(40)]
        assert set(_states(database_url, ids).values()) == {"QUEUED"}
        client.cancel(blocker.id)
        deadline = time.monotonic() + 60
        while all(state == "QUEUED" for state in _states(database_url, ids).values()):
            assert time.monotonic() < deadline, "the queued jobs never left QUEUED"
            time.sleep(0.002)
        time.sleep(offset)
        restartable.kill()
        assert sum(state == "QUEUED" for state in _states(database_url, ids).values()) < 40
        client = restartable.start().client()
        _check_each_ran_once(client, ids)


def _keys(restartable: Restartable) -> dict[str, str]:
    assert restartable.server is not None
    creds = restartable.server.credentials()
    return {"access_key": creds["KILN_ACCESS_KEY"], "secret_key": creds["KILN_SECRET_KEY"]}


def _all_jobs(client: Client) -> list:  # type: ignore[type-arg]
    return client.list_jobs(limit=500)


def _wait_state(client: Client, job_id: str, state: str) -> None:
    deadline = time.monotonic() + 60
    while client.get_job(job_id).state != state:
        assert time.monotonic() < deadline, f"job {job_id} never {state}"
        time.sleep(0.05)

"""The database going away (issue 27): a real server on a private PostgreSQL cluster that the tests stop and start.

While PostgreSQL is down, every request that needs it answers 503 ``database_unavailable`` with Retry-After (never
500, never a hang, never a dropped connection), ``/readyz`` is 503 and names the database, and the background tasks
record the error and back off. When it is back, readiness returns by itself, every job ends exactly once, a submit
refused during the outage (or cut off by it) exists whole or not at all and its retry with the same Idempotency-Key
makes it once, and the first requests after a PostgreSQL restart succeed (no stale pooled connection).

The shared PostgreSQL of the other tests is never touched: the cluster is this module's own (tests/pgcluster.py)."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg
import pytest

from kiln.domain.idempotency import HEADER, REPLAYED_HEADER
from kiln.sdk.client import Client
from tests.components import require
from tests.helpers import spec, wait_for
from tests.kilnserver import KilnServer
from tests.pgcluster import PgCluster, pg_cluster_problem
from tests.tenancy_helpers import Api

OUTAGE_SECONDS = 30  # the outage
# A request that hangs on the dead database instead of failing fast fails the test by this timeout.
REQUEST_TIMEOUT = 10.0
JOB_RESOURCES = {"cpus": 1, "memory": "64M"}  # two fill the server's 2 CPUs: the others wait in the queue
SMALL = {"cpus": 0.01, "memory": "64M"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    require("postgresql", pg_cluster_problem())
    pg = PgCluster()
    try:
        pg.start()
        yield pg
    finally:
        pg.remove()


@pytest.fixture
def database(cluster: PgCluster) -> str:
    """A fresh database in the private cluster (started, if a test left it stopped)."""
    if not cluster.running():
        cluster.start()
    name = f"kiln_outage_{secrets.token_hex(4)}"
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:{cluster.port}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return cluster.url(name)


def until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not {what} after {timeout} s"
        time.sleep(0.2)


def readyz(server: KilnServer) -> httpx.Response:
    return httpx.get(server.url + "/readyz", timeout=REQUEST_TIMEOUT)


def tasks_of(server: KilnServer) -> dict[str, dict[str, Any]]:
    return {task["name"]: task for task in readyz(server).json()["tasks"]}


def submit(api: Api, name: str, key: str, resources: dict[str, Any] = SMALL) -> httpx.Response:
    body = {"spec": {**spec("echo start; echo done", resources=resources, max_restarts=0), "name": name}}
    request = api.build("POST", "/jobs", json_body=body)
    request.headers[HEADER] = key
    return api.http.send(request)


def assert_database_unavailable(response: httpx.Response) -> None:
    """The platform's error body naming the database, with Retry-After: a 503, not a 500."""
    assert response.status_code == 503, (response.status_code, response.text)
    body = response.json()
    assert body["code"] == "database_unavailable", body
    assert body["message"].startswith("the database is unavailable"), body
    assert int(response.headers["Retry-After"]) >= 1, response.headers


def assert_ran_once(client: Client, job_id: str) -> None:
    job = wait_for(client, job_id, timeout=120)
    assert (job.state, job.attempt, job.exit_code) == ("SUCCEEDED", 1, 0), (job_id, job.reason, job.message)
    moves = [(e.from_state, e.to_state) for e in client.events(job_id) if e.to_state is not None]
    assert moves.count(("QUEUED", "STARTING")) == 1 and moves.count(("RUNNING", "SUCCEEDED")) == 1, moves


@dataclass
class Submitter:
    """Submits small jobs one after another, each with its own name and Idempotency-Key, until it has seen
    ``refusals`` 503s in a row: its last submits before the outage, the ones cut off as it began, the refused."""

    api: Api
    refusals: int = 3
    answers: list[tuple[str, str, int]] = field(default_factory=list)  # (name, key, status)
    problems: list[str] = field(default_factory=list)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        in_a_row = 0
        for i in range(1000):
            name, key = f"during-{i}", secrets.token_hex(8)
            try:
                response = submit(self.api, name, key)
            except httpx.HTTPError as exc:  # a hang, or a connection the server dropped
                self.problems.append(f"{name}: {type(exc).__name__}: {exc}")
                return
            self.answers.append((name, key, response.status_code))
            if response.status_code == 503:
                try:
                    assert_database_unavailable(response)
                except AssertionError as exc:
                    self.problems.append(f"{name}: {exc}")
                in_a_row += 1
                if in_a_row >= self.refusals:
                    return
            elif response.status_code != 201:
                self.problems.append(f"{name}: {response.status_code} {response.text}")
                return
            else:
                in_a_row = 0
            time.sleep(0.05)

    def join(self) -> None:
        assert self.thread is not None
        self.thread.join(REQUEST_TIMEOUT * 4)
        assert not self.thread.is_alive(), "the submitter hung"


def test_a_thirty_second_outage_answers_503_and_loses_fails_and_doubles_nothing(
    make_server: Callable[..., KilnServer], cluster: PgCluster, database: str
) -> None:
    server = make_server(database_url=database, cpus="2")
    api = Api.admin(server)
    api.http.timeout = httpx.Timeout(REQUEST_TIMEOUT)
    client = Client(server.url, **_keys(server), retry_seconds=0)
    long_job = spec("echo start; sleep 6; echo done", resources=JOB_RESOURCES, max_restarts=0)
    running = [client.submit({**long_job, "name": f"running-{i}"}).id for i in range(2)]
    queued = [client.submit({**long_job, "name": f"queued-{i}"}).id for i in range(2)]
    for job_id in running:
        wait_for(client, job_id, "RUNNING")
    assert {client.get_job(job_id).state.value for job_id in queued} == {"QUEUED"}
    errors_before = tasks_of(server)["reconciler"]["errors"]

    submitter = Submitter(api)
    submitter.start()
    time.sleep(0.5)  # a few submits succeed first
    cluster.stop("immediate")  # as in a crash of the database's host
    down_at = time.monotonic()
    submitter.join()
    assert not submitter.problems, submitter.problems

    # Every kind of request answers 503 at once, with the body and header the platform uses for it.
    key = secrets.token_hex(8)
    for response in (
        api.get(f"/jobs/{running[0]}"),
        api.get("/jobs"),
        api.get("/whoami"),
        submit(api, "refused", key),
    ):
        assert_database_unavailable(response)
    ready = readyz(server)
    assert ready.status_code == 503 and ready.json()["status"] == "unavailable", ready.text
    assert ready.json()["message"].startswith("the database is unavailable"), ready.text

    time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - down_at)))
    down_for = time.monotonic() - down_at
    reconciler = tasks_of(server)["reconciler"]
    assert readyz(server).status_code == 503
    assert reconciler["last_run_ok"] is False, reconciler
    assert reconciler["last_error"].startswith("DatabaseUnavailable: the database is unavailable"), reconciler
    # Back-off: a pass every 0.2 s would fail ~75 times in 30 s; doubling pauses up to 5 s, about 10 times.
    failed = reconciler["errors"] - errors_before
    assert 1 <= failed <= 20, f"the reconciler failed {failed} times in {down_for:.0f} s: no back-off"

    cluster.start()
    until(lambda: readyz(server).status_code == 200, 20, "ready again after the database came back")
    assert api.get("/whoami").status_code == 200  # no stale pooled connection

    # Every job, whether it ran through the outage, waited in the queue or was submitted around it, ran once.
    for job_id in running + queued:
        assert_ran_once(client, job_id)
    refused = [(name, key) for name, key, status in submitter.answers if status == 503] + [("refused", key)]
    accepted = [(name, key) for name, key, status in submitter.answers if status == 201]
    assert accepted, "no submit succeeded before the outage"
    names = [job.name for job in client.list_jobs(limit=500)]
    # A refused submit may have committed before its connection was cut (its answer lost): then it exists whole, and
    # the retry below answers it; otherwise nothing of it exists and the retry makes it.
    assert "refused" not in names, "a submit refused long after the outage began exists"
    for name, key in refused + accepted:
        retried = submit(api, name, key)
        assert retried.status_code == 201, retried.text
        assert retried.json()["name"] == name
        if (name, key) in accepted:
            assert retried.headers.get(REPLAYED_HEADER) == "true", f"{name}: its retry made a second job"
    names = [job.name for job in client.list_jobs(limit=500)]
    for name, _key in refused + accepted:
        assert names.count(name) == 1, f"{name}: {names.count(name)} jobs"
    for job in client.list_jobs(limit=500):
        if job.name.startswith("during-") or job.name == "refused":
            assert_ran_once(client, job.id)

    # The background tasks recovered by themselves.
    def recovered() -> bool:
        return all(t["last_run_ok"] is not False for t in tasks_of(server).values() if t["interval_seconds"] <= 5)

    until(recovered, 30, "every frequent task running again")
    new = client.submit({**spec("echo after", resources=SMALL), "name": "after"})
    assert wait_for(client, new.id, timeout=60).state.value == "SUCCEEDED"
    assert "Exception in ASGI application" not in server.log_path.read_text(errors="replace")


def test_a_postgresql_restart_under_load_leaves_no_stale_connection(
    make_server: Callable[..., KilnServer], cluster: PgCluster, database: str
) -> None:
    server = make_server(database_url=database)
    api = Api.admin(server)
    api.http.timeout = httpx.Timeout(REQUEST_TIMEOUT)
    client = Client(server.url, **_keys(server), retry_seconds=0)
    before = client.submit({**spec("echo before", resources=SMALL), "name": "before"}).id
    # Every pooled connection in use at once, so that the restart leaves the pool full of dead ones.
    threads = [threading.Thread(target=lambda: api_of(server).get("/jobs")) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    stop = threading.Event()
    answers: list[str] = []

    def load() -> None:  # one keep-alive connection: a server that drops it after an error shows here
        own = api_of(server)
        while not stop.is_set():
            try:
                response = own.get("/jobs")
                answers.append(str(response.status_code) if response.status_code != 503 else response.json()["code"])
            except httpx.HTTPError as exc:
                answers.append(f"{type(exc).__name__}: {exc}")
            time.sleep(0.02)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    time.sleep(0.5)
    cluster.stop("fast")  # an operator's restart: sessions are ended, the server goes away
    cluster.start()
    # The first requests afterwards, each on its own connection and on the keep-alive one: none fails.
    first = [api.get("/whoami"), api.get("/jobs"), submit(api, "after-restart", secrets.token_hex(8))]
    assert [r.status_code for r in first] == [200, 200, 201], [r.text for r in first]
    time.sleep(1.0)
    stop.set()
    loader.join(REQUEST_TIMEOUT * 2)
    # While it was down: 503 database_unavailable; before and after: 200. Never a 500 or a dropped connection.
    assert set(answers) <= {"200", "database_unavailable"}, sorted(set(answers))
    assert answers[-1] == "200", answers[-5:]
    assert readyz(server).status_code == 200
    for job in client.list_jobs(limit=10):
        assert job.name in ("before", "after-restart"), job.name
        assert_ran_once(client, job.id)
    assert before in [job.id for job in client.list_jobs(limit=10)]
    assert "Exception in ASGI application" not in server.log_path.read_text(errors="replace")


def api_of(server: KilnServer) -> Api:
    api = Api.admin(server)
    api.http.timeout = httpx.Timeout(REQUEST_TIMEOUT)
    return api


def _keys(server: KilnServer) -> dict[str, str]:
    creds = server.credentials()
    return {"access_key": creds["KILN_ACCESS_KEY"], "secret_key": creds["KILN_SECRET_KEY"]}

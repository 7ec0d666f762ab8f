"""The job list cache (JobService.list_jobs_json / cached_list_json) can never serve a list older than the jobs
table: every write to it, through the ORM or a Core ``update(Job)`` like the reconciler's, retires the cached
lists, including a read that raced a write's commit. It is on only where one process has the database to itself
(the default SQLite file of a KILN_HOME); on PostgreSQL or a shared SQLite file other servers write too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, update

from kiln.db import migrate
from kiln.db.session import Database
from kiln.db.tables import Job, Nonce, Organization, User, utcnow
from kiln.domain.catalog import DEFAULT_CATALOG
from kiln.domain.schemas import JobList
from kiln.domain.states import JobState
from kiln.errors import KilnError
from kiln.usecases.access.identity import Principal
from kiln.usecases.jobs.jobs import JobService
from tests.helpers import spec, wait_for

# -- in process: the service and the database's change counter ---------------------------------------------


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    migrate.upgrade(database.engine)
    database.claim_exclusive()  # what the server does with the default SQLite database of its KILN_HOME
    yield database
    database.dispose()


def member(org: str, *, admin: bool = False) -> Principal:
    return Principal(f"usr-{org}", f"user-{org}", f"org-{org}", org, f"AK{org}", "member", admin)


def add_job(db: Database, org: str, job_id: str, state: JobState = JobState.QUEUED) -> None:
    now = utcnow()
    with db.transaction() as s:
        if s.get(Organization, f"org-{org}") is None:
            s.add(Organization(id=f"org-{org}", name=org))
            s.flush()
            s.add(User(id=f"usr-{org}", org_id=f"org-{org}", name=f"user-{org}", role="member"))
            s.flush()
        s.add(
            Job(
                id=job_id,
                org_id=f"org-{org}",
                user_id=f"usr-{org}",
                name=job_id,
                spec={"command": ["true"], "runtime": {"python": "/usr/bin/python3"}},
                state=str(state),
                reason="Submitted",
                message="",
                created_at=now,
                updated_at=now,
            )
        )


def items(body: bytes) -> list[tuple[str, str]]:
    return [(j["id"], j["state"]) for j in json.loads(body)["items"]]


@pytest.fixture
def jobs(db: Database) -> JobService:
    return JobService(db, DEFAULT_CATALOG, lambda: [], lambda *_: None)


def test_a_repeated_list_is_served_from_the_cache_on_sqlite_only(db: Database, jobs: JobService) -> None:
    add_job(db, "a", "job-a1")
    body = jobs.list_jobs_json(member("a"), limit=20)
    assert items(body) == [("job-a1", "QUEUED")]
    cached = jobs.cached_list_json(member("a"), limit=20)
    if db.dialect == "sqlite":
        assert cached == body
    else:
        assert cached is None
    # The same bytes as the uncached path.
    assert json.loads(body) == {"items": [json.loads(j.model_dump_json()) for j in jobs.list_jobs(member("a"))]}


def test_the_key_holds_the_query_and_who_asks(db: Database, jobs: JobService) -> None:
    add_job(db, "a", "job-a1")
    add_job(db, "b", "job-b1")
    assert items(jobs.list_jobs_json(member("a"))) == [("job-a1", "QUEUED")]
    assert jobs.cached_list_json(member("b")) is None  # another organisation: its own entry
    assert items(jobs.list_jobs_json(member("b"))) == [("job-b1", "QUEUED")]
    assert jobs.cached_list_json(member("a", admin=True)) is None  # a platform admin sees every organisation
    assert sorted(items(jobs.list_jobs_json(member("a", admin=True)))) == [("job-a1", "QUEUED"), ("job-b1", "QUEUED")]
    token = Principal("usr-a", "user-a", "org-a", "a", "job:job-a1", "job", False, job_id="job-a1")
    assert jobs.cached_list_json(token) is None  # a job token sees its own job only
    assert jobs.cached_list_json(member("a"), states=[JobState.RUNNING]) is None
    assert items(jobs.list_jobs_json(member("a"), states=[JobState.RUNNING])) == []
    assert jobs.cached_list_json(member("a"), limit=1) is None


def test_orm_insert_and_core_update_retire_cached_lists(db: Database, jobs: JobService) -> None:
    add_job(db, "a", "job-a1")
    jobs.list_jobs_json(member("a"))
    add_job(db, "a", "job-a2")  # ORM insert (what submit does)
    assert jobs.cached_list_json(member("a")) is None
    assert [i for i, _ in items(jobs.list_jobs_json(member("a")))] == ["job-a2", "job-a1"]
    with db.transaction() as s:  # a Core statement, like the reconciler's lease and state updates
        s.execute(update(Job).where(Job.id == "job-a1").values(state=str(JobState.RUNNING)))
    assert jobs.cached_list_json(member("a")) is None
    assert ("job-a1", "RUNNING") in items(jobs.list_jobs_json(member("a")))


def test_writes_elsewhere_or_matching_nothing_keep_the_cache(db: Database, jobs: JobService) -> None:
    add_job(db, "a", "job-a1")
    body = jobs.list_jobs_json(member("a"))
    with db.transaction() as s:
        s.add(Nonce(key_id="AKa", nonce="n" * 20, seen_at=utcnow()))
        s.execute(update(Job).where(Job.id == "no-such-job").values(message="x"))
    assert jobs.cached_list_json(member("a")) == (body if db.dialect == "sqlite" else None)


def test_a_list_read_while_a_write_commits_is_not_kept(db: Database, jobs: JobService) -> None:
    add_job(db, "a", "job-a1")
    with db.transaction() as s:
        s.execute(update(Job).where(Job.id == "job-a1").values(state=str(JobState.RUNNING)))
        # Read before the commit (WAL: readers see the last committed state): this list is already stale.
        assert items(jobs.list_jobs_json(member("a"))) == [("job-a1", "QUEUED")]
    assert jobs.cached_list_json(member("a")) is None
    assert items(jobs.list_jobs_json(member("a"))) == [("job-a1", "RUNNING")]


def test_a_list_read_between_commit_and_its_end_is_not_kept(db: Database, jobs: JobService) -> None:
    """The narrowest race: a read after the write's last statement and the pre-commit bump, but before the
    database made the commit visible. Only the bump after the commit retires what it read."""
    add_job(db, "a", "job-a1")
    seen: list[list[tuple[str, str]]] = []
    reading: list[bool] = []

    def read_during_commit(_conn: Any) -> None:  # runs after TableVersions' own "commit" listener
        if not reading:  # once (on PostgreSQL the read's own commit comes here too)
            reading.append(True)
            seen.append(items(jobs.list_jobs_json(member("a"))))

    event.listen(db.engine, "commit", read_during_commit)
    try:
        with db.transaction() as s:
            s.execute(update(Job).where(Job.id == "job-a1").values(state=str(JobState.RUNNING)))
    finally:
        event.remove(db.engine, "commit", read_during_commit)
    assert seen == [[("job-a1", "QUEUED")]]  # stale when read (the commit was not visible yet)
    assert jobs.cached_list_json(member("a")) is None
    assert items(jobs.list_jobs_json(member("a"))) == [("job-a1", "RUNNING")]


def test_a_rolled_back_write_does_no_harm(db: Database, jobs: JobService) -> None:
    add_job(db, "a", "job-a1")
    with pytest.raises(RuntimeError), db.transaction() as s:
        s.execute(update(Job).where(Job.id == "job-a1").values(state=str(JobState.RUNNING)))
        raise RuntimeError("roll back")
    assert items(jobs.list_jobs_json(member("a"))) == [("job-a1", "QUEUED")]


def test_no_cache_on_a_sqlite_file_that_another_process_may_use(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    first, second = Database(url), Database(url)
    migrate.upgrade(first.engine)
    assert not first.claim_exclusive()  # the other one has it open too
    jobs = JobService(first, DEFAULT_CATALOG, lambda: [], lambda *_: None)
    add_job(first, "a", "job-a1")
    jobs.list_jobs_json(member("a"))
    assert jobs.cached_list_json(member("a")) is None
    second.dispose()
    assert first.claim_exclusive()
    with pytest.raises(KilnError):
        Database(url)  # nobody else may open it while it is claimed
    first.dispose()
    Database(url).dispose()  # released


# -- through a real server: submit, the reconciler, cancel -------------------------------------------------


def listed(client: Any, job_id: str) -> dict[str, Any]:
    payload = client.request("GET", "/jobs", params={"limit": 20}).json()
    found = [j for j in payload["items"] if j["id"] == job_id]
    assert found, f"{job_id} not in the list"
    return found[0]  # type: ignore[no-any-return]


def test_the_list_follows_submit_reconciler_and_cancel(make_server, database_url: str) -> None:
    # SQLite: the default database of the server's KILN_HOME, the one the cache is on for.
    client = make_server(None if database_url.startswith("sqlite") else database_url, cpus="1").client()
    first = client.request("GET", "/jobs", params={"limit": 20}).json()["items"]
    assert client.request("GET", "/jobs", params={"limit": 20}).json()["items"] == first  # cached on SQLite

    running = client.submit(spec(["sleep", "30"], resources={"cpus": 1}))
    assert listed(client, running.id)["state"] in ("QUEUED", "STARTING", "RUNNING")  # right after the submit
    wait_for(client, running.id, "RUNNING")  # moved by the reconciler
    assert listed(client, running.id)["state"] == "RUNNING"
    assert listed(client, running.id)["running_at"] is not None

    queued = client.submit(spec(["sleep", "30"], resources={"cpus": 1}))  # waits: the one CPU is taken
    assert listed(client, queued.id)["state"] == "QUEUED"
    assert client.cancel(queued.id).state == "CANCELLED"  # a queued job is cancelled at once
    assert listed(client, queued.id)["state"] == "CANCELLED"

    assert client.cancel(running.id).cancel_requested  # a running one is asked to stop
    assert listed(client, running.id)["cancel_requested"] is True
    assert wait_for(client, running.id).state == "CANCELLED"  # the reconciler stops it
    assert listed(client, running.id)["state"] == "CANCELLED"


def test_each_listed_job_is_its_read_made_again_when_any_of_its_columns_changes(db: Database, jobs: JobService) -> None:
    """The list's JSON is its jobs' reads, each kept with the row it was made of (a job's spec validated once): byte
    for byte what ``JobList`` of ``list_jobs`` writes, after a change to a job's row and to its organisation's name
    (a column from another table) as before them."""
    add_job(db, "a", "job-a1")
    add_job(db, "a", "job-a2")
    caller = member("a", admin=True)

    def expected() -> bytes:
        return JobList(items=jobs.list_jobs(caller)).model_dump_json().encode()

    first = jobs.list_jobs_json(caller)
    assert first == expected()
    with db.transaction() as s:
        s.execute(update(Job).where(Job.id == "job-a1").values(state=str(JobState.CANCELLED), message="by ann"))
        s.execute(update(Organization).where(Organization.id == "org-a").values(name="renamed"))
    second = jobs.list_jobs_json(caller)
    assert second == expected() and second != first
    listed = json.loads(second)["items"]
    assert {j["org_name"] for j in listed} == {"renamed"}
    assert [(j["id"], j["state"], j["message"]) for j in listed][1] == ("job-a1", "CANCELLED", "by ann")

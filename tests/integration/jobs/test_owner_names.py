"""Jobs and audit records carry the names of their organisation and user beside the ids (issue 26: the audit tab
and the CLI's ORG/USER columns showed ids where people read names), read in the same query as the rows (a join,
not a query per row), on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import event
from sqlalchemy.engine import Engine

from kiln.db import migrate
from kiln.db.session import Database
from kiln.db.tables import Job, Organization, User
from kiln.domain.catalog import DEFAULT_CATALOG
from kiln.usecases.access.audit import AuditEntry, AuditService
from kiln.usecases.access.identity import Principal
from kiln.usecases.jobs.jobs import JobService

ADMIN = Principal("usr-root", "root", "org-ops", "ops", "AK0", "admin", True)
ANN = Principal("usr-ann", "ann", "org-acme", "acme", "AK1", "admin", False)  # an organisation's admin


@contextmanager
def selects() -> Iterator[list[str]]:
    """The SELECT statements run meanwhile, on any engine (a Database may read through one of its own)."""
    seen: list[str] = []

    def count(_conn, _cursor, statement, *_args) -> None:  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append(statement)

    event.listen(Engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", count)


def _world(database_url: str) -> Database:
    db = Database(database_url)
    migrate.upgrade(db.engine)
    with db.transaction() as s:
        for org, name in (("org-ops", "ops"), ("org-acme", "acme"), ("org-blue", "blue")):
            s.add(Organization(id=org, name=name))
        s.flush()
        for user, org, name in (
            ("usr-root", "org-ops", "root"),
            ("usr-ann", "org-acme", "ann"),
            ("usr-bo", "org-blue", "bo"),
        ):
            s.add(User(id=user, org_id=org, name=name))
        s.flush()
        for i in range(6):
            user, org = (("usr-ann", "org-acme"), ("usr-bo", "org-blue"))[i % 2]
            s.add(Job(id=f"job-{i}", org_id=org, user_id=user, name=f"j{i}", spec={"command": "true"}, state="QUEUED"))
    return db


def test_jobs_name_their_organisation_and_user_in_one_query(database_url: str) -> None:
    db = _world(database_url)
    service = JobService(db, DEFAULT_CATALOG, lambda: [], lambda *_: None)
    with selects() as seen:
        jobs = service.list_jobs(ADMIN, limit=50)
    assert len(seen) == 1, seen  # the names come with the jobs, not a query per job
    assert {(j.id, j.org_name, j.user_name) for j in jobs} == {
        (f"job-{i}", *(("acme", "ann"), ("blue", "bo"))[i % 2]) for i in range(6)
    }
    listed = service.list_jobs_json(ANN, limit=50)
    assert b'"org_name":"acme"' in listed and b'"user_name":"ann"' in listed and b'"bo"' not in listed
    one = service.get(ADMIN, "job-1")
    assert (one.org_id, one.org_name, one.user_id, one.user_name) == ("org-blue", "blue", "usr-bo", "bo")
    cancelled = service.cancel(ADMIN, "job-1")  # a platform admin's cancel names the job's owners, not its own
    assert (cancelled.org_name, cancelled.user_name) == ("blue", "bo")
    db.dispose()


def test_audit_records_name_their_organisation_and_user_in_one_query(database_url: str) -> None:
    db = _world(database_url)
    audit = AuditService(db, retention_days=30)
    audit.record(AuditEntry("submit_job", "id=job-0", "success", 201, "127.0.0.1", "org-acme", "usr-ann", "AK1"))
    audit.record(AuditEntry("GET /api/v1/jobs", "/api/v1/jobs", "unauthenticated", 401, "127.0.0.1", key_id="AKX"))
    with selects() as seen:
        records = audit.query(ADMIN)
    assert len(seen) == 1, seen
    assert [(r.org_name, r.user_name) for r in records] == [(None, None), ("acme", "ann")]
    assert [(r.org_name, r.user_name) for r in audit.query(ANN)] == [("acme", "ann")]  # its own organisation's
    db.dispose()

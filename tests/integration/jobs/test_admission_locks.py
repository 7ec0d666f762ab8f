"""Two reconcile passes (two servers) admitting jobs of one organisation on PostgreSQL, each having written a row
that references it earlier in its transaction (a job, an event: the foreign key's KEY SHARE lock on the
organisation's row): the admission lock serialises them and neither is refused as a deadlock."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from kiln.db.session import Database
from kiln.db.tables import Job
from kiln.usecases.access.quotas import Admission
from tests.helpers import acme_database


@pytest.fixture
def db(postgres_url: str) -> Iterator[Database]:
    database = acme_database(postgres_url)
    yield database
    database.dispose()


def test_two_admissions_after_writes_referencing_the_organisation_do_not_deadlock(db: Database) -> None:
    both_wrote = threading.Barrier(2, timeout=20)
    errors: list[BaseException] = []

    def admission(prefix: str) -> None:
        try:
            with db.transaction() as s:
                # A row referencing the organisation, written in this transaction before the admission.
                s.add(Job(id=f"job-{prefix}", org_id="org-1", user_id="usr-1", name=prefix, spec={}, state="QUEUED"))
                s.flush()
                both_wrote.wait()
                Admission(s, "postgresql", ["org-1"])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=admission, args=(p,)) for p in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors

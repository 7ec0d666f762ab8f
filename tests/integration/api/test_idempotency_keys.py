"""The store of Idempotency-Keys (kiln.usecases.access.idempotency) on SQLite and PostgreSQL, without a server: a key's
row
is written in the create's own transaction, a repeat answers the first resource, another request with the key is
refused, keys are per organisation and user, a failed create keeps nothing, two creates racing with one key make
one resource (the primary key decides, the loser answers the winner's), and expired keys are replaced and purged.

The "resource" here is an organisation row: any row made in the create's transaction does."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from kiln.db import migrate
from kiln.db.session import Database
from kiln.db.tables import IdempotencyKey, Organization
from kiln.domain.ids import new_id
from kiln.errors import Conflict, InvalidInput
from kiln.usecases.access.idempotency import Idempotency, IdempotentRequest, Remember
from kiln.usecases.access.identity import Principal

BODY = b'{"spec": {"command": "true"}}'


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    migrate.upgrade(database.engine)
    yield database
    database.dispose()


def caller(user: str = "usr-ann", org: str = "org-acme") -> Principal:
    return Principal(
        user_id=user, user_name=user, org_id=org, org_name=org, key_id="AK" + "0" * 18, role="member",
        platform_admin=False,
    )  # fmt: skip


def request(key: str = "key-1", path: str = "/api/v1/jobs", body: bytes = BODY) -> IdempotentRequest:
    return IdempotentRequest.of(key, "POST", path, body)


class Creates:
    """A create that makes one organisation row named ``<prefix>-<n>`` per call, and counts its calls."""

    def __init__(self, prefix: str, before: Callable[[], None] | None = None) -> None:
        self.prefix = prefix
        self.calls = 0
        self.before = before

    def __call__(self, db: Database) -> Callable[[Remember], str]:
        def make(remember: Remember) -> str:
            self.calls += 1
            if self.before is not None:
                self.before()
            with db.transaction() as s:
                org = Organization(id=new_id("org"), name=f"{self.prefix}-{new_id('n')}")
                s.add(org)
                s.flush()
                remember(s, org.id)
                return org.id

        return make

    def made(self, db: Database) -> int:
        with db.read() as s:
            return int(s.scalar(select(func.count()).where(Organization.name.startswith(self.prefix + "-"))) or 0)


def load(s: Session, org_id: str) -> str | None:
    return org_id if s.get(Organization, org_id) is not None else None


def test_a_repeat_answers_the_first_resource_and_creates_nothing(db: Database) -> None:
    keys, creates = Idempotency(db, 3600), Creates("repeat")
    first_request, again = request(), request()
    first = keys.create(caller(), first_request, "job", creates(db), load)
    second = keys.create(caller(), again, "job", creates(db), load)
    assert second == first and creates.calls == 1 and creates.made(db) == 1
    assert (first_request.replayed, again.replayed) == (False, True)
    # The same JSON written another way is the same request.
    spaced = request(body=b'{ "spec" : { "command" : "true" } }')
    assert keys.create(caller(), spaced, "job", creates(db), load) == first and spaced.replayed
    # Without a key every call creates.
    keys.create(caller(), None, "job", creates(db), load)
    assert creates.made(db) == 2


def test_the_key_with_another_request_is_refused_naming_the_key_and_the_first_request(db: Database) -> None:
    keys, creates = Idempotency(db, 24 * 3600), Creates("mismatch")
    keys.create(caller(), request("abc"), "job", creates(db), load)
    with pytest.raises(InvalidInput) as other_body:
        keys.create(caller(), request("abc", body=b'{"spec": {"command": "false"}}'), "job", creates(db), load)
    assert other_body.value.message == (
        "Idempotency-Key 'abc' was used for a different request (POST /api/v1/jobs with another body) within 24 h: "
        "use a new key"
    )
    assert other_body.value.details == {"field": "header.Idempotency-Key", "key": "abc"}
    with pytest.raises(InvalidInput, match=r"\(POST /api/v1/jobs\) within 24 h"):
        keys.create(caller(), request("abc", path="/api/v1/studies"), "study", creates(db), load)
    assert creates.calls == 1


def test_keys_belong_to_one_user_of_one_organisation(db: Database) -> None:
    keys, creates = Idempotency(db, 3600), Creates("scoped")
    ann = keys.create(caller("usr-ann"), request("shared"), "job", creates(db), load)
    bob = keys.create(caller("usr-bob"), request("shared"), "job", creates(db), load)
    other_org = keys.create(caller("usr-ann", "org-beta"), request("shared"), "job", creates(db), load)
    assert len({ann, bob, other_org}) == 3 and creates.made(db) == 3
    # Another user's different body under the same key text is no conflict either.
    keys.create(caller("usr-cy"), request("shared", body=b"{}"), "job", creates(db), load)
    assert creates.made(db) == 4


def test_a_failed_create_keeps_nothing_and_the_key_can_be_used_again(db: Database) -> None:
    keys = Idempotency(db, 3600)

    def refused(remember: Remember) -> str:
        with db.transaction() as s:
            s.add(Organization(id=new_id("org"), name=f"failed-{new_id('n')}"))
            s.flush()
            remember(s, "org-never")
            raise InvalidInput("spec.command: required")

    with pytest.raises(InvalidInput, match=r"spec\.command"):
        keys.create(caller(), request("retry-me"), "job", refused, load)
    with db.read() as s:
        assert s.scalar(select(func.count()).select_from(IdempotencyKey)) == 0
    creates = Creates("after-failure")
    fixed = request("retry-me", body=b'{"spec": {"command": "echo fixed"}}')
    keys.create(caller(), fixed, "job", creates(db), load)
    assert creates.calls == 1 and not fixed.replayed


def test_a_key_whose_resource_was_removed_says_so(db: Database) -> None:
    keys, creates = Idempotency(db, 3600), Creates("removed")
    org_id = keys.create(caller(), request("gone"), "job", creates(db), load)
    with db.transaction() as s:
        s.delete(s.get(Organization, org_id))
    with pytest.raises(Conflict, match=f"Idempotency-Key 'gone' created job {org_id}, which has been removed since"):
        keys.create(caller(), request("gone"), "job", creates(db), load)


def test_two_creates_racing_with_one_key_make_one_resource(db: Database) -> None:
    # Both pass the lookup before either writes (the barrier), then both create and add the key in their own
    # transactions: the primary key lets one commit; the other rolls back whole and answers the winner's resource.
    barrier = threading.Barrier(2, timeout=30)
    entered = threading.local()

    def both_past_the_lookup() -> None:
        if not getattr(entered, "once", False):
            entered.once = True
            barrier.wait()

    keys, creates = Idempotency(db, 3600), Creates("race", before=both_past_the_lookup)
    requests = [request("raced"), request("raced")]
    results: list[str] = []
    errors: list[BaseException] = []

    def run(req: IdempotentRequest) -> None:
        try:
            results.append(keys.create(caller(), req, "job", creates(db), load))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in requests]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert len(results) == 2 and results[0] == results[1]
    assert creates.calls == 2 and creates.made(db) == 1  # the loser's row was rolled back with its key
    assert sorted(r.replayed for r in requests) == [False, True]


def test_an_expired_key_is_a_new_key_and_the_purge_deletes_it(db: Database) -> None:
    keys, creates = Idempotency(db, 0.5), Creates("expiry")
    first = keys.create(caller(), request("old"), "job", creates(db), load)
    keys.create(caller(), request("other"), "job", creates(db), load)
    time.sleep(0.7)
    # Expired but not purged: the create replaces its row in its own transaction.
    again = request("old", body=b'{"spec": {"command": "something else"}}')
    second = keys.create(caller(), again, "job", creates(db), load)
    assert second != first and not again.replayed and creates.made(db) == 3
    with db.transaction() as s:
        assert keys.purge(s) == 1  # "other"; "old" is fresh again
    with db.read() as s:
        assert [row.key for row in s.scalars(select(IdempotencyKey))] == ["old"]

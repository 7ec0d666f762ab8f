"""Idempotent creates: a create sent again with the same ``Idempotency-Key`` by the same user, with the same request,
answers the resource the first one created and creates nothing (docs/idempotency.md).

Crash safety is the point, so the key's row is written in the transaction that creates the resource: both are
committed or neither is. A server killed after the commit and before its reply leaves the key, and the client's
retry finds it; a server killed before the commit leaves neither, and the retry creates the resource, once.

Concurrent requests with one key: each finds no row, creates its resource and adds the key's row in its own
transaction; the primary key (organisation, user, key) lets one of them commit. The other's insert fails (on
PostgreSQL once the first has committed; on SQLite, whose writers take turns, at once), its whole transaction rolls
back, and it answers what the first created. If that row cannot be seen (the first rolled back after all), the
create runs once more.

A key is scoped to one user of one organisation: another user's key of the same text is another key, and one user
can never be answered another's resource. A create that fails (any error) writes nothing: its retry runs it again,
and fails again for the same reason or succeeds once the cause is gone. Keys are kept for
``idempotency_retention_seconds`` (24 h); an expired one is a new key, and the purge task deletes them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Protocol, TypeVar

from sqlalchemy import bindparam, delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kiln.db.session import Database
from kiln.db.tables import IdempotencyKey, utcnow
from kiln.domain.idempotency import HEADER, check_key, describe_span, fingerprint
from kiln.errors import Conflict, InvalidInput
from kiln.usecases.access import audit
from kiln.usecases.access.audit import AuditEntry
from kiln.usecases.access.identity import Principal

log = logging.getLogger(__name__)

T = TypeVar("T")


class Remember(Protocol):
    """What a create calls inside its transaction once its resource has an id: writes the key's row there (a no-op
    for a create sent without a key). ``flush``: at once, so that a key another request holds is an IntegrityError
    here (False: at the create's next flush, its commit at the latest; ``create`` handles it the same)."""

    def __call__(self, s: Session, resource_id: str, /, *, flush: bool = True) -> None: ...


@dataclass
class IdempotentRequest:
    """A create's ``Idempotency-Key`` and what makes a later request with it the same request: its method, path
    and body, as ``kiln.domain.idempotency.fingerprint``."""

    key: str
    method: str
    path: str
    fingerprint: str
    # Set by the create: True when it answered the resource an earlier request with this key created (the route
    # then says so: Idempotent-Replayed: true).
    replayed: bool = False
    # The request's audit record as it will read once the create succeeded (``resource``: its path parameters,
    # the new id to follow), written in the create's transaction with the key: a server killed after the commit
    # and before the record written after its reply (kiln.api.auth) lost the submit from the audit trail, and
    # the client's retry was recorded as a replay only. ``audited``: set once that transaction committed.
    audit: AuditEntry | None = None
    audited: bool = False
    # Set by the look before the create: an expired row of this key was found (not purged yet), which the create's
    # transaction deletes before it adds the key's row again.
    expired_found: bool = False

    @classmethod
    def of(cls, key: str, method: str, path: str, body: bytes) -> IdempotentRequest:
        """The request's key, checked (InvalidInput naming the header), and its fingerprint."""
        return cls(check_key(key), method.upper(), path, fingerprint(method, path, body))


# The row of one key (built once: a submit with a key looks it up first).
_KEY_ROW = select(
    IdempotencyKey.method,
    IdempotencyKey.path,
    IdempotencyKey.fingerprint,
    IdempotencyKey.resource_kind,
    IdempotencyKey.resource_id,
    IdempotencyKey.created_at,
).where(
    IdempotencyKey.org_id == bindparam("org_id"),
    IdempotencyKey.user_id == bindparam("user_id"),
    IdempotencyKey.key == bindparam("key"),
)


def _forget(_s: Session, _resource_id: str, *, flush: bool = True) -> None:
    """``Remember`` for a create sent without a key."""


class Idempotency:
    """The keys of creates: looked up before a create runs, written in its transaction, purged once expired."""

    def __init__(self, db: Database, retention_seconds: float) -> None:
        self.db = db
        self.retention = timedelta(seconds=retention_seconds)

    def create(
        self,
        principal: Principal,
        request: IdempotentRequest | None,
        kind: str,
        make: Callable[[Remember], T],
        load: Callable[[Session, str], T | None],
    ) -> T:
        """``make(remember)`` once for this principal's key: ``make`` creates the resource in one transaction and
        calls ``remember(s, resource_id)`` in it. When the key names an earlier request's resource, ``load(s, id)``
        answers it (the same resource, read as it is now) and ``request.replayed`` is set; a key that named another
        request is InvalidInput. ``kind`` names the resource in messages (job, study, ...)."""
        if request is None:
            return make(_forget)

        def remember(s: Session, resource_id: str, *, flush: bool = True) -> None:
            self._remember(s, principal, request, kind, resource_id, flush=flush)

        for attempt in (1, 2):
            earlier = self._earlier(principal, request, load)
            if earlier is not None:
                request.replayed = True
                return earlier
            try:
                created = make(remember)
            except IntegrityError:
                # Most likely a concurrent request with the same key committed first: look again. Anything else
                # (or a winner that is not there after all) runs the create once more, then raises.
                if attempt == 2:
                    raise
                log.info("create with %s %r lost to a concurrent one; answering its resource", HEADER, request.key)
                continue
            request.audited = request.audit is not None
            return created
        raise AssertionError("unreachable")

    def _cutoff(self) -> datetime:
        return utcnow() - self.retention

    def _earlier(
        self, principal: Principal, request: IdempotentRequest, load: Callable[[Session, str], T | None]
    ) -> T | None:
        """The resource the key's live row names, or None when there is none; InvalidInput when the row is of
        another request, Conflict when its resource has been removed since."""
        with self.db.read() as s:
            params = {"org_id": principal.org_id, "user_id": principal.user_id, "key": request.key}
            row = s.connection().execute(_KEY_ROW, params).first()
            if row is None or row.created_at < self._cutoff():
                request.expired_found = row is not None
                return None
            if (row.method, row.path, row.fingerprint) != (request.method, request.path, request.fingerprint):
                same_route = (row.method, row.path) == (request.method, request.path)
                earlier = f"{row.method} {row.path}{' with another body' if same_route else ''}"
                raise InvalidInput(
                    f"{HEADER} {request.key!r} was used for a different request ({earlier}) within "
                    f"{describe_span(self.retention.total_seconds())}: use a new key",
                    details={"field": f"header.{HEADER}", "key": request.key},
                )
            found = load(s, row.resource_id)
            if found is None:
                raise Conflict(
                    f"{HEADER} {request.key!r} created {row.resource_kind} {row.resource_id}, which has been removed "
                    "since: use a new key to create it again",
                    details={"field": f"header.{HEADER}", "key": request.key, "id": row.resource_id},
                )
            return found

    def _remember(
        self,
        s: Session,
        principal: Principal,
        request: IdempotentRequest,
        kind: str,
        resource_id: str,
        *,
        flush: bool = True,
    ) -> None:
        """The key's row, in the create's transaction ``s``; IntegrityError at once (its flush, which writes what
        the create added before it too) when another request holds the key, or (``flush`` False) at the create's
        next flush."""
        if request.expired_found:
            # An expired row of this key not purged yet would hold the primary key: it goes, in this transaction.
            # (One that expired after that look — a retention shorter than a create — fails the insert: the
            # create is tried again, and its look finds it.)
            key = (IdempotencyKey.org_id == principal.org_id, IdempotencyKey.user_id == principal.user_id)
            s.execute(
                delete(IdempotencyKey).where(
                    *key, IdempotencyKey.key == request.key, IdempotencyKey.created_at < self._cutoff()
                )
            )
        s.add(
            IdempotencyKey(
                org_id=principal.org_id,
                user_id=principal.user_id,
                key=request.key,
                method=request.method,
                path=request.path,
                fingerprint=request.fingerprint,
                resource_kind=kind,
                resource_id=resource_id,
                created_at=utcnow(),
            )
        )
        if request.audit is not None:
            where = request.audit.resource
            audit.add(s, replace(request.audit, resource=f"{where} id={resource_id}" if where else f"id={resource_id}"))
        if flush:
            s.flush()

    def purge(self, s: Session) -> int:
        """Delete the expired keys, in ``s`` (the leased task ``purge-idempotency-keys``'s fenced transaction);
        how many went."""
        result = s.execute(delete(IdempotencyKey).where(IdempotencyKey.created_at < self._cutoff()))
        return int(getattr(result, "rowcount", 0) or 0)

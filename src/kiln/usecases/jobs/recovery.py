"""Getting platform-admin access back with no server running: ``kiln admin recover-key`` mints a platform-admin key
straight in the database (its secret sealed with the server key) and records it for the audit trail and for the
next server start to announce."""

from __future__ import annotations

import getpass
import logging
import re
import socket
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select

from kiln.auth.secrets import SecretBox, new_access_key_id, new_secret_key
from kiln.db.session import Database
from kiln.db.tables import AccessKey, AuditEvent, OfflineAction, Organization, User, utcnow
from kiln.domain.ids import new_id
from kiln.domain.schemas import NAME_PATTERN
from kiln.errors import Conflict, InvalidInput, KilnError, NotFound

log = logging.getLogger(__name__)


OFFLINE_ACTOR = "kiln admin (offline)"  # the audit record's client: no address, no key signed it
RECOVER_ACTION = "admin_recover_key"


@dataclass(frozen=True)
class Recovery:
    """What ``recover_platform_admin`` did: a new key of a platform admin, and what it changed on the user."""

    key_id: str
    secret_key: str
    user_name: str
    org_name: str
    created_user: bool
    reenabled_user: bool
    audit_event_id: int


def _operator() -> str:
    """Who ran an offline command, for the audit record: the OS user and the machine."""
    try:
        who = getpass.getuser()
    except (KeyError, OSError):
        who = "unknown"
    return f"{who}@{socket.gethostname()}"


def recover_platform_admin(
    db: Database,
    box: SecretBox,
    *,
    user_name: str | None = None,
    description: str = "recovery (kiln admin, offline)",
    expires_at: datetime | None = None,
) -> Recovery:
    """A new access key of a platform admin, made straight in the database by someone on the server's machine
    (``kiln admin recover-key``): the way back in when every platform-admin key is lost.

    ``user_name`` None: the first platform admin (the one the first start made). A platform admin of that name:
    that one. A name nobody has: a new platform admin (role ``admin``) in the first platform admin's
    organisation. A disabled platform admin is enabled again. An existing user who is not a platform admin is
    refused: recovery gives access back, it does not promote anyone.

    The key's secret is sealed with the server key like every other (``box`` must open the stored ones). In the
    same transaction: an audit event (client ``kiln admin (offline)``) and an ``offline_actions`` row that the
    next server start logs (``announce_offline_actions``).
    """
    if user_name is not None and not re.fullmatch(NAME_PATTERN, user_name):
        raise InvalidInput(f"not a user name: {user_name!r} (lowercase letters, digits and dashes)")
    now = utcnow()
    secret = new_secret_key()
    with db.transaction() as s:
        sealed = s.scalar(select(AccessKey.secret_encrypted).limit(1))
        if sealed is not None:
            try:
                box.open(sealed)
            except KilnError:
                raise KilnError(
                    "this server key does not open the stored access keys: give the server's own "
                    "($KILN_HOME/server.key, or KILN_SERVER_KEY as the server has it)"
                ) from None
        admins = list(s.scalars(select(User).where(User.platform_admin.is_(True)).order_by(User.created_at, User.id)))
        created = False
        if user_name is None:
            if not admins:
                raise NotFound("there is no platform admin yet: start `kiln server` once, it creates one (admin.env)")
            user = admins[0]
        else:
            found = s.scalar(select(User).where(User.name == user_name))
            if found is not None and not found.platform_admin:
                raise Conflict(
                    f"user {user_name} exists and is not a platform admin: recovery does not promote anyone; "
                    "give a new name to create a new platform admin, or leave --user out"
                )
            if found is None:
                if not admins:
                    raise NotFound("there is no platform admin yet: start `kiln server` once, it creates one")
                found = User(
                    id=new_id("usr"),
                    org_id=admins[0].org_id,
                    name=user_name,
                    role="admin",
                    platform_admin=True,
                    created_at=now,
                )
                s.add(found)
                s.flush()
                created = True
            user = found
        reenabled = user.disabled
        user.disabled = False
        key = AccessKey(
            id=new_access_key_id(),
            user_id=user.id,
            secret_encrypted=box.seal(secret),
            description=description[:256],
            expires_at=expires_at,
            created_at=now,
            enabled=True,
        )
        s.add(key)
        org = s.get(Organization, user.org_id)
        assert org is not None
        changed = "created the user" if created else ("enabled the user again" if reenabled else "")
        operator = _operator()
        detail = f"platform-admin key for {user.name} made offline by {operator}" + (f"; {changed}" if changed else "")
        event = AuditEvent(
            time=now,
            org_id=org.id,
            user_id=user.id,
            key_id=None,  # no key signed this: it was done on the server's machine
            action=RECOVER_ACTION,
            resource=f"id={key.id}",
            outcome="success",
            status=201,
            client=OFFLINE_ACTOR,
            detail=detail[:256],
        )
        s.add(event)
        s.flush()
        s.add(
            OfflineAction(
                time=now,
                action=RECOVER_ACTION,
                audit_event_id=event.id,
                message=(
                    f"a platform-admin access key {key.id} for user {user.name} was created offline by "
                    f"`kiln admin recover-key` ({operator}, {now:%Y-%m-%d %H:%M:%S} UTC"
                    + (f"; {changed}" if changed else "")
                    + f"); audit event {event.id}"
                ),
            )
        )
        return Recovery(key.id, secret, user.name, org.name, created, reenabled, event.id)


def announce_offline_actions(db: Database) -> list[str]:
    """Log, once, each thing ``kiln admin`` did offline (at server start); returns the messages logged.

    Rows are claimed with ``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so replicas starting together log each once."""
    now = utcnow()
    with db.transaction() as s:
        rows = list(
            s.scalars(
                select(OfflineAction)
                .where(OfflineAction.announced_at.is_(None))
                .order_by(OfflineAction.id)
                .with_for_update(skip_locked=True)
            )
        )
        for row in rows:
            row.announced_at = now
        messages = [row.message for row in rows]
    for message in messages:
        log.warning("offline admin action: %s", message)
    return messages

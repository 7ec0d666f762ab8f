"""Organisations, users and access keys.

Scoping rule everywhere: a caller sees only its own organisation unless it is a platform admin; anything else
answers 404 exactly like something that does not exist. Permissions come from kiln.domain.policy.

Nothing here may remove the last way in: disabling or deleting the last working platform-admin key, or disabling
the last platform admin who has one, answers 409 (see ``lock_platform_admins``). Platform admins are made only
by the first start and, offline, by ``kiln admin recover-key`` (kiln.usecases.jobs.recovery.recover_platform_admin).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kiln.auth.secrets import SecretBox, new_access_key_id, new_secret_key
from kiln.db.session import Database
from kiln.db.tables import AccessKey, Organization, User, utcnow
from kiln.domain.ids import new_id
from kiln.domain.schemas import KeyCreate, KeyCreated, KeyRead, OrgRead, OrgUpdate, UserCreate, UserRead
from kiln.errors import Conflict, InvalidInput, NotFound
from kiln.usecases.access.identity import IdentityService, Principal


def org_read(org: Organization) -> OrgRead:
    return OrgRead(
        id=org.id,
        name=org.name,
        share_weight=org.share_weight,
        max_priority=org.max_priority,  # type: ignore[arg-type]  # the column only ever holds a Priority
        created_at=org.created_at,
    )


def user_read(user: User, org: Organization) -> UserRead:
    return UserRead(
        id=user.id,
        name=user.name,
        org_id=org.id,
        org_name=org.name,
        role=user.role,
        platform_admin=user.platform_admin,
        disabled=user.disabled,
        created_at=user.created_at,
    )


def key_read(key: AccessKey, user: User) -> KeyRead:
    return KeyRead(
        id=key.id,
        user_id=user.id,
        user_name=user.name,
        org_id=user.org_id,
        enabled=key.enabled,
        expires_at=key.expires_at,
        created_at=key.created_at,
        last_used_at=key.last_used_at,
        description=key.description,
    )


def find_org(s: Session, principal: Principal, ref: str) -> Organization:
    """The organisation by id or name, if the caller may see it."""
    org = s.scalar(select(Organization).where(or_(Organization.id == ref, Organization.name == ref)))
    if org is None or not (principal.platform_admin or org.id == principal.org_id):
        raise NotFound(f"organisation {ref} not found")
    return org


def find_user(s: Session, principal: Principal, ref: str) -> tuple[User, Organization]:
    row = s.execute(
        select(User, Organization)
        .join(Organization, Organization.id == User.org_id)
        .where(or_(User.id == ref, User.name == ref))
    ).first()
    if row is None or not (principal.platform_admin or row[0].org_id == principal.org_id):
        raise NotFound(f"user {ref} not found")
    return row[0], row[1]


def usable_admin_keys(s: Session, now: datetime) -> list[tuple[str, str]]:
    """(key id, user id) of every key that signs requests as a platform admin right now: enabled, unexpired,
    of an enabled platform-admin user."""
    query = (
        select(AccessKey.id, User.id)
        .join(User, User.id == AccessKey.user_id)
        .where(
            User.platform_admin.is_(True),
            User.disabled.is_(False),
            AccessKey.enabled.is_(True),
            or_(AccessKey.expires_at.is_(None), AccessKey.expires_at > now),
        )
    )
    return [(key_id, user_id) for key_id, user_id in s.execute(query)]


def lock_platform_admins(s: Session) -> None:
    """Serialise every change that could take away the last platform-admin key, before counting what remains.

    PostgreSQL: ``SELECT ... FOR UPDATE`` of every platform-admin user row, in id order (the same order in every
    caller, so two of them never deadlock). A second transaction that wants to disable a key or a user of the
    admins waits here until the first commits; under READ COMMITTED (PostgreSQL's default, which Kiln keeps) its
    next statement, the count of what is left (``usable_admin_keys``), then sees what the first committed: of two
    concurrent disables of the last two admin keys, the second finds one left — its own — and answers 409.
    Platform admins are never demoted and new ones only add keys, so the set of rows to lock is stable.
    SQLite: FOR UPDATE is not emitted there, and need not be: every write transaction starts with BEGIN IMMEDIATE
    (kiln.db.session), so writers run one at a time and the count that follows is taken under the write lock.
    """
    s.execute(select(User.id).where(User.platform_admin.is_(True)).order_by(User.id).with_for_update()).all()


class AccountService:
    def __init__(self, db: Database, box: SecretBox, identity: IdentityService) -> None:
        self.db = db
        self.box = box
        self.identity = identity

    # -- organisations --------------------------------------------------------------------------------

    def create_org(self, principal: Principal, name: str) -> OrgRead:
        principal.require("orgs:manage")
        try:
            with self.db.transaction() as s:
                org = Organization(id=new_id("org"), name=name, created_at=utcnow())
                s.add(org)
                s.flush()
                return org_read(org)
        except IntegrityError:
            raise Conflict(f"an organisation named {name!r} already exists") from None

    def list_orgs(self, principal: Principal) -> list[OrgRead]:
        principal.require("orgs:read")
        with self.db.read() as s:
            query = select(Organization).order_by(Organization.name)
            if not principal.platform_admin:
                query = query.where(Organization.id == principal.org_id)
            return [org_read(o) for o in s.scalars(query)]

    def update_org(self, principal: Principal, ref: str, body: OrgUpdate) -> OrgRead:
        """Scheduling settings (platform admins): fair-share weight and the highest priority class allowed."""
        principal.require("orgs:manage")
        with self.db.transaction() as s:
            org = find_org(s, principal, ref)
            if body.share_weight is not None:
                org.share_weight = body.share_weight
            if body.max_priority is not None:
                org.max_priority = body.max_priority
            return org_read(org)

    def get_org(self, principal: Principal, ref: str) -> OrgRead:
        principal.require("orgs:read")
        with self.db.read() as s:
            return org_read(find_org(s, principal, ref))

    # -- users ----------------------------------------------------------------------------------------

    def create_user(self, principal: Principal, body: UserCreate) -> UserRead:
        principal.require("users:manage")
        try:
            with self.db.transaction() as s:
                org = find_org(s, principal, body.org or principal.org_id)
                user = User(id=new_id("usr"), org_id=org.id, name=body.name, role=body.role, created_at=utcnow())
                s.add(user)
                s.flush()
                return user_read(user, org)
        except IntegrityError:
            raise Conflict(f"a user named {body.name!r} already exists") from None

    def list_users(self, principal: Principal, org: str | None = None) -> list[UserRead]:
        principal.require("users:read")
        with self.db.read() as s:
            query = select(User, Organization).join(Organization, Organization.id == User.org_id).order_by(User.name)
            if org is not None:
                query = query.where(User.org_id == find_org(s, principal, org).id)
            elif not principal.platform_admin:
                query = query.where(User.org_id == principal.org_id)
            return [user_read(u, o) for u, o in s.execute(query)]

    def get_user(self, principal: Principal, ref: str) -> UserRead:
        if ref in (principal.user_id, principal.user_name) and not principal.job_id:
            pass  # everyone may read themselves
        else:
            principal.require("users:read")
        with self.db.read() as s:
            return user_read(*find_user(s, principal, ref))

    def set_user_disabled(self, principal: Principal, ref: str, disabled: bool) -> UserRead:
        principal.require("users:manage")
        with self.db.transaction() as s:
            user, org = find_user(s, principal, ref)
            if user.platform_admin and not principal.platform_admin:
                raise NotFound(f"user {ref} not found")
            if disabled and user.platform_admin:
                lock_platform_admins(s)
                left = [k for k, owner in usable_admin_keys(s, utcnow()) if owner != user.id]
                if not left:
                    raise Conflict(
                        f"user {user.name} is the last enabled platform admin with a working access key: disabling "
                        "them would lock every platform admin out. Another platform admin can only be made on the "
                        "server's machine, with `kiln admin recover-key --user NAME`",
                        details={"reason": "last_platform_admin"},
                    )
            if user.id == principal.user_id and disabled:
                raise Conflict("you cannot disable yourself")
            user.disabled = disabled
            read = user_read(user, org)
        self.identity.invalidate()
        return read

    # -- access keys ----------------------------------------------------------------------------------

    def _target_user(self, s: Session, principal: Principal, ref: str | None) -> User:
        if ref is None or ref in (principal.user_id, principal.user_name):
            principal.require("keys:self")
            user, _ = find_user(s, principal, principal.user_id)
            return user
        principal.require("keys:manage")
        user, _ = find_user(s, principal, ref)
        if user.platform_admin and not principal.platform_admin:
            raise NotFound(f"user {ref} not found")
        return user

    def create_key(self, principal: Principal, body: KeyCreate) -> KeyCreated:
        now = utcnow()
        expires = body.expires_at
        if body.expires_in is not None:
            if expires is not None:
                raise InvalidInput("give expires_at or expires_in, not both")
            expires = now + timedelta(seconds=body.expires_in)
        if expires is not None:
            if expires.tzinfo is None:
                raise InvalidInput("expires_at: give a time zone (e.g. 2027-01-01T00:00:00Z)")
            if expires <= now:
                raise InvalidInput("expires_at: must be in the future")
        with self.db.transaction() as s:
            user = self._target_user(s, principal, body.user)
            secret = new_secret_key()
            key = AccessKey(
                id=new_access_key_id(),
                user_id=user.id,
                secret_encrypted=self.box.seal(secret),
                expires_at=expires,
                description=body.description,
                created_at=now,
                enabled=True,
            )
            s.add(key)
            s.flush()
            return KeyCreated(**key_read(key, user).model_dump(), secret_key=secret)

    def list_keys(self, principal: Principal, user: str | None = None) -> list[KeyRead]:
        principal.require("keys:read")
        with self.db.read() as s:
            query = select(AccessKey, User).join(User, User.id == AccessKey.user_id).order_by(AccessKey.created_at)
            if user is not None:
                target, _ = find_user(s, principal, user)
                if target.id != principal.user_id:
                    principal.require("keys:manage")
                query = query.where(User.id == target.id)
            elif principal.platform_admin:
                pass
            elif principal.can("keys:manage"):
                query = query.where(User.org_id == principal.org_id)
            else:
                query = query.where(User.id == principal.user_id)
            return [key_read(k, u) for k, u in s.execute(query)]

    def _find_key(self, s: Session, principal: Principal, key_id: str) -> tuple[AccessKey, User]:
        row = s.execute(select(AccessKey, User).join(User, User.id == AccessKey.user_id).where(AccessKey.id == key_id))
        found = row.first()
        if found is None or not (principal.platform_admin or found[1].org_id == principal.org_id):
            raise NotFound(f"key {key_id} not found")
        key, user = found
        if user.id == principal.user_id:
            principal.require("keys:self")
        else:
            principal.require("keys:manage")
            if user.platform_admin and not principal.platform_admin:
                raise NotFound(f"key {key_id} not found")
        return key, user

    @staticmethod
    def _check_not_last_admin(s: Session, key: AccessKey, user: User, doing: str) -> None:
        """409 when ``key`` is the only key left that signs requests as a platform admin."""
        if not user.platform_admin:
            return  # nobody is ever made a platform admin through the API, so this cannot change under us
        lock_platform_admins(s)
        usable = [k for k, _ in usable_admin_keys(s, utcnow())]
        if usable == [key.id]:
            raise Conflict(
                f"access key {key.id} is the last enabled platform-admin key: {doing} it would lock every platform "
                "admin out. Create another platform-admin key first (kiln keys create)",
                details={"reason": "last_platform_admin_key"},
            )

    def disable_key(self, principal: Principal, key_id: str) -> KeyRead:
        with self.db.transaction() as s:
            key, user = self._find_key(s, principal, key_id)
            self._check_not_last_admin(s, key, user, "disabling")
            key.enabled = False
            read = key_read(key, user)
        self.identity.invalidate(key_id)
        return read

    def delete_key(self, principal: Principal, key_id: str) -> None:
        with self.db.transaction() as s:
            key, user = self._find_key(s, principal, key_id)
            self._check_not_last_admin(s, key, user, "deleting")
            s.delete(key)
        self.identity.invalidate(key_id)

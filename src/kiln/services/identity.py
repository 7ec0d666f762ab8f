"""Who is calling: the admin bootstrap and the verification of signed requests."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError

from kiln.auth import signing
from kiln.auth.secrets import SecretBox, new_access_key_id, new_secret_key
from kiln.db.models import AccessKey, Nonce, Organization, User, utcnow
from kiln.db.session import Database
from kiln.domain.ids import new_id
from kiln.errors import Unauthenticated
from kiln.sdk.config import write_config_file
from kiln.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Principal:
    user_id: str
    user_name: str
    org_id: str
    org_name: str
    key_id: str
    role: str
    platform_admin: bool


@dataclass(frozen=True)
class Credentials:
    endpoint: str
    access_key: str
    secret_key: str


class AuthFailure(Unauthenticated):
    """401 with a stable, coarse reason: clients learn what class of thing failed, never which key exists."""

    def __init__(self, reason: str, log_detail: str = "") -> None:
        super().__init__("request authentication failed", details={"reason": reason})
        self.reason = reason
        self.log_detail = log_detail


class IdentityService:
    def __init__(self, db: Database, box: SecretBox, settings: Settings) -> None:
        self.db = db
        self.box = box
        self.settings = settings

    # -- bootstrap ------------------------------------------------------------------------------------

    def bootstrap(self) -> Credentials | None:
        """On first start create the admin organisation, user and key and write ``admin.env`` (0600)."""
        with self.db.transaction() as s:
            if s.scalar(select(User.id).limit(1)) is not None:
                return None
            org = Organization(id=new_id("org"), name="admin")
            user = User(id=new_id("usr"), org_id=org.id, name="admin", role="admin", platform_admin=True)
            key_id, secret = new_access_key_id(), new_secret_key()
            s.add(org)
            s.flush()
            s.add(user)
            s.flush()
            s.add(AccessKey(id=key_id, user_id=user.id, secret_encrypted=self.box.seal(secret)))
        creds = Credentials(self.settings.endpoint, key_id, secret)
        write_env_file(self.settings.home / "admin.env", creds)
        return creds

    # -- authentication -------------------------------------------------------------------------------

    def authenticate(
        self,
        *,
        method: str,
        path: str,
        query: str,
        headers: dict[str, str],
        body_sha256: str | None,
        allow_unsigned_payload: bool = False,
    ) -> Principal:
        """Check one signed request (see kiln.auth.signing); raise AuthFailure on anything wrong."""
        auth = headers.get("authorization")
        date = headers.get(signing.HEADER_DATE.lower())
        nonce = headers.get(signing.HEADER_NONCE.lower())
        content = headers.get(signing.HEADER_CONTENT.lower())
        if not (auth and date and nonce and content):
            raise AuthFailure("missing_headers")
        parsed = signing.parse_authorization(auth)
        if parsed is None or not signing.DATE_PATTERN.fullmatch(date) or not signing.NONCE_PATTERN.fullmatch(nonce):
            raise AuthFailure("malformed")
        key_id, sig = parsed
        now = utcnow()
        if abs(now.timestamp() - int(date)) > self.settings.clock_skew_seconds:
            raise AuthFailure("stale", f"key {key_id}: date {date} outside the window")
        if content == signing.UNSIGNED_PAYLOAD:
            if not allow_unsigned_payload:
                raise AuthFailure("malformed", "UNSIGNED-PAYLOAD on a route that needs a body hash")
        elif not signing.SHA256_HEX.fullmatch(content) or (body_sha256 is not None and content != body_sha256):
            raise AuthFailure("signature", f"key {key_id}: body hash mismatch")
        canonical = signing.canonical_query_from_raw(query)
        expected_text = signing.string_to_sign(method, path, canonical, date, nonce, content)
        with self.db.transaction() as s:
            row = s.execute(
                select(AccessKey, User, Organization)
                .join(User, User.id == AccessKey.user_id)
                .join(Organization, Organization.id == User.org_id)
                .where(AccessKey.id == key_id)
            ).first()
            if row is None:
                raise AuthFailure("signature", f"unknown key {key_id}")
            key, user, org = row
            expected = signing.signature(self.box.open(key.secret_encrypted), expected_text)
            if not signing.signatures_equal(expected, sig):
                raise AuthFailure("signature", f"key {key_id}: signature mismatch")
            if not key.enabled or user.disabled:
                raise AuthFailure("signature", f"key {key_id}: disabled")
            if key.expires_at is not None and key.expires_at <= now:
                raise AuthFailure("signature", f"key {key_id}: expired")
            try:
                with s.begin_nested():
                    s.add(Nonce(key_id=key_id, nonce=nonce, seen_at=now))
            except IntegrityError:
                raise AuthFailure("replayed", f"key {key_id}: nonce reused") from None
            return Principal(
                user_id=user.id,
                user_name=user.name,
                org_id=org.id,
                org_name=org.name,
                key_id=key_id,
                role=user.role,
                platform_admin=user.platform_admin,
            )

    def purge_nonces(self) -> int:
        cutoff = utcnow() - timedelta(seconds=self.settings.nonce_ttl_seconds + self.settings.clock_skew_seconds)
        with self.db.transaction() as s:
            result = s.execute(delete(Nonce).where(Nonce.seen_at < cutoff))
            return int(getattr(result, "rowcount", 0) or 0)


def write_env_file(path: Path, creds: Credentials) -> None:
    write_config_file(path, creds.endpoint, creds.access_key, creds.secret_key)

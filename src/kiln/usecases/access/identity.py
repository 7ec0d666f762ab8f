"""Who is calling: the admin bootstrap and the verification of signed requests."""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from kiln.auth import failures, signing
from kiln.auth.credfile import write_config_file
from kiln.auth.secrets import SecretBox, new_access_key_id, new_secret_key
from kiln.db.session import Database
from kiln.db.tables import AccessKey, Job, Nonce, Organization, User, utcnow
from kiln.domain import policy
from kiln.domain.ids import new_id
from kiln.domain.states import JobState
from kiln.errors import Forbidden, Unauthenticated
from kiln.settings import Settings

log = logging.getLogger(__name__)

KEY_CACHE_SECONDS = 5.0
# A cached key older than this is read again off the request path (refresh_due, refresh_key) while requests go on
# using it: under steady traffic a key never expires in front of a request.
KEY_REFRESH_SECONDS = KEY_CACHE_SECONDS / 2
NONCE_FLUSH_SECONDS = 0.1  # SQLite: how often accepted nonces are written to the table (MemoryNonceStore)
LAST_USED_INTERVAL = 60.0  # seconds between writes of a key's last_used_at (one a minute per key is plenty)


@dataclass(frozen=True)
class Principal:
    """The authenticated caller: a user through one of their access keys, or a running job's token."""

    user_id: str
    user_name: str
    org_id: str
    org_name: str
    key_id: str
    role: str
    platform_admin: bool
    job_id: str | None = None  # set for job tokens: the only job this caller may touch
    service_id: str | None = None  # set for service tokens: the only service this caller may predict on

    @property
    def permissions(self) -> frozenset[str]:
        if self.service_id:
            return policy.SERVICE_TOKEN
        return policy.JOB_TOKEN if self.job_id else policy.permissions(self.role, self.platform_admin)

    def can(self, permission: str) -> bool:
        return permission in self.permissions

    def require(self, permission: str) -> None:
        if permission not in self.permissions:
            raise Forbidden(f"{self.describe()} may not do this (needs {permission})")

    def describe(self) -> str:
        if self.job_id:
            return f"the token of job {self.job_id}"
        if self.service_id:
            return "a service token"
        return "a platform admin" if self.platform_admin else f"role {self.role} in org {self.org_name}"


@dataclass(frozen=True)
class Credentials:
    endpoint: str
    access_key: str
    secret_key: str


class AuthFailure(Unauthenticated, refines_code=True):
    """401 with a stable reason (``kiln.auth.failures``) and a message that says what to check: which access key
    does not exist, is disabled or expired, how far the request's clock is off; never anything about a secret.
    The attributes (never sent to the client) let the audit log say whose key was tried."""

    def __init__(
        self,
        reason: str,
        log_detail: str = "",
        *,
        key_id: str | None = None,
        org_id: str | None = None,
        user_id: str | None = None,
        message: str | None = None,
        facts: dict[str, Any] | None = None,
    ) -> None:
        text = message or failures.MESSAGES.get(reason, "request authentication failed")
        super().__init__(text, details={"reason": reason, **(facts or {})})
        self.reason = reason
        self.log_detail = log_detail
        self.key_id = key_id
        self.org_id = org_id
        self.user_id = user_id


@dataclass
class _CachedKey:
    key_id: str
    secret: str
    enabled: bool
    expires_at: datetime | None
    principal: Principal
    user_disabled: bool
    fetched: float
    last_used_written: float = 0.0


class MemoryNonceStore:
    """The replay check of a single-process server (SQLite): used nonces in memory, persisted write-behind.

    With SQLite exactly one server process answers for a database (it holds a lock on $KILN_HOME), so a set in
    its memory is the authoritative record of the nonces it accepted: checking one costs a dictionary lookup
    instead of a write transaction per request. A nonce is kept for twice the clock-skew window (a request
    dated ``d`` passes the date check only until ``d + skew``, and it was accepted at the latest at ``d + skew``
    too, so a replay after ``accepted + 2 * skew`` is refused as ``stale`` anyway); older ones are dropped as
    new ones arrive. Accepted nonces are appended to the ``nonces`` table every ``flush_interval`` seconds (the
    server's task ``nonce-flush``, kiln.tasks.nonce_flush) and at shutdown, and the ones still inside the window
    are loaded back at start, so that a restart opens no replay window. A hard crash (SIGKILL, power loss) loses
    at most the last ``flush_interval`` of nonces: those requests could be replayed to the restarted server until
    their date leaves the window (docs/signing.md).
    """

    def __init__(self, db: Database, retention_seconds: float, flush_interval: float = 0.1) -> None:
        self.db = db
        self.retention = retention_seconds
        self.flush_interval = flush_interval
        self._seen: dict[tuple[str, str], float] = {}  # (key id, nonce) -> seen at (Unix seconds)
        self._order: deque[tuple[str, str]] = deque()  # the same keys, oldest first
        self._pending: list[dict[str, Any]] = []  # accepted, not yet in the table
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()  # one flush at a time (the task's, or the last one at close)
        self._insert = sqlite_insert(Nonce).on_conflict_do_nothing(index_elements=["key_id", "nonce"])
        self._load()
        db.on_dispose(self.close)

    def _load(self) -> None:
        cutoff = time.time() - self.retention
        with self.db.read() as s:
            rows = s.execute(
                select(Nonce.key_id, Nonce.nonce, Nonce.seen_at)
                .where(Nonce.seen_at >= datetime.fromtimestamp(cutoff, UTC))
                .order_by(Nonce.seen_at)
            ).all()
        with self._lock:
            for key_id, nonce, seen_at in rows:
                self._remember((key_id, nonce), seen_at.timestamp())
        if rows:
            log.info("loaded %d nonces of the replay window", len(rows))

    def _remember(self, key: tuple[str, str], seen_at: float) -> None:
        self._seen[key] = seen_at
        self._order.append(key)

    def use(self, key_id: str, nonce: str, now: datetime) -> bool:
        """Record the nonce as used; False when it was used before (a replay)."""
        key = (key_id, nonce)
        seen_at = now.timestamp()
        with self._lock:
            if key in self._seen:
                return False
            self._remember(key, seen_at)
            self._pending.append({"key_id": key_id, "nonce": nonce, "seen_at": now})
            self._prune(seen_at - self.retention)
        return True

    def _prune(self, cutoff: float) -> None:
        order, seen = self._order, self._seen
        while order:
            oldest = order[0]
            at = seen.get(oldest)
            if at is not None and at >= cutoff:
                return
            order.popleft()
            seen.pop(oldest, None)

    def __len__(self) -> int:
        return len(self._seen)

    def flush(self) -> int:
        """Write the accepted nonces not yet in the table; returns how many."""
        with self._flush_lock:
            with self._lock:
                batch, self._pending = self._pending, []
            if not batch:
                return 0
            try:
                with self.db.engine.begin() as conn:
                    conn.execute(self._insert, batch)
            except Exception:
                log.exception("could not persist %d nonces; will retry", len(batch))
                with self._lock:
                    if len(self._pending) < 1_000_000:
                        self._pending[:0] = batch
                return 0
            return len(batch)

    def close(self) -> None:
        """Write what is left (at shutdown, after the runner stopped, before the engine goes)."""
        self.flush()


class IdentityService:
    def __init__(self, db: Database, box: SecretBox, settings: Settings, token_key: bytes) -> None:
        self.db = db
        self.box = box
        self.settings = settings
        self._cache: dict[str, _CachedKey] = {}
        insert = postgresql_insert if db.dialect == "postgresql" else sqlite_insert
        # RETURNING says whether the row went in: the result's rowcount of an INSERT is not reliable (-1 with
        # psycopg 3 under SQLAlchemy 2.1, which let every replay through on PostgreSQL).
        self._insert_nonce = (
            insert(Nonce).on_conflict_do_nothing(index_elements=["key_id", "nonce"]).returning(Nonce.nonce)
        )
        # The default SQLite database of $KILN_HOME has one server process (it holds the home's lock and claims the
        # file), so replays are checked in its memory, written behind to the table. Anywhere else (PostgreSQL
        # replicas, a SQLite file named by KILN_DATABASE_URL that other servers may open): a synchronous INSERT.
        self.nonces: MemoryNonceStore | None = None
        if db.dialect == "sqlite" and settings.database_url is None and db.claim_exclusive():
            self.nonces = MemoryNonceStore(db, 2 * settings.clock_skew_seconds + 1, NONCE_FLUSH_SECONDS)
        self._cache_lock = threading.Lock()
        self._refreshing: set[str] = set()  # key ids whose refresh_key is due or running
        # Job tokens are MACed with a key derived from the server key, never with the key itself.
        self._token_key = hashlib.sha256(b"kiln-job-token\x00" + token_key).digest()

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
            s.add(
                AccessKey(id=key_id, user_id=user.id, secret_encrypted=self.box.seal(secret), description="bootstrap")
            )
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
        """Check one signed request (see kiln.auth.signing); raise AuthFailure on anything wrong. May block on
        the database (run it in a worker thread)."""
        principal = self._authenticate(method, path, query, headers, body_sha256, allow_unsigned_payload, True)
        assert principal is not None
        return principal

    def authenticate_nonblocking(
        self,
        *,
        method: str,
        path: str,
        query: str,
        headers: dict[str, str],
        body_sha256: str | None,
        allow_unsigned_payload: bool = False,
    ) -> Principal | None:
        """The same checks as ``authenticate`` without touching the database, for the event loop: None (and
        nothing used up, the nonce included) when they need it (a key not in the cache, the nonce store in
        the database); then call ``authenticate``. Re-reading a cached key and writing its last-use time are
        left to ``refresh_key``, which ``refresh_due`` says when to run."""
        if self.nonces is None:
            return None
        return self._authenticate(method, path, query, headers, body_sha256, allow_unsigned_payload, False)

    def _authenticate(
        self,
        method: str,
        path: str,
        query: str,
        headers: dict[str, str],
        body_sha256: str | None,
        allow_unsigned_payload: bool,
        blocking: bool,
    ) -> Principal | None:
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
        if not signing.ACCESS_KEY_PATTERN.fullmatch(key_id):
            raise AuthFailure("malformed", "credential is not an access key id", message=failures.NOT_AN_ACCESS_KEY)
        if blocking:
            key = self._key(key_id)
        else:
            key = self._cached_key(key_id)
            if key is None:
                return None
        who: dict[str, Any] = {"key_id": key_id[:64]}
        if key is not None:
            who.update(org_id=key.principal.org_id, user_id=key.principal.user_id)
        now = utcnow()
        if abs(now.timestamp() - int(date)) > self.settings.clock_skew_seconds:
            text, facts = failures.skew(int(date), int(now.timestamp()), self.settings.clock_skew_seconds)
            raise AuthFailure(
                "stale", f"key {key_id}: date {date} outside the window", message=text, facts=facts, **who
            )
        if content == signing.UNSIGNED_PAYLOAD:
            if not allow_unsigned_payload:
                text = failures.UNSIGNED_NOT_HERE
                raise AuthFailure(
                    "malformed", "UNSIGNED-PAYLOAD on a route that needs a body hash", message=text, **who
                )
        elif not signing.SHA256_HEX.fullmatch(content):
            raise AuthFailure("malformed", f"key {key_id}: bad body hash", message=failures.NOT_A_BODY_HASH, **who)
        elif body_sha256 is not None and content != body_sha256:
            raise AuthFailure("body_hash", f"key {key_id}: body hash mismatch", **who)
        # Access key ids are not secret (every request carries one): an unknown one is named as such, like AWS's
        # InvalidAccessKeyId. A key's state is told only to a caller whose signature proved they hold its secret.
        if key is None:
            raise AuthFailure("unknown_key", f"unknown key {key_id}", message=failures.unknown_key(key_id), **who)
        canonical = signing.canonical_query_from_raw(query)
        expected = signing.signature(key.secret, signing.string_to_sign(method, path, canonical, date, nonce, content))
        if not signing.signatures_equal(expected, sig):
            text = failures.signature_mismatch(key_id)
            raise AuthFailure("signature", f"key {key_id}: signature mismatch", message=text, **who)
        if not key.enabled or key.user_disabled:
            text = failures.key_disabled(key_id, user=key.enabled)
            raise AuthFailure("key_disabled", f"key {key_id}: disabled", message=text, **who)
        if key.expires_at is not None and key.expires_at <= now:
            text = failures.key_expired(key_id, key.expires_at)
            raise AuthFailure("key_expired", f"key {key_id}: expired", message=text, **who)
        if self.nonces is not None:
            if not self.nonces.use(key_id, nonce, now):
                raise AuthFailure("replayed", f"key {key_id}: nonce reused", **who)
            if blocking and time.monotonic() - key.last_used_written > LAST_USED_INTERVAL:
                self._write_last_used(key, now)
            return key.principal
        # Several replicas may share the database: one lean insert that fails on a replay (no ORM session).
        with self.db.engine.begin() as conn:
            inserted = conn.execute(self._insert_nonce, {"key_id": key_id, "nonce": nonce, "seen_at": now}).first()
            if inserted is None:
                raise AuthFailure("replayed", f"key {key_id}: nonce reused", **who)
            if time.monotonic() - key.last_used_written > LAST_USED_INTERVAL:  # one write a minute per key is plenty
                key.last_used_written = time.monotonic()
                conn.execute(update(AccessKey).where(AccessKey.id == key_id).values(last_used_at=now))
        return key.principal

    def authenticate_key(self, key_id: str, secret: str | None = None, *, blocking: bool = True) -> Principal | None:
        """The caller behind access key ``key_id`` without a signed request, for the web console: its sign-in
        (``secret`` given: it must be the key's) and each request of its session (whose token's MAC proved the
        sign-in). Refused as a signed request would be (AuthFailure): an unknown key, a wrong secret, a disabled
        key or user, an expired key. Not ``blocking``: None (nothing checked) when that needs the database."""
        if not signing.ACCESS_KEY_PATTERN.fullmatch(key_id):
            raise AuthFailure("malformed", "not an access key id", message=failures.NOT_AN_ACCESS_KEY)
        key = self._key(key_id) if blocking else self._cached_key(key_id)
        if not blocking and (key is None or time.monotonic() - key.last_used_written > LAST_USED_INTERVAL):
            return None
        who: dict[str, Any] = {"key_id": key_id}
        if key is None:
            raise AuthFailure("unknown_key", f"unknown key {key_id}", message=failures.unknown_key(key_id), **who)
        who.update(org_id=key.principal.org_id, user_id=key.principal.user_id)
        if secret is not None and not hmac.compare_digest(key.secret.encode(), secret.encode("utf-8", "replace")):
            text = failures.signature_mismatch(key_id)
            raise AuthFailure("signature", f"key {key_id}: wrong secret", message=text, **who)
        if not key.enabled or key.user_disabled:
            text = failures.key_disabled(key_id, user=key.enabled)
            raise AuthFailure("key_disabled", f"key {key_id}: disabled", message=text, **who)
        now = utcnow()
        if key.expires_at is not None and key.expires_at <= now:
            text = failures.key_expired(key_id, key.expires_at)
            raise AuthFailure("key_expired", f"key {key_id}: expired", message=text, **who)
        if time.monotonic() - key.last_used_written > LAST_USED_INTERVAL:  # only when blocking (above)
            key.last_used_written = time.monotonic()
            with self.db.engine.begin() as conn:
                conn.execute(update(AccessKey).where(AccessKey.id == key_id).values(last_used_at=now))
        return key.principal

    def refresh_due(self, key_id: str) -> bool:
        """Whether the caller, having just used ``key_id``, should now run ``refresh_key(key_id)`` in a worker
        thread, without waiting for it: its cached entry is past ``KEY_REFRESH_SECONDS`` or its last-use time is
        due to be written, and no refresh of it is under way. True once per refresh.

        Without it every request that came after the entry expired read the key itself in a worker thread,
        behind whatever database work was queued there: at 16 concurrent predicts, 16 waits every 5 s."""
        cached = self._cache.get(key_id)  # a single dict read: atomic, no lock needed
        if cached is None:
            return False
        now = time.monotonic()
        if now - cached.fetched < KEY_REFRESH_SECONDS and now - cached.last_used_written <= LAST_USED_INTERVAL:
            return False
        with self._cache_lock:
            if key_id in self._refreshing:
                return False
            self._refreshing.add(key_id)
        return True

    def refresh_key(self, key_id: str) -> None:
        """Read the key again into the cache and write its last-use time when due (blocks on the database). A
        failure is logged: the entry then expires as it would have, and the next request reads it itself."""
        try:
            key = self._key(key_id, reread=True)
            if key is not None and time.monotonic() - key.last_used_written > LAST_USED_INTERVAL:
                self._write_last_used(key, utcnow())
        except Exception:
            log.exception("could not refresh access key %s", key_id)
        finally:
            with self._cache_lock:
                self._refreshing.discard(key_id)

    def _write_last_used(self, key: _CachedKey, now: datetime) -> None:
        key.last_used_written = time.monotonic()
        with self.db.engine.begin() as conn:
            conn.execute(update(AccessKey).where(AccessKey.id == key.key_id).values(last_used_at=now))

    def _cached_key(self, key_id: str) -> _CachedKey | None:
        """The cached key if it is fresh, else None (no database access)."""
        cached = self._cache.get(key_id)  # a single dict read: atomic, no lock needed
        if cached is not None and time.monotonic() - cached.fetched < KEY_CACHE_SECONDS:
            return cached
        return None

    def _key(self, key_id: str, reread: bool = False) -> _CachedKey | None:
        """The key, its user and organisation, cached for a few seconds (changes made through this server
        invalidate at once; another replica's changes are seen within ``KEY_CACHE_SECONDS``); ``reread``: from
        the database even when cached."""
        with self._cache_lock:
            cached = self._cache.get(key_id)
        if not reread and cached is not None and time.monotonic() - cached.fetched < KEY_CACHE_SECONDS:
            return cached
        fetched = time.monotonic()  # before the read: the entry is never younger than what it holds
        with self.db.read() as s:
            row = s.execute(
                select(AccessKey, User, Organization)
                .join(User, User.id == AccessKey.user_id)
                .join(Organization, Organization.id == User.org_id)
                .where(AccessKey.id == key_id)
            ).first()
        if row is None:
            return None
        key, user, org = row
        fresh = _CachedKey(
            key_id=key.id,
            secret=self.box.open(key.secret_encrypted),
            enabled=key.enabled,
            expires_at=key.expires_at,
            user_disabled=user.disabled,
            fetched=fetched,
            last_used_written=cached.last_used_written if cached else 0.0,
            principal=Principal(
                user_id=user.id,
                user_name=user.name,
                org_id=org.id,
                org_name=org.name,
                key_id=key.id,
                role=user.role,
                platform_admin=user.platform_admin,
            ),
        )
        with self._cache_lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[key_id] = fresh
        return fresh

    def invalidate(self, key_id: str | None = None) -> None:
        """Forget cached keys (one, or all after a user or organisation changed)."""
        with self._cache_lock:
            if key_id is None:
                self._cache.clear()
            else:
                self._cache.pop(key_id, None)

    # -- job tokens -----------------------------------------------------------------------------------

    def _token_mac(self, payload: str) -> str:
        return hmac.new(self._token_key, payload.encode(), hashlib.sha256).hexdigest()[:40]

    def mint_job_token(self, job_id: str, attempt: int, ttl_seconds: float) -> str:
        """A bearer token for one attempt of one job: ``kjt.<job>.<attempt>.<expiry>.<mac>``."""
        payload = f"{job_id}.{attempt}.{int(time.time() + ttl_seconds)}"
        return f"kjt.{payload}.{self._token_mac(payload)}"

    def authenticate_job_token(self, token: str) -> Principal:
        """Valid while unexpired and while that attempt of the job is STARTING or RUNNING."""
        parts = token.split(".")
        if len(parts) != 5 or parts[0] != "kjt" or not parts[2].isascii() or not parts[3].isascii():
            raise AuthFailure("malformed", message="the job token is malformed (KILN_JOB_TOKEN)")
        job_id, attempt, expiry, mac = parts[1], parts[2], parts[3], parts[4]
        if not (attempt.isdigit() and expiry.isdigit()):
            raise AuthFailure("malformed", message="the job token is malformed (KILN_JOB_TOKEN)")
        if not hmac.compare_digest(self._token_mac(f"{job_id}.{attempt}.{expiry}"), mac):
            text = "the job token is not valid (KILN_JOB_TOKEN)"
            raise AuthFailure(
                "signature", f"job token for {job_id}: bad mac", key_id=f"job:{job_id}"[:64], message=text
            )
        if int(expiry) < time.time():
            text = "the job token has expired (KILN_JOB_TOKEN)"
            raise AuthFailure("stale", f"job token for {job_id}: expired", key_id=f"job:{job_id}"[:64], message=text)
        with self.db.read() as s:
            row = s.execute(
                select(Job, User, Organization)
                .join(User, User.id == Job.user_id)
                .join(Organization, Organization.id == Job.org_id)
                .where(Job.id == job_id)
            ).first()
        who: dict[str, Any] = {"key_id": f"job:{job_id}"[:64]}
        if row is None:
            text = "the job token is not valid (KILN_JOB_TOKEN)"
            raise AuthFailure("signature", f"job token for unknown job {job_id}", message=text, **who)
        job, user, org = row
        who.update(org_id=org.id, user_id=user.id)
        if job.attempt != int(attempt) or job.state not in (JobState.STARTING, JobState.RUNNING):
            text = f"the job token is no longer valid: the attempt of {job_id} it was made for has ended"
            raise AuthFailure("stale", f"job token for {job_id}: the attempt has ended", message=text, **who)
        return Principal(
            user_id=user.id,
            user_name=user.name,
            org_id=org.id,
            org_name=org.name,
            key_id=f"job:{job_id}",
            role="job",
            platform_admin=False,
            job_id=job_id,
        )

    def purge_nonces(self, s: Session) -> int:
        """Delete the nonces too old to be replayed, in ``s`` (the leased task ``purge-nonces``'s fenced
        transaction); how many went."""
        cutoff = utcnow() - timedelta(seconds=self.settings.nonce_ttl_seconds + self.settings.clock_skew_seconds)
        result = s.execute(delete(Nonce).where(Nonce.seen_at < cutoff))
        return int(getattr(result, "rowcount", 0) or 0)


def write_env_file(path: Path, creds: Credentials) -> None:
    write_config_file(path, creds.endpoint, creds.access_key, creds.secret_key)

"""The web console's session: the cookie's token and the CSRF token that goes with it (pure functions, no I/O).

A session token is ``v1.<key_id>.<expiry>.<mac>``: the access key the user signed in with, the Unix second it
stops being valid, and an HMAC-SHA256 of both under a key derived from the server key (``$KILN_HOME/server.key`` or
``KILN_SERVER_KEY``), so a token minted by a server with another key is worthless there. The server keeps no
session table: the token proves the sign-in, and every request re-reads the access key, so a session dies with its
key (disabled, deleted, expired) or its user (disabled) at once.

The CSRF token is an HMAC of the session token under a second derived key. The console reads it from the sign-in
answer (or ``GET /api/v1/session``) and sends it as ``X-Kiln-CSRF`` with every change; a page of another site can
neither read it nor compute it, and the cookie (``SameSite=Strict``) is not even sent with its requests.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from kiln.auth import failures, signing

COOKIE = "kiln_session"
CSRF_HEADER = "X-Kiln-CSRF"
VERSION = "v1"
MAX_TOKEN_CHARS = 200  # v1. + 20 + . + 12 + . + 64: a cookie longer than this is not one of ours
_EXPIRY = re.compile(r"[0-9]{1,12}")
_MAC = re.compile(r"[0-9a-f]{64}")

NOT_A_SESSION = "the console session cookie is not valid: sign in again"
OTHER_SERVER = "the console session was not made by this server (or its server key has changed): sign in again"
EXPIRED = "the console session has expired: sign in again"


class SessionInvalid(Exception):
    """Why a session token is refused: a ``kiln.auth.failures`` reason, a message for the user, and the access
    key id the token names (when it names one) for the audit trail."""

    def __init__(self, reason: str, message: str, key_id: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.key_id = key_id


class SessionKeys:
    """The two keys derived from the server key (never the server key itself, which encrypts the stored secrets),
    and what is computed with them."""

    def __init__(self, server_key: bytes) -> None:
        self._session_key = hashlib.sha256(b"kiln-console-session\x00" + server_key).digest()
        self._csrf_key = hashlib.sha256(b"kiln-console-csrf\x00" + server_key).digest()

    def _mac(self, payload: str) -> str:
        return hmac.new(self._session_key, payload.encode(), hashlib.sha256).hexdigest()

    def mint(self, key_id: str, expires_at: int) -> str:
        """A session token for ``key_id``, valid until the Unix second ``expires_at``."""
        if not signing.ACCESS_KEY_PATTERN.fullmatch(key_id):
            raise ValueError(f"key_id: not an access key id: {key_id!r}")
        if not 0 < expires_at < 10**12:
            raise ValueError(f"expires_at: not a Unix time: {expires_at}")
        payload = f"{VERSION}.{key_id}.{expires_at}"
        return f"{payload}.{self._mac(payload)}"

    def verify(self, token: str, now: float) -> tuple[str, int]:
        """The access key id and expiry of a token this server minted and that has not expired at ``now``;
        raises SessionInvalid otherwise."""
        parts = token.split(".") if len(token) <= MAX_TOKEN_CHARS else []
        if len(parts) != 4 or parts[0] != VERSION:
            raise SessionInvalid(failures.MALFORMED, NOT_A_SESSION)
        key_id, expiry, mac = parts[1], parts[2], parts[3]
        if not (signing.ACCESS_KEY_PATTERN.fullmatch(key_id) and _EXPIRY.fullmatch(expiry) and _MAC.fullmatch(mac)):
            raise SessionInvalid(failures.MALFORMED, NOT_A_SESSION)
        if not hmac.compare_digest(self._mac(f"{VERSION}.{key_id}.{expiry}"), mac):
            raise SessionInvalid(failures.SIGNATURE, OTHER_SERVER, key_id)
        if int(expiry) <= now:
            raise SessionInvalid(failures.STALE, EXPIRED, key_id)
        return key_id, int(expiry)

    def csrf(self, token: str) -> str:
        """The CSRF token of a session token."""
        return hmac.new(self._csrf_key, token.encode(), hashlib.sha256).hexdigest()

    def csrf_matches(self, token: str, csrf: str | None) -> bool:
        """Whether ``csrf`` (the X-Kiln-CSRF header; None when absent) is the session token's CSRF token."""
        return csrf is not None and hmac.compare_digest(self.csrf(token).encode(), csrf.encode("utf-8", "replace"))

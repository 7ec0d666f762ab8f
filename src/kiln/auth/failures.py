"""Why a request was not authenticated: the stable reasons of a ``401 unauthenticated`` answer
(``details.reason``) and the message the server sends with each.

Shared by the server, which answers with them, and the SDK, which turns them into advice about the caller's own
credentials (``kiln.sdk.credentials``). A message may name the access key id the request carried (it is public,
and the caller sent it) and, once the signature has proved that the caller holds the secret, the key's state
(disabled, expired); it never says anything about a secret.
"""

from __future__ import annotations

from datetime import UTC, datetime

MISSING_HEADERS = "missing_headers"
MALFORMED = "malformed"
STALE = "stale"
BODY_HASH = "body_hash"
UNKNOWN_KEY = "unknown_key"
SIGNATURE = "signature"
KEY_DISABLED = "key_disabled"
KEY_EXPIRED = "key_expired"
REPLAYED = "replayed"

REASONS = (MISSING_HEADERS, MALFORMED, STALE, BODY_HASH, UNKNOWN_KEY, SIGNATURE, KEY_DISABLED, KEY_EXPIRED, REPLAYED)

MESSAGES = {
    MISSING_HEADERS: "the request is not signed: it needs the headers Authorization, X-Kiln-Date, X-Kiln-Nonce and "
    "X-Kiln-Content-SHA256 (docs/signing.md)",
    MALFORMED: "the request's signature headers are malformed (docs/signing.md)",
    STALE: "the request is too old, or dated in the future",
    BODY_HASH: "the request's body does not match its X-Kiln-Content-SHA256 header: it changed after it was signed",
    SIGNATURE: "the signature does not match",
    REPLAYED: "the request's nonce (X-Kiln-Nonce) was already used with this access key: a replayed request",
}
NOT_AN_ACCESS_KEY = (
    "the Credential in the Authorization header is not an access key id (AK and 18 capital letters or digits)"
)
UNSIGNED_NOT_HERE = "UNSIGNED-PAYLOAD is accepted only on PUT /api/v1/blobs/{sha256}: sign the body's SHA-256"
NOT_A_BODY_HASH = "X-Kiln-Content-SHA256 is not a SHA-256 (64 lower-case hex digits)"


def iso(timestamp: float) -> str:
    """A Unix time as ``2026-01-31T12:00:00Z``; one outside the calendar's years (X-Kiln-Date has up to 12
    digits) as its number of seconds."""
    try:
        return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (ValueError, OverflowError, OSError):
        return f"{timestamp:.0f} s after 1970"


def unknown_key(key_id: str) -> str:
    return f"the access key id you provided does not exist: {key_id}"


def signature_mismatch(key_id: str) -> str:
    return f"the signature does not match: the secret key does not match access key {key_id}"


def key_disabled(key_id: str, *, user: bool) -> str:
    return f"the user of access key {key_id} is disabled" if user else f"access key {key_id} is disabled"


def key_expired(key_id: str, expired_at: datetime) -> str:
    return f"access key {key_id} expired at {iso(expired_at.timestamp())}"


def skew(request_time: int, server_time: int, max_skew: int) -> tuple[str, dict[str, int]]:
    """The message and details of a ``stale`` answer: how far the request's date is from the server's clock."""
    delta = request_time - server_time
    direction = "ahead of" if delta > 0 else "behind"
    message = (
        f"the request's date (X-Kiln-Date {request_time}, {iso(request_time)}) is {abs(delta)} s {direction} the "
        f"server's clock ({server_time}, {iso(server_time)}); at most {max_skew} s either way is accepted"
    )
    return message, {"server_time": server_time, "request_time": request_time, "max_skew_seconds": max_skew}

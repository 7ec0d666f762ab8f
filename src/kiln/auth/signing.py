"""KILN-HMAC-SHA256 request signing — the one definition both the SDK and the server use.

String to sign (lines joined by ``\\n``)::

    KILN-HMAC-SHA256
    <METHOD>
    <path exactly as sent>
    <canonical query>
    <X-Kiln-Date>
    <X-Kiln-Nonce>
    <X-Kiln-Content-SHA256>

See docs/signing.md for a worked example with curl and openssl.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Iterable
from urllib.parse import parse_qsl, quote

ALGORITHM = "KILN-HMAC-SHA256"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
HEADER_DATE = "X-Kiln-Date"
HEADER_NONCE = "X-Kiln-Nonce"
HEADER_CONTENT = "X-Kiln-Content-SHA256"
# Use with fullmatch(): "$" would also accept a trailing newline.
NONCE_PATTERN = re.compile(r"[A-Za-z0-9_-]{16,64}")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
DATE_PATTERN = re.compile(r"[0-9]{1,12}")
# Access key ids look like AK + 18 of [A-Z0-9]; anything else (a pasted secret, say) is malformed and is never
# logged or audited.
ACCESS_KEY_PATTERN = re.compile(r"AK[A-Z0-9]{18}")
_AUTH = re.compile(rf"{ALGORITHM}\s+Credential=(?P<key>[^,\s]+)\s*,\s*Signature=(?P<sig>[0-9a-f]{{64}})\s*")


def _encode(text: str) -> str:
    return quote(text, safe="-_.~")


def canonical_query(pairs: Iterable[tuple[str, str]]) -> str:
    """``name=value`` pairs, RFC 3986 percent-encoded, sorted by name then value, joined by ``&``."""
    encoded = sorted((_encode(k), _encode(v)) for k, v in pairs)
    return "&".join(f"{k}={v}" for k, v in encoded)


def canonical_query_from_raw(raw_query: str) -> str:
    return canonical_query(parse_qsl(raw_query, keep_blank_values=True))


def body_sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def string_to_sign(method: str, path: str, query: str, date: str, nonce: str, content_sha256: str) -> str:
    return "\n".join([ALGORITHM, method.upper(), path, query, date, nonce, content_sha256])


def signature(secret_key: str, text: str) -> str:
    return hmac.new(secret_key.encode("utf-8"), text.encode("utf-8"), hashlib.sha256).hexdigest()


def new_nonce() -> str:
    return secrets.token_urlsafe(24)


def sign_headers(
    *,
    access_key: str,
    secret_key: str,
    method: str,
    path: str,
    query: str,
    content_sha256: str,
    date: int | None = None,
    nonce: str | None = None,
) -> dict[str, str]:
    """The four headers that authenticate one request. ``query`` is already canonical."""
    date_s = str(int(time.time()) if date is None else date)
    nonce = nonce or new_nonce()
    sig = signature(secret_key, string_to_sign(method, path, query, date_s, nonce, content_sha256))
    return {
        HEADER_DATE: date_s,
        HEADER_NONCE: nonce,
        HEADER_CONTENT: content_sha256,
        "Authorization": f"{ALGORITHM} Credential={access_key}, Signature={sig}",
    }


def parse_authorization(value: str) -> tuple[str, str] | None:
    """(access key, signature) from an Authorization header, or None when malformed."""
    match = _AUTH.fullmatch(value or "")
    if not match:
        return None
    return match.group("key"), match.group("sig")


def signatures_equal(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())

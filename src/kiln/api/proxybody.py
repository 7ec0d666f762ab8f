"""The body of a request to a notebook (kiln.api.notebook_proxy), read only once its headers are authenticated:
a signed request's read whole and hashed (its hash is signed), a cookie-authenticated one's streamed on."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

from starlette.types import Receive

from kiln.auth import signing
from kiln.errors import BadRequest, PayloadTooLarge
from kiln.usecases.access.identity import AuthFailure, Principal


def content_length(headers: dict[str, str]) -> int | None:
    value = headers.get("content-length")
    if value is None:
        return None
    if not value.strip().isdigit():
        raise BadRequest(f"Content-Length is not a number of bytes: {value[:40]!r}")
    return int(value)


def has_body(headers: dict[str, str]) -> bool:
    """Whether the request says it carries a body (HTTP/1.1: a Content-Length over 0, or chunked)."""
    length = headers.get("content-length", "0").strip()
    return "transfer-encoding" in headers or (length != "0" and length != "")


async def read_signed(receive: Receive, signed_hash: str, principal: Principal, limit: int) -> bytes:
    """A signed request's body, hashed as it is read (at most ``limit`` bytes: the API's cap); AuthFailure
    (``body_hash``, the key's) when it is not what was signed, before any of it goes anywhere."""
    digest = hashlib.sha256()
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"a signed request to a notebook carries at most {limit} bytes")
        digest.update(chunk)
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    if not signing.signatures_equal(digest.hexdigest(), signed_hash):
        raise AuthFailure(
            "body_hash",
            f"key {principal.key_id}: body hash mismatch",
            key_id=principal.key_id[:64],
            org_id=principal.org_id,
            user_id=principal.user_id,
        )
    return b"".join(chunks)


class Upload:
    """A cookie-authenticated request's body, forwarded as it is received (never held whole), at most ``limit``
    bytes (PayloadTooLarge past it). ``started``: some of it was taken, so the request cannot be sent again."""

    def __init__(self, receive: Receive, limit: int, length: int | None) -> None:
        self.receive = receive
        self.limit = limit
        self.length = length  # the caller's Content-Length, forwarded; None: chunked
        self.started = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self.started = True
        size = 0
        while True:
            message = await self.receive()
            if message["type"] != "http.request":
                return  # the caller went: what is short of its Content-Length fails the forwarded request
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                raise PayloadTooLarge(f"a request to a notebook carries at most {self.limit} bytes")
            if chunk:
                yield chunk
            if not message.get("more_body", False):
                return

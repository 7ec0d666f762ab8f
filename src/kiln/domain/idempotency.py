"""The ``Idempotency-Key`` of a create: what a valid key is and what makes two requests "the same request".

Shared by the server (kiln.usecases.access.idempotency keeps the keys) and the SDK (which sends one with every create
and
retries with it): no I/O here.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid

from kiln.errors import InvalidInput

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"  # "true" on the answer to a repeat: the resource the first request created
MAX_KEY_LENGTH = 255
# Printable ASCII, 1 to 255 characters, spaces inside only: HTTP strips a header value's surrounding spaces, so a
# key cannot start or end with one. KEY_PATTERN is what the OpenAPI document says, for clients that check first.
KEY_PATTERN = rf"^[\x21-\x7e](?:[\x20-\x7e]{{0,{MAX_KEY_LENGTH - 2}}}[\x21-\x7e])?$"
_KEY = re.compile(KEY_PATTERN)


def new_key() -> str:
    """A fresh key for one logical create (the SDK's default: a random UUID)."""
    return str(uuid.uuid4())


def check_key(value: str) -> str:
    """``value`` when it is a valid key, else InvalidInput naming the header (a 422)."""
    if _KEY.fullmatch(value):
        return value
    if not value.strip():
        why = "is empty"
    elif len(value) > MAX_KEY_LENGTH:
        why = f"is {len(value)} characters long"
    elif value != value.strip(" "):
        why = "starts or ends with a space"
    else:
        why = "holds a character that is not printable ASCII"
    raise InvalidInput(
        f"{HEADER}: the key {why}; a key is 1 to {MAX_KEY_LENGTH} printable ASCII characters (a UUID, say)",
        details={"field": f"header.{HEADER}"},
    )


def canonical_body(body: bytes) -> bytes:
    """A JSON body with its keys sorted and no spaces, so that a client that writes the same document another way
    on its retry (key order, whitespace) sends the same request; any other body as it is."""
    try:
        document = json.loads(body)
    except ValueError:  # not JSON (or not UTF-8): the bytes themselves
        return body
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def fingerprint(method: str, path: str, body: bytes) -> str:
    """SHA-256 (hex) of what makes a request the same request: its method, its path and its body (canonical JSON).
    The query is left out: no create reads one."""
    digest = hashlib.sha256()
    for part in (method.upper().encode(), path.encode(), canonical_body(body)):
        digest.update(len(part).to_bytes(8, "big"))  # length-prefixed: no two splits hash alike
        digest.update(part)
    return digest.hexdigest()


def describe_span(seconds: float) -> str:
    """A retention as people write it: ``24 h``, ``90 min``, ``45 s``."""
    whole = int(seconds)
    if whole and whole % 3600 == 0:
        return f"{whole // 3600} h"
    if whole and whole % 60 == 0:
        return f"{whole // 60} min"
    return f"{seconds:g} s"

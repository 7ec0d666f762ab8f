"""Identifiers: short, lowercase, URL- and Kubernetes-name-safe, and sortable by creation time."""

from __future__ import annotations

import secrets
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lowercase


def _b32(n: int, width: int) -> str:
    out = []
    for _ in range(width):
        out.append(_ALPHABET[n & 31])
        n >>= 5
    return "".join(reversed(out))


def new_id(prefix: str) -> str:
    """``prefix-`` + 10 chars of millisecond time + 6 random chars (``job-01jd5y3c2k7q4m9x2a``)."""
    return f"{prefix}-{_b32(int(time.time() * 1000), 10)}{_b32(secrets.randbits(30), 6)}"

"""Identifiers: short, lowercase, URL- and Kubernetes-name-safe, and sortable by creation time."""

from __future__ import annotations

import secrets
import threading
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lowercase


def _b32(n: int, width: int) -> str:
    out = []
    for _ in range(width):
        out.append(_ALPHABET[n & 31])
        n >>= 5
    return "".join(reversed(out))


_RANDOM_BITS = 30
_lock = threading.Lock()
_last = (0, 0)  # (millisecond, random part) of this process's last id


def new_id(prefix: str) -> str:
    """``prefix-`` + 10 chars of millisecond time + 6 random chars (``job-01jd5y3c2k7q4m9x2a``).

    Within one millisecond a process never repeats itself: its next id takes the previous random part plus one
    (so ids also sort in the order they were made); other processes and servers rely on the 30 random bits."""
    global _last
    with _lock:
        millis = int(time.time() * 1000)
        last_millis, last_random = _last
        if millis <= last_millis and last_random + 1 < 1 << _RANDOM_BITS:
            millis, random = last_millis, last_random + 1  # same millisecond (or the clock stepped back)
        else:
            random = secrets.randbits(_RANDOM_BITS)
        _last = (millis, random)
    return f"{prefix}-{_b32(millis, 10)}{_b32(random, 6)}"

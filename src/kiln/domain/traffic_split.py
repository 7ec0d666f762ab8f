"""Which model version of a service answers a predict: the traffic split between a stable and a canary version.

A pure decision (no I/O), made by the API server for each predict from the service's row (so every server on the
database splits alike, and the split survives a restart):

- ``X-Kiln-Model-Version: N`` targets version N, stable, canary or shadow, whatever the canary's weight (0
  included): the router then picks among that version's replicas;
- otherwise a routing key (``X-Kiln-Routing-Key``) is hashed into one of ``BUCKETS`` buckets: a key always lands in
  the same bucket, so in the same version while the weight stays;
- otherwise each predict draws its bucket at random.

A bucket below ``weight`` percent of ``BUCKETS`` goes to the canary.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Literal

from kiln.errors import NotFound

BUCKETS = 10_000
VERSION_HEADER = "x-kiln-model-version"
ROUTING_KEY_HEADER = "x-kiln-routing-key"
Track = Literal["stable", "canary"]


@dataclass(frozen=True)
class Split:
    """A service's split as its row records it: the stable version, and the canary's (None: no canary)."""

    stable_version: int
    canary_version: int | None = None
    canary_weight: int = 0  # percent
    shadow_version: int | None = None  # sent a copy of the predicts (kiln.routing.shadow); answers only a target


def bucket(key: str) -> int:
    """The bucket of a routing key: the same on every server and after a restart (not Python's salted hash)."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


def choose(split: Split, version: str | None, routing_key: str | None, draw: random.Random | None = None) -> Track:
    """The track that answers a predict with these headers' values; NotFound for a targeted version the service
    does not serve (the message names those it does)."""
    if version is not None:
        served = {split.shadow_version: "shadow", split.stable_version: "stable", split.canary_version: "canary"}
        track = served.get(int(version)) if version.strip().isdigit() else None
        if track is None:
            versions = (split.stable_version, split.canary_version, split.shadow_version)
            names = ", ".join(str(v) for v in versions if v is not None)
            raise NotFound(
                f"X-Kiln-Model-Version: {version[:20]!r} is not served by this service (it serves {names})",
                details={"field": "X-Kiln-Model-Version"},
            )
        return "canary" if track == "canary" else "stable"
    if split.canary_version is None or split.canary_weight <= 0:
        return "stable"
    b = bucket(routing_key) if routing_key else (draw or random).randrange(BUCKETS)
    return "canary" if b < split.canary_weight * BUCKETS // 100 else "stable"

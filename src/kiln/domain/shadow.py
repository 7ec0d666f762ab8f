"""A shadow version's comparison with the version that answered the client (pure: no I/O).

Per predict copied to the shadow, each instance's output is compared with the answered one: equal as JSON (a label,
a list of scores rounded alike) counts as agreeing; where both are numbers, or lists of numbers of one shape, the
absolute differences of the numbers are summed (their mean: how far the shadow's numbers are off).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass
class ShadowStats:
    """What the copies of a service's predicts to its shadow version gave, since this server started."""

    copied: int = 0  # sent to the shadow
    dropped: int = 0  # not sent: the shadow's queue was full (a slow shadow), or it had no ready replica
    errors: int = 0  # the shadow failed (no answer, or not a 200)
    instances: int = 0  # outputs compared
    agreed: int = 0  # ... equal as JSON
    abs_diff: float = 0.0  # sum of |shadow - answered| over the numbers compared
    numbers: int = 0

    def copy(self) -> ShadowStats:
        return ShadowStats(**self.__dict__)

    @property
    def agreement_rate(self) -> float | None:
        return self.agreed / self.instances if self.instances else None

    @property
    def mean_abs_diff(self) -> float | None:
        return self.abs_diff / self.numbers if self.numbers else None


def _numbers(value: Any) -> list[float] | None:
    """The numbers of a number or a (nested) list of numbers, flattened; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return [float(value)]
    if isinstance(value, list):
        out: list[float] = []
        for item in value:
            inner = _numbers(item)
            if inner is None:
                return None
            out += inner
        return out
    return None


def _shape(value: Any) -> Any:
    return [_shape(x) for x in value] if isinstance(value, list) else None


def compare(answered: bytes, shadow: bytes, stats: ShadowStats) -> None:
    """Add one predict's comparison to ``stats``: both bodies are replicas' ``{"outputs": [...]}``."""
    try:
        mine, theirs = json.loads(answered).get("outputs"), json.loads(shadow).get("outputs")
    except (ValueError, AttributeError):
        stats.errors += 1
        return
    if not isinstance(mine, list) or not isinstance(theirs, list) or len(mine) != len(theirs):
        stats.errors += 1
        return
    for a, b in zip(mine, theirs, strict=True):
        stats.instances += 1
        stats.agreed += int(a == b and type(a) is type(b))
        xs, ys = _numbers(a), _numbers(b)
        if xs is not None and ys is not None and _shape(a) == _shape(b):
            stats.abs_diff += sum(abs(x - y) for x, y in zip(xs, ys, strict=True))
            stats.numbers += len(xs)

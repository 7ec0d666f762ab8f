"""Downsampling that keeps a series' shape: M4 (first, last, min and max point per bucket of the x range) and
LTTB (largest-triangle-three-buckets). Pure functions over ``(x, time, value)`` points; the database does the M4
part of long series itself (see kiln.usecases.tracking.metrics), these combine and finish what it returns.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

Point = tuple[float, float, float]  # (x, time, value): x is the step, or the time for a series without steps


def bucket_of(x: float, lo: float, span: float, buckets: int) -> int:
    """The bucket of ``x`` among ``buckets`` equal buckets of ``[lo, lo + span]`` (the last one closed)."""
    if span <= 0:
        return 0
    return min(buckets - 1, max(0, int((x - lo) * buckets / span)))


def m4(points: Iterable[Point], lo: float, hi: float, buckets: int) -> list[Point]:
    """Per bucket of [lo, hi] the first and last point (by x) and the lowest and highest (by value); sorted by x,
    without duplicates. Ties keep the earliest point."""
    span = hi - lo
    best: dict[int, list[Point]] = {}
    for p in points:
        b = bucket_of(p[0], lo, span, buckets)
        cur = best.get(b)
        if cur is None:
            best[b] = [p, p, p, p]
            continue
        first, last, low, high = cur
        if p[0] < first[0]:
            cur[0] = p
        if p[0] >= last[0]:
            cur[1] = p
        if p[2] < low[2]:
            cur[2] = p
        if p[2] > high[2]:
            cur[3] = p
    return sorted({p for four in best.values() for p in four})


def extremes(points: Sequence[Point]) -> tuple[Point, Point, Point, Point]:
    """(first, last, lowest, highest) of a non-empty sequence sorted by x."""
    low = min(points, key=lambda p: p[2])
    high = max(points, key=lambda p: p[2])
    return points[0], points[-1], low, high


def _area(a: Point, b: Point, cx: float, cy: float) -> float:
    area = abs((a[0] - cx) * (b[2] - a[2]) - (a[0] - b[0]) * (cy - a[2]))
    return area if math.isfinite(area) else math.inf


def lttb(points: Sequence[Point], threshold: int) -> list[Point]:
    """Largest-triangle-three-buckets over points sorted by x: ``threshold`` points (or all when fewer), the
    first and the last always among them."""
    n = len(points)
    if threshold >= n or threshold <= 0:
        return list(points)
    if threshold == 1:
        return [points[0]]
    if threshold == 2:
        return [points[0], points[-1]]
    sampled = [points[0]]
    every = (n - 2) / (threshold - 2)
    a = 0
    for i in range(threshold - 2):
        start = int(i * every) + 1
        end = int((i + 1) * every) + 1
        nxt_start, nxt_end = end, min(int((i + 2) * every) + 1, n)
        if nxt_start >= nxt_end:  # the last bucket: the next "average" is the last point
            cx, cy = points[-1][0], points[-1][2]
        else:
            size = nxt_end - nxt_start
            cx = sum(p[0] for p in points[nxt_start:nxt_end]) / size
            cy = sum(p[2] for p in points[nxt_start:nxt_end]) / size
        anchor = points[a]
        best, best_area = start, -1.0
        for j in range(start, min(end, n - 1)):
            area = _area(anchor, points[j], cx, cy)
            if area > best_area:
                best, best_area = j, area
        sampled.append(points[best])
        a = best
    sampled.append(points[-1])
    return sampled


def shape_preserving(points: Sequence[Point], threshold: int) -> list[Point]:
    """At most ``threshold`` points (threshold ≥ 4) that always include the first, the last, the lowest and the
    highest: LTTB down to ``threshold - 2``, then the extremes added back if LTTB left them out."""
    if len(points) <= threshold:
        return list(points)
    threshold = max(threshold, 4)
    first, last, low, high = extremes(points)
    chosen = set(lttb(points, threshold - 2))
    chosen.update((first, last, low, high))
    return sorted(chosen)

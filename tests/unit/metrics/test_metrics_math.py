"""The spool-line parser and the downsampling math (M4, LTTB, shape preservation)."""

from __future__ import annotations

import json
import math
import random

from kiln.metrics.downsample import extremes, lttb, m4, shape_preserving
from kiln.tasks.metrics_ingest import complete_lines, parse_lines


def test_points_events_text_and_nonfinite_values() -> None:
    lines = [
        {"t": 1.5, "s": 3, "w": "worker1", "m": {"loss": 0.5, "acc": 1, "phase": "train", "bad": "NaN"}, "src": "sdk"},
        {"t": 2.0, "s": None, "m": {"gpu": float("inf")}, "src": "sys"},
        {"t": 3.0, "event": "Checkpoint", "message": "saved", "w": "worker0"},
    ]
    parsed = parse_lines("\n".join(json.dumps(x) for x in lines) + "\n")
    assert parsed.errors == 0
    assert ("worker1", "loss", "sdk", 3, 1.5, 0.5, None) in parsed.points
    assert ("worker1", "acc", "sdk", 3, 1.5, 1.0, None) in parsed.points
    assert ("worker1", "phase", "sdk", 3, 1.5, None, "train") in parsed.points
    assert ("worker1", "bad", "sdk", 3, 1.5, None, "nan") in parsed.points
    assert ("worker0", "gpu", "sys", None, 2.0, None, "inf") in parsed.points
    assert parsed.events == [("worker0", "Checkpoint", "saved")]


def test_malformed_lines_are_counted_never_raised() -> None:
    data = "\n".join(
        [
            "not json",
            "[1, 2]",
            json.dumps({"t": "yesterday", "m": {"x": 1}}),
            json.dumps({"t": 1, "s": 1.5, "m": {"x": 1}}),
            json.dumps({"t": 1, "m": {"": 1, "y" * 201: 2, "ok": 3, "list": [1]}}),
            "",
        ]
    )
    parsed = parse_lines(data)
    assert parsed.errors == 7
    assert [p[1] for p in parsed.points] == ["ok"]
    assert parsed.first_error == "not JSON"


def test_only_complete_lines_are_consumed() -> None:
    assert complete_lines(b'{"t": 1}\n{"t": 2') == 9
    assert complete_lines(b'{"t": 1') == 0
    assert complete_lines(b"") == 0


def _series(n: int, seed: int = 1) -> list[tuple[float, float, float]]:
    rnd = random.Random(seed)
    return [(float(i), 1000.0 + i, math.sin(i / 50) + rnd.random() * 0.1) for i in range(n)]


def test_m4_keeps_per_bucket_first_last_min_max() -> None:
    points = _series(10_000)
    out = m4(points, 0, 9_999, 100)
    assert len(out) <= 400
    assert set(extremes(points)) <= set(out)
    for b in range(100):  # every bucket's extremes are there
        bucket = [p for p in points if min(99, int(p[0] * 100 / 9_999)) == b]
        assert set(extremes(bucket)) <= set(out)


def test_lttb_keeps_endpoints_and_count() -> None:
    points = _series(5_000)
    out = lttb(points, 300)
    assert len(out) == 300
    assert out[0] == points[0] and out[-1] == points[-1]
    assert [p[0] for p in out] == sorted(p[0] for p in out)
    assert lttb(points[:10], 300) == points[:10]


def test_shape_preserving_keeps_spikes_and_extremes() -> None:
    points = _series(100_000)
    points[54_321] = (54_321.0, 0.0, 50.0)  # a single spike
    points[77_777] = (77_777.0, 0.0, -50.0)
    out = shape_preserving(m4(points, 0, 99_999, 1000), 1000)
    assert len(out) <= 1000
    first, last, low, high = extremes(points)
    assert {first, last, low, high} <= set(out)
    assert high[2] == 50.0 and low[2] == -50.0


def test_parser_fast_path_gives_json_loads_verdicts() -> None:
    """Lines the scanner alone cannot take (whitespace around them, trailing data, a BOM, deep nesting, integers
    beyond a double) get the same verdict as json.loads would give, and never raise."""
    good = json.dumps({"t": 1, "s": 2, "m": {"a": 1}})
    data = "\n".join(
        [
            "  " + good + " \r",  # whitespace around a good line: still a point
            good + good,  # trailing data: not JSON
            "\ufeff" + good,  # a BOM: not JSON
            "[" * 100_000 + "]" * 100_000,  # nesting past the recursion limit: not JSON
            '{"t": 1, "m": {"big": ' + "9" * 400 + ', "small": -' + "9" * 400 + "}}",  # beyond a double: ±inf
            '{"t": ' + "9" * 400 + ', "m": {"x": 1}}',  # a time beyond a double: not a finite time
            "   ",
            "",
        ]
    )
    parsed = parse_lines(data)
    assert parsed.errors == 4 and parsed.first_error == "not JSON"
    assert [p[1:] for p in parsed.points] == [
        ("a", "sdk", 2, 1.0, 1.0, None),
        ("big", "sdk", None, 1.0, None, "inf"),
        ("small", "sdk", None, 1.0, None, "-inf"),
    ]

"""`kiln metrics`: the table a person reads shows sizes in binary units and numbers without exponents."""

from __future__ import annotations

import io

from rich.console import Console

from kiln.cli.metrics import metrics_table
from kiln.domain.schemas import MetricSeriesSummary


def _rows(summaries: list[MetricSeriesSummary]) -> dict[str, list[str]]:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(metrics_table(summaries, {}))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    rows = {}
    for line in text.splitlines()[2:]:
        cells = [c for c in line.split("  ") if c.strip()]
        if cells:
            rows[cells[0].strip()] = [c.strip() for c in cells[1:]]
    return rows


def _series(name: str, last: float, low: float, high: float, step: int | None = None) -> MetricSeriesSummary:
    return MetricSeriesSummary(
        name=name,
        worker="worker0",
        kind="scalar",
        source="sys",
        count=3,
        last_value=last,
        min=low,
        max=high,
        last_step=step,
    )


def test_byte_metrics_are_shown_in_binary_units() -> None:
    rows = _rows(
        [
            _series("system/rss_bytes", 99_717_100.0, 52_428_800.0, 251_117_568.0),
            _series("system/gpu0/memory_bytes", 2 * 1024**3, 0.0, 2 * 1024**3),
            _series("bytes", 1536.0, 512.0, 1536.0),
        ]
    )
    assert rows["system/rss_bytes"] == ["95.1 MiB", "-", "3", "50 MiB", "239.5 MiB"]
    assert rows["system/gpu0/memory_bytes"] == ["2 GiB", "-", "3", "0 B", "2 GiB"]
    assert rows["bytes"] == ["1.5 KiB", "-", "3", "512 B", "1.5 KiB"]


def test_other_numbers_have_no_exponent_for_everyday_magnitudes() -> None:
    rows = _rows(
        [
            _series("loss", 0.0123, 0.0123, 2.5, step=1_500_000),
            _series("tokens", 1_234_567.0, 12_345.67, 123_456_789.0),
            _series("lr", 0.00003, 0.00001, 0.0001),
        ]
    )
    assert rows["loss"] == ["0.0123", "1500000", "3", "0.0123", "2.5"]
    assert rows["tokens"] == ["1234567", "-", "3", "12345.7", "123456789"]
    assert rows["lr"] == ["3e-05", "-", "3", "1e-05", "0.0001"]  # tiny: the exponent is what people read

"""``kiln metrics JOB``: the latest value of each metric with its count, min, max and a sparkline of its trend;
``--follow`` refreshes until the job ends (on a terminal; into a pipe or a file it prints a line per new point);
``--output json|csv`` prints the data."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.live import Live
from rich.table import Table
from rich.text import Text

from kiln.cli.common import EXIT_INTERRUPTED, connect, emit_json, info, out
from kiln.domain.quantities import format_bytes, format_number
from kiln.domain.states import JobState

if TYPE_CHECKING:
    from kiln.domain.schemas import MetricSeriesData, MetricSeriesSummary
    from kiln.sdk.client import Client

SPARKS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 24


class MetricsOutput(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


def sparkline(values: list[float], width: int = SPARK_WIDTH, bounds: tuple[float, float] | None = None) -> str:
    """A compact unicode trend of ``values`` (averaged into ``width`` cells), on the scale ``bounds`` (low, high)
    when given (several runs' lines drawn comparable), else on their own."""
    values = [v for v in values if isinstance(v, int | float) and v == v and abs(v) != float("inf")]
    if not values:
        return ""
    if len(values) > width:
        cells = []
        for i in range(width):
            part = values[i * len(values) // width : (i + 1) * len(values) // width] or [values[-1]]
            cells.append(sum(part) / len(part))
        values = cells
    low, high = bounds if bounds is not None else (min(values), max(values))
    values = [min(high, max(low, v)) for v in values]
    if high == low:
        return SPARKS[3] * len(values)
    return "".join(SPARKS[min(7, int((v - low) / (high - low) * 8))] for v in values)


def is_bytes(name: str) -> bool:
    """A metric counted in bytes, shown as KiB/MiB/GiB: ``system/rss_bytes``, ``gpu0/memory_bytes``, ``bytes``."""
    return name.lower().endswith("bytes")


def _num(value: Any, name: str = "") -> str:
    """A value for the table: sizes of ``*_bytes`` metrics in binary units, other numbers without an exponent
    for everyday magnitudes (``--output json|csv`` keep the raw numbers)."""
    if value is None:
        return "-"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return format_bytes(value) if is_bytes(name) else format_number(value)
    return str(value)


def metrics_table(summary: list[MetricSeriesSummary], trends: dict[tuple[str, str], str]) -> Table:
    multi = len({s.worker for s in summary}) > 1
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for column in ["NAME", *(["WORKER"] if multi else []), "LAST", "STEP", "COUNT", "MIN", "MAX", "TREND"]:
        table.add_column(
            column, overflow="fold", justify="right" if column in ("LAST", "COUNT", "MIN", "MAX") else "left"
        )
    for s in summary:
        row = [Text(s.name), *([Text(s.worker)] if multi else [])]
        row += [
            Text(_num(s.last_value, s.name)),
            Text(_num(s.last_step)),
            Text(str(s.count)),
            Text(_num(s.min, s.name)),
            Text(_num(s.max, s.name)),
            Text(trends.get((s.name, s.worker), ""), style="cyan"),
        ]
        table.add_row(*row)
    return table


def _snapshot(client: Client, job_id: str, names: list[str] | None) -> Table | Text:
    summary = client.metrics_summary(job_id)
    if names:
        summary = [s for s in summary if s.name in names]
    if not summary:
        return Text(f"job {job_id} has no metrics yet", style="dim")
    scalar = sorted({s.name for s in summary if s.kind == "scalar"})
    trends: dict[tuple[str, str], str] = {}
    if scalar:
        for series in client.metrics(job_id, names=scalar, downsample=SPARK_WIDTH * 4):
            trends[(series.name, series.worker)] = sparkline([p[2] for p in series.points])  # type: ignore[misc]
    return metrics_table(summary, trends)


def _data(series: list[MetricSeriesData]) -> list[dict[str, Any]]:
    return [s.model_dump(mode="json") for s in series]


def point_line(name: str, worker: str, step: int | None, at: float | None, value: Any) -> str:
    """One point as ``--follow`` prints it into a pipe: ``NAME=VALUE step=STEP worker=WORKER time=ISO``, the value
    as JSON (a number, or a quoted string for text metrics and non-finite numbers); ``step=-`` for a series whose
    axis is time."""
    when = datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds") if at is not None else "-"
    return f"{name}={json.dumps(value)} step={'-' if step is None else step} worker={worker} time={when}"


class PointFollower:
    """The points that arrived since the last poll, series by series: a step series is read from the last step
    printed on, a time series (the system samples) gives its latest point each time it grows. The first poll gives
    each series' latest point only (the history is what ``--output csv`` is for)."""

    def __init__(self, client: Client, job_id: str, names: list[str] | None) -> None:
        self.client, self.job_id, self.names = client, job_id, names
        self.seen: dict[tuple[str, str], tuple[int, int | None, float | None]] = {}  # count, last step, last time
        self.started = False

    def poll(self) -> list[str]:
        lines: list[str] = []
        summary = self.client.metrics_summary(self.job_id)
        for s in summary:
            if self.names and s.name not in self.names:
                continue
            key = (s.name, s.worker)
            before = self.seen.get(key)
            if before is not None and before[0] == s.count:
                continue
            self.seen[key] = (s.count, s.last_step, s.last_time)
            if not self.started or s.last_step is None:  # the latest point: all there is of a time series
                if s.count:
                    lines.append(point_line(s.name, s.worker, s.last_step, s.last_time, s.last_value))
                continue
            after = (before[1], before[2]) if before is not None and before[1] is not None else None
            for series in self.client.metrics(
                self.job_id, names=[s.name], worker=s.worker, step_min=None if after is None else after[0]
            ):
                for step, at, value in series.points:
                    if after is None or (step, at) > after:  # type: ignore[operator]
                        lines.append(point_line(s.name, s.worker, step, at, value))  # type: ignore[arg-type]
        self.started = True
        return lines


def _follow_lines(client: Client, job_id: str, names: list[str] | None, interval: float = 2.0) -> None:
    follower = PointFollower(client, job_id, names)
    while True:
        ended = JobState(client.get_job(job_id).state).terminal
        lines = follower.poll()
        if lines:
            sys.stdout.write("".join(f"{line}\n" for line in lines))
            sys.stdout.flush()
        if ended:
            return
        time.sleep(interval)


def metrics(
    job_id: Annotated[str, typer.Argument(help="The job id.")],
    names: Annotated[str | None, typer.Option("--names", "-n", help="Comma-separated metric names.")] = None,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Refresh until the job ends; into a pipe or file, a line per new point (NAME=VALUE step=… worker=… "
            "time=…).",
        ),
    ] = False,
    output: Annotated[
        MetricsOutput, typer.Option("--output", "-o", case_sensitive=False, help="table, json or csv.")
    ] = MetricsOutput.table,
    downsample: Annotated[
        int | None, typer.Option("--downsample", help="json/csv: at most this many points per series.")
    ] = None,
) -> None:
    """Show a job's metrics: the latest value of each, with count, min, max and trend."""
    wanted = [n.strip() for n in (names or "").split(",") if n.strip()] or None
    with connect() as client:
        if output is MetricsOutput.json:
            emit_json(_data(client.metrics(job_id, names=wanted, downsample=downsample)))
            return
        if output is MetricsOutput.csv:
            sys.stdout.write(client.export_metrics_csv(job_id, names=wanted, downsample=downsample))
            sys.stdout.flush()
            return
        if not follow:
            out.print(_snapshot(client, job_id, wanted))
            return
        try:
            if not out.is_terminal:  # a live table draws only on a terminal: a pipe gets lines it can read
                _follow_lines(client, job_id, wanted)
                return
            with Live(_snapshot(client, job_id, wanted), console=out, refresh_per_second=2) as live:
                while True:
                    ended = JobState(client.get_job(job_id).state).terminal
                    live.update(_snapshot(client, job_id, wanted))
                    if ended:
                        break
                    time.sleep(2.0)
        except KeyboardInterrupt:
            info(f"\nstopped following; job {job_id} keeps running")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except BrokenPipeError:  # `kiln metrics JOB -f | head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
            raise typer.Exit(0) from None

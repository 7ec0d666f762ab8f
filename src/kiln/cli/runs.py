"""``kiln runs``: the runs table (every job is a run; runs logged with MLflow's client from anywhere are runs too),
filtered and sorted by the server, and runs compared side by side."""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from kiln.cli.common import EXIT_USAGE, Output, OutputFormat, connect, emit_json, fail, info, out
from kiln.cli.metrics import sparkline
from kiln.sdk.tracking import TrackedRun

app = typer.Typer(help="Runs: every job, and runs logged with MLflow's client; filter, sort, compare.")
DEFAULT_COLUMNS = ("name", "status", "user")
PLOT_POINTS = 500  # per run and metric of --plot, downsampled by the server keeping the shape


def _numbers(points: list[list[Any]]) -> list[float]:
    """The values of ``[step, time, value]`` points that are numbers (a text metric's are not)."""
    return [float(p[2]) for p in points if isinstance(p[2], int | float) and not isinstance(p[2], bool)]


def _sort_clause(text: str) -> str:
    """``-metrics.acc`` (descending), ``metrics.acc`` or MLflow's ``metrics.acc DESC``, as the server takes it."""
    text = text.strip()
    return f"{text[1:].strip()} DESC" if text.startswith("-") else text


def _format(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else str(value)
    return str(value)


def _columns(runs: list[TrackedRun], asked: str | None) -> list[str]:
    if asked:
        return [c.strip() for c in asked.split(",") if c.strip()]
    params = sorted({k for r in runs for k in r.params})[:4]
    metrics = sorted({k for r in runs for k in r.metrics if "/" not in k})[:4]
    return [*DEFAULT_COLUMNS, *(f"params.{k}" for k in params), *(f"metrics.{k}" for k in metrics)]


@app.command("list")
def list_runs(
    experiment: Annotated[str | None, typer.Option("--experiment", "-e", help="Its name (default: Default).")] = None,
    filter_text: Annotated[
        str | None,
        typer.Option(
            "--filter",
            "-f",
            help='MLflow\'s filter syntax, e.g. "params.lr < 0.1 and metrics.val_acc > 0.9" (params compare as '
            "numbers when given a number; metrics by their last value).",
        ),
    ] = None,
    sort: Annotated[
        list[str] | None,
        typer.Option("--sort", "-s", help="A column, -COLUMN for descending (repeatable), e.g. -metrics.val_acc."),
    ] = None,
    columns: Annotated[
        str | None,
        typer.Option("--columns", "-c", help="Comma-separated: params.X, metrics.X, tags.X, name, status, user…"),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=50000, help="Most runs to show.")] = 100,
    output: Output = OutputFormat.table,
) -> None:
    """The runs of an experiment, newest first unless --sort; filtering and sorting done by the server."""
    with connect() as client:
        runs = client.search_runs(
            experiment, filter=filter_text, order_by=[_sort_clause(s) for s in sort or []], max_results=limit
        )
    if output is OutputFormat.json:
        emit_json([dataclasses.asdict(r) for r in runs])
        return
    if not runs:
        info("no runs")
        return
    chosen = _columns(runs, columns)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("RUN", overflow="fold")
    for column in chosen:
        table.add_column(column.upper() if "." not in column else column, overflow="fold")
    for run in runs:
        table.add_row(run.id, *(Text(_format(run.value(c))) for c in chosen))
    out.print(table)


@app.command()
def compare(
    runs: Annotated[list[str], typer.Argument(help="Run ids (a job's run is its job id).")],
    plot: Annotated[
        list[str] | None, typer.Option("--plot", help="A metric to draw per run as a sparkline (repeatable).")
    ] = None,
    all_params: Annotated[bool, typer.Option("--all", help="Every param, not only those that differ.")] = False,
    output: Output = OutputFormat.table,
) -> None:
    """Runs side by side: the params that differ (all with --all), each run's final metrics, and --plot
    METRIC's history as a sparkline per run (downsampled by the server to 500 points a run)."""
    if len(runs) < 2:
        fail("name at least two runs to compare", EXIT_USAGE)
    with connect() as client:
        found = [client.get_run(r) for r in runs]
        # One request for every run and metric, each series downsampled by the server (a sparkline is 24 cells:
        # a million-point history is not worth sending); a run's several workers' series one after the other.
        series = client.compare_run_metrics([r.id for r in found], plot, downsample=PLOT_POINTS) if plot else {}
        histories = {
            (run.id, metric): [v for s in series.get(run.id, []) if s.name == metric for v in _numbers(s.points)]
            for metric in plot or []
            for run in found
        }
    keys = sorted({k for r in found for k in r.params})
    differing = [k for k in keys if all_params or len({r.params.get(k) for r in found}) > 1]
    metrics = sorted({k for r in found for k in r.metrics})
    if output is OutputFormat.json:
        emit_json(
            {
                "runs": [dataclasses.asdict(r) for r in found],
                "params_differ": differing,
                "plots": {f"{run}/{metric}": values for (run, metric), values in histories.items()},
            }
        )
        return
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("", overflow="fold")
    for run in found:
        table.add_column(f"{run.name}\n{run.id}", overflow="fold")
    table.add_row("status", *(r.status for r in found))
    for key in differing:
        table.add_row(f"params.{key}", *(_format(r.params.get(key)) for r in found))
    for key in metrics:
        table.add_row(f"metrics.{key}", *(_format(r.metrics.get(key)) for r in found))
    for metric in plot or []:  # one scale for every run's line: they compare as if overlaid
        finite = [v for r in found for v in histories[(r.id, metric)] if math.isfinite(v)]
        bounds = (min(finite), max(finite)) if finite else None
        table.add_row(f"{metric} ↗", *(sparkline(histories[(r.id, metric)], bounds=bounds) or "-" for r in found))
    out.print(table)
    if not differing and not all_params:
        info("their params are the same (--all lists them)")

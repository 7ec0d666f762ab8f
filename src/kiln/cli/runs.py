"""``kiln runs``: the runs table (every job is a run; runs logged with MLflow's client from anywhere are runs too),
filtered and sorted by the server, and runs compared side by side. What the table shows by default, its states'
names and its numbers' rounding are kiln.domain.run_table's, as on the console's Runs page; it fits the terminal
(the columns that do not fit are named, with how to ask for them), and ``-o json`` is the runs as the server sent
them, unrounded."""

from __future__ import annotations

import dataclasses
import math
from itertools import zip_longest
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from kiln.cli.common import EXIT_USAGE, Output, OutputFormat, connect, emit_json, fail, info, out
from kiln.cli.metrics import sparkline
from kiln.domain.run_table import default_columns, format_value
from kiln.sdk.tracking import TrackedRun

app = typer.Typer(help="Runs: every job, and runs logged with MLflow's client; filter, sort, compare.")
PLOT_POINTS = 500  # per run and metric of --plot, downsampled by the server keeping the shape


def _numbers(points: list[list[Any]]) -> list[float]:
    """The values of ``[step, time, value]`` points that are numbers (a text metric's are not)."""
    return [float(p[2]) for p in points if isinstance(p[2], int | float) and not isinstance(p[2], bool)]


def _sort_clause(text: str) -> str:
    """``-metrics.acc`` (descending), ``metrics.acc`` or MLflow's ``metrics.acc DESC``, as the server takes it."""
    text = text.strip()
    return f"{text[1:].strip()} DESC" if text.startswith("-") else text


# A column's widest cell: a long param (a path, a URL) is cut with an ellipsis; -o json has it whole.
NAME_WIDTH = 28
VALUE_WIDTH = 24
STATE_STYLES = {
    "SUCCEEDED": "green",
    "FAILED": "red",
    "CANCELLED": "magenta",
    "PRUNED": "yellow",
    "RUNNING": "cyan",
    "STARTING": "cyan",
    "RESTARTING": "yellow",
}


def _columns(runs: list[TrackedRun]) -> list[str]:
    """The default columns, most telling first (kiln.domain.run_table.default_columns after name and state); the
    name only where some run has one besides its id, the user last and only where the runs are not all one
    person's."""
    names = ["name"] if any(r.name != r.id for r in runs) else []
    users = ["user"] if len({r.user for r in runs}) > 1 else []
    return [*names, "state", *default_columns(runs), *users]


def _cell(run: TrackedRun, column: str) -> Text:
    if column in ("state", "status"):
        state = run.state
        return Text(state, style=STATE_STYLES.get(state, ""))
    return Text(format_value(run.value(column)))


def _header(column: str) -> str:
    return column.upper() if "." not in column else column


def _limit(column: str) -> int:
    return NAME_WIDTH if column == "name" else VALUE_WIDTH


def _table(runs: list[TrackedRun], columns: list[str]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("RUN", no_wrap=True)  # an id is copied whole: never wrapped, never cut
    for column in columns:
        table.add_column(_header(column), no_wrap=True, overflow="ellipsis", max_width=_limit(column))
    for run in runs:
        table.add_row(run.id, *(_cell(run, c) for c in columns))
    return table


GAP = 3  # between two columns of the table: a space each side of the box's blank separator


def _fitting(runs: list[TrackedRun], wanted: list[str], width: int) -> tuple[list[str], list[str]]:
    """The columns of ``wanted`` that fit ``width`` beside the run id, in the order wanted, and those left out:
    each given room in ``_priority``'s order while the table still fits, as kubectl's and gh's tables do, rather
    than every column squeezed until nothing is readable."""

    def needs(column: str) -> int:
        widest = max(_cell(r, column).cell_len for r in runs)
        return max(len(_header(column)), min(_limit(column), widest))

    used = max(len(r.id) for r in runs)
    kept: set[str] = set()
    for column in _priority(wanted):
        more = GAP + needs(column)
        if used + more <= width:
            kept.add(column)
            used += more
    return [c for c in wanted if c in kept], [c for c in wanted if c not in kept]


def _priority(wanted: list[str]) -> list[str]:
    """The order columns are given room in: name and state, then a metric and a param in turn (the objective, the
    first metric, comes first), the user last — a narrow terminal shows some of both rather than params only."""
    metrics = [c for c in wanted if c.startswith("metrics.")]
    params = [c for c in wanted if c.startswith("params.")]
    turns = [c for pair in zip_longest(metrics, params) for c in pair if c is not None]
    rest = [c for c in wanted if c not in turns]
    return [*(c for c in rest if c != "user"), *turns, *(c for c in rest if c == "user")]


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
        typer.Option(
            "--columns",
            "-c",
            help="Comma-separated: params.X, metrics.X, tags.X, name, state, user… (default: a study's objective, "
            "the params that differ between the runs, the metrics most runs report; as many as the terminal fits)",
        ),
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
    left: list[str] = []
    if columns:
        shown = [c.strip() for c in columns.split(",") if c.strip()]
    else:
        shown, left = _fitting(runs, _columns(runs), out.width)
    out.print(_table(runs, shown))
    if left:
        info(
            f"{len(left)} more column(s) left out to fit {out.width} columns: {', '.join(left)} "
            f"(choose with --columns, e.g. --columns {','.join(['name', 'state', *left][:4])}; -o json has all)"
        )


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
    table.add_row("state", *(_cell(r, "state") for r in found))
    for key in differing:
        table.add_row(f"params.{key}", *(format_value(r.params.get(key)) for r in found))
    for key in metrics:
        table.add_row(f"metrics.{key}", *(format_value(r.metrics.get(key)) for r in found))
    for metric in plot or []:  # one scale for every run's line: they compare as if overlaid
        finite = [v for r in found for v in histories[(r.id, metric)] if math.isfinite(v)]
        bounds = (min(finite), max(finite)) if finite else None
        table.add_row(f"{metric} ↗", *(sparkline(histories[(r.id, metric)], bounds=bounds) or "-" for r in found))
    out.print(table)
    if not differing and not all_params:
        info("their params are the same (--all lists them)")

"""``kiln experiments``: the organisation's experiments with their run counts, one shown, renamed or deleted.
Runs land in an experiment by ``kiln run --experiment NAME`` (Default otherwise), a study's trials in the study's,
a pipeline's steps in the pipeline's, service replicas in Services and notebooks in Notebooks; ``kiln runs list -e
NAME`` lists one's runs."""

from __future__ import annotations

import shlex
import sys
from datetime import datetime
from typing import Annotated

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from kiln.cli.common import EXIT_USAGE, Output, OutputFormat, connect, emit_json, emit_list, fail, info, out
from kiln.cli.output import fmt_time
from kiln.domain.schemas import ExperimentRead

app = typer.Typer(help="Experiments: where runs are kept; list, show, rename, delete.")
NameArg = Annotated[str, typer.Argument(help="The experiment's name.")]


def _minute(at: datetime | None) -> str:
    return "-" if at is None else fmt_time(at)[:16]  # to the minute: the table fits 80 columns


def _table(experiments: list[ExperimentRead]) -> None:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("NAME", overflow="fold")
    table.add_column("RUNS", justify="right", no_wrap=True)
    table.add_column("LAST RUN", no_wrap=True)
    table.add_column("ID", no_wrap=True)
    for e in experiments:
        table.add_row(Text(e.name), str(e.run_count), _minute(e.last_run_at), e.id)
    out.print(table)


@app.command("list")
def list_experiments(
    deleted: Annotated[bool, typer.Option("--deleted", help="The deleted experiments instead.")] = False,
    output: Output = OutputFormat.table,
) -> None:
    """The organisation's experiments, oldest first, with how many runs each holds."""
    with connect() as client:
        experiments = client.experiments(deleted=deleted)
    emit_list(experiments, output, _table, "no deleted experiments" if deleted else "no experiments")


@app.command()
def show(name: NameArg, output: Output = OutputFormat.table) -> None:
    """One experiment: its id, runs, when its newest run started, its tags."""
    with connect() as client:
        experiment = client.get_experiment(name)
    if output is OutputFormat.json:
        emit_json(experiment.model_dump(mode="json"))
        return
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    rows = [
        ("name", experiment.name),
        ("id", experiment.id),
        ("state", experiment.lifecycle_stage),
        ("runs", f"{experiment.run_count} (kiln runs list -e {shlex.quote(experiment.name)})"),
        ("last run", fmt_time(experiment.last_run_at)),
        ("created", fmt_time(experiment.created_at)),
        *((f"tag {k}", v) for k, v in sorted(experiment.tags.items())),
    ]
    for key, value in rows:
        grid.add_row(key, Text(value))
    out.print(grid)


@app.command()
def rename(name: NameArg, new_name: Annotated[str, typer.Argument(help="Its new name.")]) -> None:
    """Rename an experiment; its runs stay in it (runs started later with --experiment OLD make a new one)."""
    with connect() as client:
        client.rename_experiment(name, new_name)
    info(f"renamed experiment {name} to {new_name}")


@app.command()
def delete(
    name: NameArg,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Delete an experiment: it and its runs leave the lists (kept, and restorable with MLflow's client's
    restore_experiment); Default cannot be deleted."""
    if not yes:
        if not sys.stdin.isatty():
            fail(f"deleting experiment {name} hides it and its runs; pass --yes to confirm", EXIT_USAGE)
        typer.confirm(f"Delete experiment {name} (its runs leave the lists)?", abort=True)
    with connect() as client:
        client.delete_experiment(name)
    info(f"deleted experiment {name}")

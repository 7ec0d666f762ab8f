"""``kiln pipelines``: run a pipeline file, follow, show, list, resume and cancel its runs."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich import box
from rich.table import Table
from rich.text import Text

from kiln.cli.common import Output, OutputFormat, connect, emit_json, emit_list, info, out
from kiln.cli.output import fmt_time
from kiln.domain.pipelines import STEP_ENDED, PipelineRunRead, PipelineScheduleRead, RunState, StepState

app = typer.Typer(help="Run pipelines: named steps with depends_on, passed outputs, caching, retries and resume.")

RunArg = Annotated[str, typer.Argument(help="The pipeline run's id.")]
STYLES = {
    StepState.WAITING: "dim",
    StepState.RUNNING: "blue",
    StepState.SUCCEEDED: "green",
    StepState.CACHED: "cyan",
    StepState.FAILED: "red",
    StepState.SKIPPED: "yellow",
    StepState.CANCELLED: "magenta",
    RunState.RUNNING: "blue",
    RunState.SUCCEEDED: "green",
    RunState.FAILED: "red",
    RunState.CANCELLED: "magenta",
}


def _styled(state: str) -> Text:
    return Text(state, style=STYLES.get(state, ""))  # type: ignore[call-overload]


def run_detail(run: PipelineRunRead) -> None:
    out.print(Text.assemble(f"{run.id}  {run.name}  ", _styled(run.state), f"  {run.message}".rstrip()))
    table = Table(box=box.SIMPLE, show_edge=False, pad_edge=False)
    for column in ("STEP", "KIND", "STATE", "AFTER", "JOB", "TRIES", "MESSAGE"):
        table.add_column(column)
    for step in run.steps:
        job = (step.job_id or "-") + (" (cached)" if step.cached else "")
        tries = str(step.tries) if step.kind == "job" else "-"
        after = ",".join(step.depends_on) or "-"
        table.add_row(step.name, step.kind, _styled(step.state), after, job, tries, step.message)
    out.print(table)


def runs_table(runs: list[PipelineRunRead]) -> None:
    table = Table(box=box.SIMPLE, show_edge=False, pad_edge=False)
    for column in ("RUN", "PIPELINE", "STATE", "STEPS", "STARTED", "BY"):
        table.add_column(column)
    for run in runs:
        done = sum(step.state in (StepState.SUCCEEDED, StepState.CACHED) for step in run.steps)
        table.add_row(
            run.id, run.name, _styled(run.state), f"{done}/{len(run.steps)}", fmt_time(run.created_at), run.user
        )
    out.print(table)


def _follow(client: object, run: PipelineRunRead) -> PipelineRunRead:
    seen: dict[str, str] = {}
    while True:
        run = client.get_pipeline_run(run.id)  # type: ignore[attr-defined]
        for step in run.steps:
            if seen.get(step.name) != step.state:
                seen[step.name] = step.state
                # The step's message names its job once it has one ("job job-…"): the id is not said twice.
                detail = f" {step.job_id}" if step.job_id and step.job_id not in (step.message or "") else ""
                info(Text.assemble(f"{step.name}: ", _styled(step.state), f"{detail} {step.message}".rstrip()))
        if run.state != RunState.RUNNING and all(step.state in STEP_ENDED for step in run.steps):
            return run
        time.sleep(0.5)


@app.command("run")
def run(
    file: Annotated[Path, typer.Option("--file", "-f", help="The pipeline file (YAML).", exists=True, dir_okay=False)],
    follow: Annotated[bool, typer.Option("--follow", help="Print each step's state until the run ends.")] = False,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Run every job step (reuse no earlier result).")] = False,
    output: Output = OutputFormat.table,
) -> None:
    """Start a run of the pipeline in FILE: its job steps run the code of FILE's directory, or of their own
    ``code:`` directory (relative to it). The run's id is the first word on stdout."""
    spec = yaml.safe_load(file.read_text())
    with connect() as client:
        started = client.run_pipeline(spec, file.parent, use_cache=not no_cache)
        print(started.id, file=sys.stdout, flush=True)
        if not follow:
            return
        ended = _follow(client, started)
    if output is OutputFormat.json:
        emit_json(ended.model_dump(mode="json"))
    else:
        run_detail(ended)
    if ended.state != RunState.SUCCEEDED:
        raise typer.Exit(1)


@app.command("list")
def list_pipelines(output: Output = OutputFormat.table) -> None:
    """Your organisation's pipelines (by the name of their runs): how many runs, the last one and its state."""
    with connect() as client:
        runs = client.list_pipeline_runs(limit=200)
    last: dict[str, PipelineRunRead] = {}
    counts: dict[str, int] = {}
    for item in runs:  # newest first
        last.setdefault(item.name, item)
        counts[item.name] = counts.get(item.name, 0) + 1
    if output is OutputFormat.json:
        emit_json([{"name": n, "runs": counts[n], "last_run": r.model_dump(mode="json")} for n, r in last.items()])
        return
    if not last:
        info("no pipelines")
        return
    table = Table(box=box.SIMPLE, show_edge=False, pad_edge=False)
    for column in ("PIPELINE", "RUNS", "LAST RUN", "STATE", "STARTED"):
        table.add_column(column)
    for name, item in last.items():
        table.add_row(name, str(counts[name]), item.id, _styled(item.state), fmt_time(item.created_at))
    out.print(table)


@app.command("runs")
def list_runs(
    name: Annotated[str | None, typer.Argument(help="Only runs of this pipeline.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=200)] = 50,
    output: Output = OutputFormat.table,
) -> None:
    """Pipeline runs, newest first."""
    with connect() as client:
        runs = client.list_pipeline_runs(name, limit)
    emit_list(runs, output, runs_table, "no pipeline runs")


@app.command()
def show(run_id: RunArg, output: Output = OutputFormat.table) -> None:
    """A run and every step: its state, its job (or the cached one) and why."""
    with connect() as client:
        found = client.get_pipeline_run(run_id)
    if output is OutputFormat.json:
        emit_json(found.model_dump(mode="json"))
    else:
        run_detail(found)


@app.command()
def resume(run_id: RunArg, output: Output = OutputFormat.table) -> None:
    """Run a failed or cancelled run's failed, skipped and cancelled steps again, reusing the ones that succeeded."""
    with connect() as client:
        found = client.resume_pipeline_run(run_id)
    if output is OutputFormat.json:
        emit_json(found.model_dump(mode="json"))
    else:
        run_detail(found)


@app.command()
def cancel(run_id: RunArg, output: Output = OutputFormat.table) -> None:
    """Cancel a running run: its waiting steps and running steps' jobs."""
    with connect() as client:
        found = client.cancel_pipeline_run(run_id)
    if output is OutputFormat.json:
        emit_json(found.model_dump(mode="json"))
    else:
        run_detail(found)


def schedules_table(schedules: list[PipelineScheduleRead]) -> None:
    table = Table(box=box.SIMPLE, show_edge=False, pad_edge=False)
    for column in ("SCHEDULE", "PIPELINE", "CRON (UTC)", "NEXT", "LAST RUN", "BY", "NOTE"):
        table.add_column(column)
    for item in schedules:
        table.add_row(
            item.id, item.name, item.cron, fmt_time(item.next_at), item.last_run_id or "-", item.user, item.message
        )
    out.print(table)


@app.command()
def schedule(
    file: Annotated[Path, typer.Option("--file", "-f", help="The pipeline file (YAML).", exists=True, dir_okay=False)],
    cron: Annotated[str, typer.Option("--cron", help='When, in UTC: "0 3 * * *" is 03:00 every day.')],
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Each run runs every job step.")] = False,
    output: Output = OutputFormat.table,
) -> None:
    """Run the pipeline in FILE on a cron schedule (its code packed now, as ``run`` packs it). A time the server
    was down for is made up once when it comes back, never once per missed time. The schedule's id is the first
    word on stdout."""
    spec = yaml.safe_load(file.read_text())
    with connect() as client:
        made = client.schedule_pipeline(spec, cron, file.parent, use_cache=not no_cache)
    if output is OutputFormat.json:
        emit_json(made.model_dump(mode="json"))
    else:
        print(made.id, file=sys.stdout, flush=True)
        info(f"next run {fmt_time(made.next_at)} ({made.cron}, UTC)")


@app.command()
def schedules(output: Output = OutputFormat.table) -> None:
    """Your organisation's pipeline schedules: when each runs next, and its last run."""
    with connect() as client:
        found = client.list_pipeline_schedules()
    emit_list(found, output, schedules_table, "no pipeline schedules")


@app.command()
def unschedule(schedule_id: Annotated[str, typer.Argument(help="The schedule's id.")]) -> None:
    """Stop a pipeline schedule (its runs so far stay)."""
    with connect() as client:
        client.unschedule_pipeline(schedule_id)
    info(f"schedule {schedule_id} removed")

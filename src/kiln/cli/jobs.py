"""``kiln jobs``: list, show, events, why, cancel and download."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kiln.cli.common import Output, OutputFormat, connect, emit_json, emit_list, info, out
from kiln.cli.output import (
    display_path,
    events_table,
    job_detail,
    jobs_table,
    plural,
    transfer_progress,
    why_detail,
)
from kiln.domain.quantities import format_memory
from kiln.domain.states import JobState

app = typer.Typer(help="Inspect and manage jobs.", no_args_is_help=True)

JobArg = Annotated[str, typer.Argument(help="The job id.")]


@app.command("list")
def list_jobs(
    state: Annotated[
        list[JobState] | None, typer.Option("--state", "-s", case_sensitive=False, help="Only jobs in this state.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="At most this many (newest first).")] = 50,
    output: Output = OutputFormat.table,
) -> None:
    """List jobs, newest first."""
    with connect() as client:
        jobs = client.list_jobs(states=[s.value for s in state] if state else None, limit=limit)
    emit_list(jobs, output, jobs_table, "no jobs")


@app.command()
def show(job_id: JobArg, output: Output = OutputFormat.table) -> None:
    """A job's state, reason, allocation, times and spec."""
    with connect() as client:
        job = client.get_job(job_id)
    if output is OutputFormat.json:
        emit_json(job.model_dump(mode="json"))
    else:
        job_detail(job)


@app.command()
def events(job_id: JobArg, output: Output = OutputFormat.table) -> None:
    """Every state change of a job, oldest first."""
    with connect() as client:
        items = client.events(job_id)
    if output is OutputFormat.json:
        emit_json([event.model_dump(mode="json") for event in items])
    else:
        events_table(items)


@app.command()
def why(job_id: JobArg, output: Output = OutputFormat.table) -> None:
    """Why a job waits: its queue position, the limit that holds it, with the numbers, and what is ahead."""
    with connect() as client:
        answer = client.why(job_id)
    if output is OutputFormat.json:
        emit_json(answer.model_dump(mode="json"))
    else:
        why_detail(answer)


@app.command()
def cancel(job_id: JobArg, output: Output = OutputFormat.table) -> None:
    """Cancel a job (idempotent): a queued job ends at once, a running one is stopped."""
    with connect() as client:
        job = client.cancel(job_id)
    if output is OutputFormat.json:
        emit_json(job.model_dump(mode="json"))
    elif JobState(job.state).terminal:
        info(f"job {job.id} {job.state}")
    else:
        info(f"cancelling job {job.id} ({job.state}); see `kiln jobs show {job.id}`")


@app.command()
def download(
    job_id: JobArg,
    path: Annotated[
        str | None, typer.Argument(help="Only this file or directory of the job's outputs (default: all).")
    ] = None,
    dest: Annotated[Path, typer.Option("--dest", "-d", file_okay=False, help="Where to write the files.")] = Path("."),
) -> None:
    """Download what a job wrote to $KILN_OUTPUT_DIR; prints the files written."""
    with connect() as client:
        artifacts = client.artifacts(job_id)
        if path is not None:
            prefix = path.strip("/")
            artifacts = [a for a in artifacts if a.path == prefix or a.path.startswith(prefix + "/")]
        if not artifacts and path is None:
            job = client.get_job(job_id)
            state = JobState(job.state)
            note = "" if state.terminal else f" yet (it is {state}; outputs are collected when it ends)"
            info(f"job {job_id} has no artifacts{note}")
            return
        total = sum(a.size for a in artifacts)
        with transfer_progress(f"downloading {plural(len(artifacts), 'file')}", total) as progress:
            written = client.download(job_id, dest, path, progress)
    for target in written:
        out.print(display_path(target), soft_wrap=True, markup=False)
    info(f"downloaded {plural(len(written), 'file')} ({format_memory(total)}) to {display_path(dest.resolve())}")

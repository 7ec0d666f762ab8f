"""``kiln jobs``: list, show, events, why, cancel, rerun, delete and download."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from kiln.cli.common import EXIT_USAGE, Output, OutputFormat, connect, emit_json, emit_list, fail, info, out
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
def rerun(
    job_id: JobArg,
    name: Annotated[str | None, typer.Option(help="Display name (default: the job's).")] = None,
    follow: Annotated[
        bool, typer.Option("--follow", help="Stream the logs; exit 0 if the job succeeds, 1 if not, 130 cancelled.")
    ] = False,
) -> None:
    """Submit a new job with a job's spec and code (in any state); prints the new job's id first, as run does."""
    from kiln.cli.run import follow_to_end

    with connect() as client:
        job = client.rerun(job_id, name=name)
        sys.stdout.write(job.id + "\n")
        sys.stdout.flush()
        info(f"submitted job {job.id} ({job.name}), a rerun of {job_id}: {job.state}")
        if not follow:
            info(f"follow it with: kiln logs -f {job.id}")
            return
        follow_to_end(client, job.id)


@app.command()
def delete(
    job_id: JobArg,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Delete an ended job with its events, log, metrics, artifacts and checkpoints (frees their storage)."""
    if not yes:
        if not sys.stdin.isatty():
            fail(f"deleting job {job_id} cannot be undone; pass --yes to confirm", EXIT_USAGE)
        typer.confirm(f"Delete job {job_id} with its outputs, log and metrics? This cannot be undone", abort=True)
    with connect() as client:
        client.delete_job(job_id)
    info(f"deleted job {job_id}")


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

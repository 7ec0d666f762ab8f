"""``kiln run``: package the working directory, submit a job, optionally follow it to the end."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kiln.cli.common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, connect, fail, info
from kiln.cli.logs import follow_logs
from kiln.cli.output import plural, transfer_progress
from kiln.cli.spec import Overrides, SpecError, build_spec, parse_pairs
from kiln.domain.states import JobState

if TYPE_CHECKING:
    from kiln.domain.schemas import JobRead
    from kiln.sdk.client import Client

RUN_HELP = (
    "Submit a job: package --dir (honouring .gitignore and .kilnignore), upload it and run COMMAND.\n\n"
    "The job id is the first line on stdout (JOB=$(kiln run ... | head -1)); everything else goes to stderr. "
    "Flags override the values of the -f file; --env and --label merge with its maps.\n\n"
    "Options come first: everything from the first argument on (or after --) is the command. A single argument "
    "with spaces or shell characters runs through /bin/sh -c, e.g. kiln run -- 'python a.py && python b.py'."
)


def upload_code(client: Client, directory: Path) -> str:
    """Bundle ``directory``, upload it with a progress bar on stderr, return its sha256."""
    from kiln.domain.quantities import format_memory
    from kiln.sdk.client import DEFAULT_MAX_CODE_BYTES
    from kiln.sdk.packaging import build_bundle

    bundle = build_bundle(directory, DEFAULT_MAX_CODE_BYTES)
    try:
        info(
            f"packaged {plural(bundle.files, 'file')} ({format_memory(bundle.unpacked_bytes)}) from {directory} "
            f"into a {format_memory(bundle.size)} bundle"
        )
        with transfer_progress("uploading code", bundle.size) as progress:
            client.upload_blob(bundle.path, bundle.sha256, progress)
    finally:
        bundle.path.unlink(missing_ok=True)
    return bundle.sha256


def final_exit_code(job: JobRead) -> int:
    state = JobState(job.state)
    if state is JobState.SUCCEEDED:
        return 0
    return EXIT_INTERRUPTED if state is JobState.CANCELLED else EXIT_ERROR


def describe_end(job: JobRead) -> str:
    text = f"job {job.id} {job.state}"
    details = [d for d in (f"exit code {job.exit_code}" if job.exit_code is not None else None, job.reason) if d]
    if details:
        text += f" ({', '.join(details)})"
    if job.message and JobState(job.state) is not JobState.SUCCEEDED:
        text += f": {job.message}"
    return text


def run(
    command: Annotated[
        list[str] | None,
        typer.Argument(metavar="COMMAND", help="What to run, e.g. -- python train.py --lr 3e-4."),
    ] = None,
    file: Annotated[
        Path | None,
        typer.Option("--file", "-f", dir_okay=False, help="A job spec (kiln.yaml); flags override its values."),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Display name.")] = None,
    cpus: Annotated[float | None, typer.Option(help="CPU cores to reserve.")] = None,
    memory: Annotated[str | None, typer.Option(help="Memory to reserve and enforce, e.g. 2G, 512Mi.")] = None,
    disk: Annotated[
        str | None, typer.Option(help="Disk the job may fill: work dir, outputs, checkpoints, home (e.g. 50G).")
    ] = None,
    gpus: Annotated[int | None, typer.Option(help="Whole GPUs to reserve.")] = None,
    gpu_type: Annotated[str | None, typer.Option(help="Only GPUs of this model, e.g. H200.")] = None,
    priority: Annotated[
        str | None, typer.Option(help="Scheduling class: low, normal (default) or high (needs a grant).")
    ] = None,
    runtime: Annotated[
        str | None, typer.Option(help="Catalog runtime: FRAMEWORK or FRAMEWORK==VERSION (kiln runtimes list).")
    ] = None,
    python: Annotated[str | None, typer.Option(help="Run with this Python executable (on the server).")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE, repeatable.")] = None,
    label: Annotated[list[str] | None, typer.Option("--label", "-l", help="KEY=VALUE, repeatable.")] = None,
    timeout: Annotated[str | None, typer.Option(help="Wall-clock limit per run, e.g. 90s, 10m, 1h30m.")] = None,
    max_restarts: Annotated[int | None, typer.Option(help="Retries of a failed run.")] = None,
    directory: Annotated[Path, typer.Option("--dir", exists=True, file_okay=False, help="The code to upload.")] = (
        Path(".")
    ),
    no_code: Annotated[bool, typer.Option("--no-code", help="Upload no code; run in an empty directory.")] = False,
    follow: Annotated[
        bool, typer.Option("--follow", help="Stream the logs; exit 0 if the job succeeds, 1 if not, 130 cancelled.")
    ] = False,
) -> None:
    try:
        flags = Overrides(
            command=list(command or []),
            name=name,
            cpus=cpus,
            memory=memory,
            disk=disk,
            gpus=gpus,
            runtime=runtime,
            python=python,
            env=parse_pairs(env, "--env"),
            labels=parse_pairs(label, "--label"),
            timeout=timeout,
            max_restarts=max_restarts,
            priority=priority,
            gpu_type=gpu_type,
        )
        spec = build_spec(file, flags)
    except SpecError as exc:
        fail(str(exc), EXIT_USAGE)

    with connect() as client:
        sha = None if no_code else upload_code(client, directory)
        job = client.submit(spec, sha)
        sys.stdout.write(job.id + "\n")
        sys.stdout.flush()
        info(f"submitted job {job.id} ({job.name}, {spec.runtime.label}): {job.state}")
        if not follow:
            info(f"follow it with: kiln logs -f {job.id}")
            return
        follow_logs(client, job.id)
        final = client.wait(job.id)
        info(describe_end(final))
        raise typer.Exit(final_exit_code(final))

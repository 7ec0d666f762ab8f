"""``kiln run``: package the working directory, submit a job, optionally follow it to the end."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from pydantic import ValidationError

from kiln.cli.common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, connect, fail, info
from kiln.cli.logs import follow_logs
from kiln.cli.output import plural, transfer_progress
from kiln.cli.spec import INPUT_FORMAT, Overrides, SpecError, build_spec, parse_input, parse_pairs
from kiln.domain.idempotency import check_key
from kiln.domain.notifications import NOTIFY_ON, JobNotify
from kiln.domain.states import JobState
from kiln.errors import InvalidInput

if TYPE_CHECKING:
    from kiln.domain.job_requests import JobDryRun
    from kiln.domain.schemas import JobRead
    from kiln.domain.spec import JobSpec
    from kiln.sdk.client import Client
    from kiln.sdk.code_manifest import Changes
    from kiln.sdk.packaging import Bundle

RUN_HELP = (
    "Submit a job: package --dir (honouring .gitignore and .kilnignore; directories `kiln jobs download` wrote "
    "are left out), have the server check the job, upload the code if the server lacks it, and run COMMAND.\n\n"
    "The job id is the first line on stdout (JOB=$(kiln run ... | head -1)); everything else goes to stderr. "
    "Flags override the values of the -f file; --env and --label merge with its maps.\n\n"
    "Options come first: everything from the first argument on (or after --) is the command. A single argument "
    "with spaces or shell characters runs through /bin/sh -c, e.g. kiln run -- 'python a.py && python b.py'.\n\n"
    "Exit codes: 2 when the spec is invalid or the server refuses it (nothing is uploaded then); with --follow, "
    "0 if the job succeeds, 1 if not, 130 if it is cancelled."
)


def pack_code(directory: Path) -> Bundle:
    """Bundle ``directory`` (nothing is sent yet) and say on stderr what was packed, what was left out because a
    job download wrote it, and what is new or changed since the last run from that directory."""
    from kiln.domain.quantities import format_memory
    from kiln.sdk.code_manifest import compare
    from kiln.sdk.packaging import DEFAULT_MAX_CODE_BYTES, build_bundle

    bundle = build_bundle(directory, DEFAULT_MAX_CODE_BYTES)
    for skipped in bundle.skipped:
        info(skipped.describe())
    info(
        f"packed {plural(bundle.files, 'file')} ({format_memory(bundle.unpacked_bytes)}) from {directory} "
        f"into a {format_memory(bundle.size)} bundle"
    )
    changes = compare(directory, bundle.digests)
    if not changes.first:
        info(describe_changes(changes, directory))
    return bundle


def describe_changes(changes: Changes, directory: Path) -> str:
    parts = [
        f"{len(names)} {label} ({_names(names)})"
        for label, names in (("new", changes.new), ("changed", changes.changed), ("removed", changes.removed))
        if names
    ]
    if not parts:
        return f"unchanged since the last run from {directory}"
    return f"since the last run from {directory}: " + ", ".join(parts)


def _names(names: list[str], shown: int = 8) -> str:
    text = ", ".join(names[:shown])
    return text + (f" and {len(names) - shown} more" if len(names) > shown else "")


def check_and_upload(client: Client, spec: JobSpec, bundle: Bundle | None, dry_run: bool) -> JobDryRun:
    """The server's dry run of the submit; then, unless ``dry_run``, the bundle's upload if the server lacks
    it. A spec the server refuses exits 2 with its message, before anything was uploaded."""
    from kiln.errors import BadRequest, InvalidInput, RuntimeUnavailable

    try:
        checked = client.dry_run(spec, bundle.sha256 if bundle else None)
    except (InvalidInput, BadRequest, RuntimeUnavailable) as exc:
        fail(f"the server refused the job: {exc.message}", EXIT_USAGE)
    if bundle is None or dry_run:
        return checked
    if checked.code_stored:
        info(f"code bundle {bundle.sha256[:12]} is on the server already")
    else:
        with transfer_progress("uploading code", bundle.size) as progress:
            client.upload_blob(bundle.path, bundle.sha256, progress)
        info(f"uploaded code bundle {bundle.sha256[:12]}")
    return checked


def print_dry_run(checked: JobDryRun, bundle: Bundle | None) -> None:
    import yaml

    sys.stdout.write(yaml.safe_dump(checked.spec.model_dump(mode="json", exclude_none=True), sort_keys=False))
    sys.stdout.flush()
    code = ""
    if bundle is not None:
        held = "the server holds it already" if checked.code_stored else "a run would upload it"
        code = f"; code bundle {bundle.sha256[:12]}: {held}"
    info(f"dry run: the server accepts job {checked.name!r}; nothing was uploaded or created{code}")


def follow_to_end(client: Client, job_id: str) -> NoReturn:
    """Stream the job's log until it ends, say how it ended, and exit with what that means."""
    follow_logs(client, job_id)
    final = client.wait(job_id)
    info(describe_end(final))
    raise typer.Exit(final_exit_code(final))


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
    pids: Annotated[
        int | None, typer.Option(help="Most processes and threads the job may have at once (default 4096).")
    ] = None,
    log_limit: Annotated[
        str | None, typer.Option("--log-limit", help="Most bytes the job's log may hold, e.g. 100M (default 1G).")
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
    network: Annotated[
        str | None,
        typer.Option(
            help="isolated (default: the outside world under the operator's rules, and the Kiln API), none (the "
            "Kiln API only) or host (the machine's network, where the operator allows it)."
        ),
    ] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE, repeatable.")] = None,
    label: Annotated[list[str] | None, typer.Option("--label", "-l", help="KEY=VALUE, repeatable.")] = None,
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            "-p",
            help="NAME=VALUE, repeatable: the job's params (KILN_PARAM_NAME, $KILN_PARAMS_FILE), recorded by its run; "
            "numbers and true/false are typed.",
        ),
    ] = None,
    experiment: Annotated[
        str | None, typer.Option(help="The experiment the job's run belongs to (default: Default).")
    ] = None,
    timeout: Annotated[
        str | None, typer.Option(help="Wall-clock limit per run, seconds or e.g. 90s, 15m, 2h, 1d, 1h30m.")
    ] = None,
    max_restarts: Annotated[int | None, typer.Option(help="Retries of a failed run.")] = None,
    inputs: Annotated[
        list[str] | None,
        typer.Option(
            "--input",
            "-i",
            metavar=INPUT_FORMAT,
            help="A dataset the job reads, repeatable: at /data/NAME (or PATH), the latest version unless @VERSION, "
            "staged unless :mount. Added to the -f file's inputs (replacing one of the same dataset).",
        ),
    ] = None,
    directory: Annotated[Path, typer.Option("--dir", exists=True, file_okay=False, help="The code to upload.")] = (
        Path(".")
    ),
    no_code: Annotated[bool, typer.Option("--no-code", help="Upload no code; run in an empty directory.")] = False,
    follow: Annotated[
        bool, typer.Option("--follow", help="Stream the logs; exit 0 if the job succeeds, 1 if not, 130 cancelled.")
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Have the server check the job as a submit would and print the spec it would get (inputs pinned); "
            "upload and create nothing.",
        ),
    ] = False,
    notify: Annotated[
        str | None,
        typer.Option(
            "--notify",
            metavar="WHEN",
            help="E-mail --mail-user when the job ends: end, fail, success, cancel, comma-separated (Slurm's "
            "--mail-type=END,FAIL); through the operator's SMTP server.",
        ),
    ] = None,
    mail_user: Annotated[
        list[str] | None, typer.Option("--mail-user", metavar="EMAIL", help="Who --notify mails, repeatable.")
    ] = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            "--idempotency-key",
            metavar="KEY",
            help="Make running this command again harmless (a shell's retry loop): a repeat with the same KEY and "
            "the same job (spec and code) within 24 h prints the job the first one submitted and submits none; "
            "with another job it is refused. 1 to 255 printable ASCII characters.",
        ),
    ] = None,
) -> None:
    try:
        if idempotency_key is not None:
            check_key(idempotency_key)
        flags = Overrides(
            command=list(command or []),
            name=name,
            cpus=cpus,
            memory=memory,
            disk=disk,
            pids=pids,
            log=log_limit,
            gpus=gpus,
            runtime=runtime,
            python=python,
            env=parse_pairs(env, "--env"),
            labels=parse_pairs(label, "--label"),
            timeout=timeout,
            max_restarts=max_restarts,
            priority=priority,
            gpu_type=gpu_type,
            inputs=[parse_input(text) for text in inputs or []],
            network=network,
            params=parse_pairs(param, "--param"),
            experiment=experiment,
        )
        spec = build_spec(file, flags)
        if notify is not None or mail_user:
            spec = spec.model_copy(update={"notify": notify_of(notify, mail_user, spec.notify)})
    except SpecError as exc:
        fail(str(exc), EXIT_USAGE)
    except InvalidInput as exc:
        fail(f"--idempotency-key: {exc.message.removeprefix('Idempotency-Key: ')}", EXIT_USAGE)
    if dry_run and follow:
        fail("--dry-run creates no job to --follow; give one of them", EXIT_USAGE)

    from kiln.sdk.code_manifest import remember

    with connect() as client:
        bundle = None if no_code else pack_code(directory)
        if bundle is not None:  # the run records where the code came from: its git commit, and whether it was dirty
            from kiln.sdk.source_info import source_labels

            spec = spec.model_copy(update={"labels": {**spec.labels, **source_labels(directory, spec.labels)}})
        try:
            checked = check_and_upload(client, spec, bundle, dry_run)
            if dry_run:
                print_dry_run(checked, bundle)
                return
            job = client.submit(spec, bundle.sha256 if bundle else None, idempotency_key=idempotency_key)
        finally:
            if bundle is not None:
                bundle.path.unlink(missing_ok=True)
        if bundle is not None:
            remember(directory, bundle.digests)
        sys.stdout.write(job.id + "\n")
        sys.stdout.flush()
        info(f"submitted job {job.id} ({job.name}, {spec.runtime.label}): {job.state}")
        if not follow:
            info(f"follow it with: kiln logs -f {job.id}")
            return
        follow_to_end(client, job.id)


def notify_of(when: str | None, mail_user: list[str] | None, current: JobNotify | None) -> JobNotify:
    """``--notify end,fail --mail-user a@b`` over the spec's ``notify:`` (flags replace its values)."""
    on = [x.strip().lower() for x in when.split(",") if x.strip()] if when else (current.on if current else [])
    on = ["end" if x == "all" else x for x in on]
    emails = list(mail_user or (current.email if current else []))
    unknown = [x for x in on if x not in NOTIFY_ON]
    if unknown:
        raise SpecError(f"--notify: {', '.join(unknown)} is not one of end, fail, success, cancel")
    if not on:
        raise SpecError("--mail-user needs --notify WHEN (end, fail, success, cancel)")
    if not emails:
        raise SpecError("--notify needs --mail-user EMAIL: who is mailed")
    try:
        return JobNotify.model_validate({"on": list(dict.fromkeys(on)), "email": emails})
    except ValidationError as exc:
        raise SpecError(f"--mail-user: {exc.errors()[0]['msg']}") from None

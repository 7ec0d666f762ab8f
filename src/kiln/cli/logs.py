"""``kiln logs``: print a job's log, or follow it until the job ends (also used by ``kiln run --follow``)."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from kiln.cli.common import EXIT_INTERRUPTED, connect, err, info
from kiln.sdk.logs import LogLine, LogParser, LogSource

if TYPE_CHECKING:
    from kiln.sdk.client import Client


def member_tag(worker: str | None) -> str | None:
    """The log tag of ``--worker``: ``1`` → ``worker1``; ``ps0`` (a TensorFlow parameter server) as is."""
    if worker is None:
        return None
    worker = worker.strip().lower()
    if worker.isdigit():
        return f"worker{int(worker)}"
    if worker.startswith("ps") and worker[2:].isdigit():
        return f"ps{int(worker[2:])}"
    raise typer.BadParameter(f"{worker!r}: give a worker index (0, 1, …) or a parameter server (ps0, ps1, …)")


def print_log_lines(records: Iterable[LogLine | str], timestamps: bool = False, member: str | None = None) -> None:
    """The job's output (stdout and stderr lines, in order) on stdout; Kiln's own messages as ``[kiln] ...`` on
    stderr. A distributed job's lines are prefixed with their member (``[worker 1] ``); ``member`` keeps that
    member's lines only, and Kiln's messages about it or about the whole job, marked as in a single-worker job's
    view (another member's ``attempt 1 starting`` is not this one's). Stored lines (``str``) are parsed first."""
    parser = LogParser()
    for item in records:
        if item == "":
            continue
        record = parser.parse(item) if isinstance(item, str) else item
        if member is not None and record.worker != member and (record.worker or record.source != LogSource.KILN):
            continue
        prefix = f"{fmt_stamp(record)} " if timestamps and record.time else ""
        prefix += record.prefix(worker=member is None)
        if record.source == LogSource.KILN:
            sys.stdout.flush()  # keep the order on a terminal that shows both streams
            err.print(Text(f"{prefix}{record.text}", style="dim"), soft_wrap=True)
        else:
            sys.stdout.write(f"{prefix}{record.text}\n")
            sys.stdout.flush()


def fmt_stamp(record: LogLine) -> str:
    """The line's time as stored (RFC 3339, UTC, microseconds)."""
    return record.time.strftime("%Y-%m-%dT%H:%M:%S.%fZ") if record.time else ""


def print_all_logs(client: Client, job_id: str, timestamps: bool = False, member: str | None = None) -> None:
    """Every stored line (read page by page: the server sends at most 1 MiB per request)."""
    print_log_lines(client.stream_logs(job_id, follow=False), timestamps, member)


def follow_logs(client: Client, job_id: str, timestamps: bool = False, member: str | None = None) -> None:
    """Stream the log until the job ends. Ctrl-C stops following (the job keeps running) and exits 130."""
    try:
        print_log_lines(client.stream_logs(job_id, follow=True), timestamps, member)
    except KeyboardInterrupt:
        info(f"\nstopped following; job {job_id} keeps running (cancel it with: kiln jobs cancel {job_id})")
        raise typer.Exit(EXIT_INTERRUPTED) from None


def logs(
    job_id: Annotated[str, typer.Argument(help="The job id.")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines until the job ends.")] = False,
    timestamps: Annotated[bool, typer.Option("--timestamps", "-t", help="Prefix each line with its time.")] = False,
    worker: Annotated[
        str | None,
        typer.Option("--worker", "-w", help="Only this member of a distributed job: 0, 1, … or ps0, ps1, …"),
    ] = None,
) -> None:
    r"""Print a job's log: its output on stdout, Kiln's own messages (\[kiln] ...) on stderr."""
    member = member_tag(worker)
    with connect() as client:
        if follow:
            follow_logs(client, job_id, timestamps, member)
        else:
            print_all_logs(client, job_id, timestamps, member)

"""``kiln logs``: print a job's log, or follow it until the job ends (also used by ``kiln run --follow``)."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from kiln.cli.common import EXIT_INTERRUPTED, connect, err, info
from kiln.runtime.logline import parse_line

if TYPE_CHECKING:
    from kiln.sdk.client import Client


def print_log_lines(lines: Iterable[str], timestamps: bool = False) -> None:
    """The job's output (O and E lines, in order) on stdout; Kiln's own messages (K) as ``[kiln] ...`` on stderr."""
    for line in lines:
        if not line:
            continue
        time, stream, text = parse_line(line)
        prefix = f"{time} " if timestamps and time else ""
        if stream == "K":
            sys.stdout.flush()  # keep the order on a terminal that shows both streams
            err.print(Text(f"{prefix}[kiln] {text}", style="dim"), soft_wrap=True)
        else:
            sys.stdout.write(f"{prefix}{text}\n")
            sys.stdout.flush()


def print_all_logs(client: Client, job_id: str, timestamps: bool = False) -> None:
    """Every stored line, page by page (the server sends at most 1 MiB per request)."""
    offset = 0
    while True:
        data, next_offset, _ = client.read_logs(job_id, offset)
        if not data or next_offset <= offset:
            return
        print_log_lines(data.decode(errors="replace").split("\n"), timestamps)
        offset = next_offset


def follow_logs(client: Client, job_id: str, timestamps: bool = False) -> None:
    """Stream the log until the job ends. Ctrl-C stops following (the job keeps running) and exits 130."""
    try:
        print_log_lines(client.stream_logs(job_id, follow=True), timestamps)
    except KeyboardInterrupt:
        info(f"\nstopped following; job {job_id} keeps running (cancel it with: kiln jobs cancel {job_id})")
        raise typer.Exit(EXIT_INTERRUPTED) from None


def logs(
    job_id: Annotated[str, typer.Argument(help="The job id.")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines until the job ends.")] = False,
    timestamps: Annotated[bool, typer.Option("--timestamps", "-t", help="Prefix each line with its time.")] = False,
) -> None:
    r"""Print a job's log: its output on stdout, Kiln's own messages (\[kiln] ...) on stderr."""
    with connect() as client:
        if follow:
            follow_logs(client, job_id, timestamps)
        else:
            print_all_logs(client, job_id, timestamps)

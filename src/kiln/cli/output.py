"""Rendering: tables, detail views, times and durations, transfer progress bars."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from rich import box
from rich.table import Table
from rich.text import Text

from kiln.cli.common import err, out
from kiln.domain.quantities import format_memory
from kiln.domain.spec import command_text
from kiln.domain.states import JobState

if TYPE_CHECKING:
    from kiln.domain.schemas import EventRead, JobRead, RuntimeRead, WhoAmI

STATE_STYLES = {
    JobState.QUEUED: "cyan",
    JobState.STARTING: "cyan",
    JobState.RUNNING: "blue",
    JobState.RESTARTING: "yellow",
    JobState.SUCCEEDED: "green",
    JobState.FAILED: "red",
    JobState.CANCELLED: "magenta",
}


def state_text(state: JobState | str | None) -> Text:
    if state is None:
        return Text("-", style="dim")
    return Text(str(state), style=STATE_STYLES.get(JobState(state), ""))


def _aware(dt: datetime) -> datetime:
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)


def fmt_time(dt: datetime | None) -> str:
    """Local time, to the second (the server sends UTC)."""
    if dt is None:
        return "-"
    return _aware(dt).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    total = max(0, round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def job_duration(job: JobRead) -> float | None:
    """How long the job has been (or was) running, from its first start to its end (or now)."""
    start = job.running_at or job.started_at
    if start is None:
        return None
    end = job.finished_at or (None if JobState(job.state).terminal else datetime.now(UTC))
    if end is None:
        return None
    return (_aware(end) - _aware(start)).total_seconds()


def _table(*columns: str) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for name in columns:
        table.add_column(name, overflow="fold")
    return table


def _cell(value: object) -> Text:
    return Text("-" if value is None or value == "" else str(value))


def jobs_table(jobs: list[JobRead]) -> None:
    table = _table("ID", "NAME", "STATE", "REASON", "CREATED", "DURATION")
    table.columns[0].no_wrap = True
    for job in jobs:
        table.add_row(
            Text(job.id),
            _cell(job.name),
            state_text(job.state),
            _cell(job.reason),
            fmt_time(job.created_at),
            fmt_duration(job_duration(job)),
        )
    out.print(table)


def _details(rows: list[tuple[str, object]]) -> None:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for key, value in rows:
        grid.add_row(key, value if isinstance(value, Text) else _cell(value))
    out.print(grid)


def job_detail(job: JobRead) -> None:
    spec = job.spec
    alloc = job.allocation
    allocation = None
    if alloc is not None:
        parts = [f"{alloc.cpus:g} CPU"]
        if alloc.memory:
            parts.append(format_memory(alloc.memory))
        if alloc.gpus:
            parts.append("GPU " + ",".join(str(g) for g in alloc.gpus))
        allocation = ", ".join(parts)
    resources = f"{spec.resources.cpus:g} CPU"
    if spec.resources.memory:
        resources += f", {format_memory(spec.resources.memory)}"
    if spec.resources.gpus:
        resources += f", {spec.resources.gpus} GPU"
    rows: list[tuple[str, object]] = [
        ("id", job.id),
        ("name", job.name),
        ("state", state_text(job.state)),
        ("reason", job.reason),
        ("message", job.message),
        ("exit code", job.exit_code),
        ("attempt", job.attempt),
        ("restarts", f"{job.restarts} (max {spec.max_restarts})"),
        ("allocation", allocation),
        ("created", fmt_time(job.created_at)),
        ("started", fmt_time(job.started_at)),
        ("running", fmt_time(job.running_at)),
        ("finished", fmt_time(job.finished_at)),
        ("duration", fmt_duration(job_duration(job))),
        ("command", command_text(spec.command)),
        ("runtime", spec.runtime.label),
        ("resources", resources),
        ("timeout", fmt_duration(spec.timeout) if spec.timeout else None),
        ("env", " ".join(sorted(spec.env)) or None),  # names only: values may be secrets
        ("labels", " ".join(f"{k}={v}" for k, v in sorted(spec.labels.items())) or None),
        ("code", job.code_sha256[:12] if job.code_sha256 else None),
    ]
    if job.cancel_requested and not JobState(job.state).terminal:
        rows.insert(3, ("cancel", "requested"))
    _details(rows)


def events_table(events: list[EventRead]) -> None:
    table = _table("TIME", "TRANSITION", "REASON", "MESSAGE")
    for event in events:
        if event.to_state is None:
            transition = Text("")
        else:
            transition = state_text(event.from_state) + Text(" → ") + state_text(event.to_state)
        table.add_row(fmt_time(event.time), transition, _cell(event.reason), Text(event.message or ""))
    out.print(table)


def runtimes_table(runtimes: list[RuntimeRead]) -> None:
    table = _table("NAME", "FRAMEWORK", "VERSION", "STATUS", "PACKAGES")
    styles = {"installed": "green", "installing": "yellow", "failed": "red"}
    for rt in runtimes:
        version = rt.version + (" (default)" if rt.default else "")
        table.add_row(
            _cell(rt.name),
            _cell(rt.framework),
            version,
            Text(rt.status, style=styles.get(rt.status, "dim")),
            Text(" ".join(rt.packages)),
        )
    out.print(table)


def whoami_detail(me: WhoAmI, endpoint: str) -> None:
    _details(
        [
            ("endpoint", endpoint),
            ("user", f"{me.user_name} ({me.user_id})"),
            ("organisation", f"{me.org_name} ({me.org_id})"),
            ("access key", me.access_key),
            ("platform admin", "yes" if me.platform_admin else "no"),
        ]
    )


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def display_path(path: os.PathLike[str] | str) -> str:
    """``path`` relative to the working directory when it lies below it."""
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return str(path)
    return str(path) if relative.startswith("..") else relative


@contextmanager
def transfer_progress(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """A byte progress bar on stderr (only drawn on a terminal); yields the ``progress(n)`` callback."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=err, disable=not err.is_terminal) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n: progress.advance(task, n)

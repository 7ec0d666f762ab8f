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
from kiln.domain.quantities import format_bytes, format_number
from kiln.domain.states import JobState

if TYPE_CHECKING:
    from kiln.domain.schemas import (
        AuditRead,
        EventRead,
        JobRead,
        KeyCreated,
        KeyRead,
        OrgRead,
        QuotaReport,
        RuntimeRead,
        UserRead,
        WhoAmI,
        WhyRead,
    )
    from kiln.domain.spec import JobSpec

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


def job_reason(job: JobRead) -> str | None:
    """What the REASON column says: for a waiting job, why it waits as the scheduler last recorded it (the job's
    message, e.g. ``quota: cpus 1 of 1 in use ...``: what `kiln jobs why` explains in full); else its reason."""
    if JobState(job.state) in (JobState.QUEUED, JobState.RESTARTING) and job.message:
        return job.message
    return job.reason


def jobs_table(jobs: list[JobRead]) -> None:
    table = _table("ID", "NAME", "STATE", "REASON", "CREATED", "DURATION")
    table.columns[0].no_wrap = True
    for job in jobs:
        table.add_row(
            Text(job.id),
            _cell(job.name),
            state_text(job.state),
            _cell(job_reason(job)),
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


def distributed_text(spec: JobSpec) -> str | None:
    """A gang's shape: ``pytorch, 2 workers of 4 processes``, ``tensorflow, 3 workers + 1 parameter server``."""
    d = spec.distributed
    if d is None:
        return None
    text = f"{d.framework}, {d.workers} worker{'s' if d.workers != 1 else ''}"
    if d.procs_per_worker > 1:
        text += f" of {d.procs_per_worker} processes"
    if d.ps:
        text += f" + {d.ps} parameter server{'s' if d.ps != 1 else ''}"
    return text


def resources_text(spec: JobSpec) -> str:
    """What the job asks for. A gang's resources are each member's: they are said per worker, times the members,
    with the total the job holds (``1 CPU, 2 GiB memory per worker, 2 workers: 2 CPU, 4 GiB memory in all``)."""
    r = spec.resources
    members = spec.gang_size
    if members == 1:
        text = f"{r.cpus:g} CPU"
        if r.memory:
            text += f", {format_bytes(r.memory)} memory"
        if r.disk:
            text += f", {format_bytes(r.disk)} disk"
        if r.pids:
            text += f", {r.pids} processes"
        if r.log:
            text += f", {format_bytes(r.log)} log"
        if r.gpus:
            text += f", {r.gpus} GPU"
        return text
    each = [f"{r.cpus:g} CPU"]
    total = [f"{r.cpus * members:g} CPU"]
    if r.memory:
        each.append(f"{format_bytes(r.memory)} memory")
        total.append(f"{format_bytes(r.memory * members)} memory")
    if r.gpus:
        each.append(f"{r.gpus} GPU")
        total.append(f"{r.gpus * members} GPU")
    if r.disk:
        each.append(f"{format_bytes(r.disk)} disk")
        total.append(f"{format_bytes(r.disk * members)} disk")
    if r.pids:
        each.append(f"{r.pids} processes")
    assert spec.distributed is not None  # a gang of more than one member is a distributed job
    unit = "member" if spec.distributed.ps else "worker"
    text = f"{', '.join(each)} per {unit}, {members} {unit}s: {', '.join(total)} in all"
    if r.log:
        text += f"; {format_bytes(r.log)} log for the whole job"
    return text


def job_detail(job: JobRead) -> None:
    from kiln.domain.spec import command_text  # the job models: not imported for commands that show no job

    spec = job.spec
    alloc = job.allocation
    allocation = None
    if alloc is not None:
        parts = [f"{alloc.cpus:g} CPU"]
        if alloc.memory:
            parts.append(f"{format_bytes(alloc.memory)} memory")
        if alloc.gpus:
            parts.append("GPU " + ",".join(str(g) for g in alloc.gpus))
        allocation = ", ".join(parts)
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
        ("distributed", distributed_text(spec)),
        ("resources", resources_text(spec)),
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


def why_detail(why: WhyRead) -> None:
    rows = [("job", why.job_id), ("state", state_text(why.state)), ("priority", why.priority)]
    if why.waiting:
        rows.append(("held by", Text(why.kind or "nothing: it fits now", style="yellow" if why.kind else "green")))
        if why.position is not None:
            rows.append(("position", f"{why.position} of {why.queue_length} waiting"))
    rows.append(("why", Text(why.message)))
    if why.ahead:
        own = [a for a in why.ahead if not a.other_org]
        others = len(why.ahead) - len(own)
        text = ", ".join(f"{a.id} ({a.name})" if a.name else str(a.id) for a in own)
        if others:
            text += (", " if text else "") + f"{others} job(s) of other organisations"
        rows.append(("ahead", text))
    _details(rows)


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
    rows: list[tuple[str, object]] = [
        ("endpoint", endpoint),
        ("user", f"{me.user_name} ({me.user_id})"),
        ("organisation", f"{me.org_name} ({me.org_id})"),
        ("access key", me.access_key),
        ("role", me.role),
        ("platform admin", "yes" if me.platform_admin else "no"),
    ]
    if me.job_id:
        rows.append(("job token of", me.job_id))
    _details(rows)


# -- tenancy ------------------------------------------------------------------------------------------------


def orgs_table(orgs: list[OrgRead]) -> None:
    table = _table("ID", "NAME", "CREATED")
    table.columns[0].no_wrap = True
    for org in orgs:
        table.add_row(Text(org.id), _cell(org.name), fmt_time(org.created_at))
    out.print(table)


def org_detail(org: OrgRead) -> None:
    _details(
        [
            ("id", org.id),
            ("name", org.name),
            ("fair-share weight", f"{org.share_weight:g}"),
            ("max priority", org.max_priority),
            ("created", fmt_time(org.created_at)),
        ]
    )


def role_text(user: UserRead) -> str:
    return user.role + (", platform admin" if user.platform_admin else "")


def user_status(user: UserRead) -> Text:
    return Text("disabled", style="red") if user.disabled else Text("active", style="green")


def users_table(users: list[UserRead]) -> None:
    table = _table("ID", "NAME", "ORGANISATION", "ROLE", "STATUS", "CREATED")
    table.columns[0].no_wrap = True
    for user in users:
        table.add_row(
            Text(user.id),
            _cell(user.name),
            _cell(user.org_name),
            role_text(user),
            user_status(user),
            fmt_time(user.created_at),
        )
    out.print(table)


def user_detail(user: UserRead) -> None:
    _details(
        [
            ("id", user.id),
            ("name", user.name),
            ("organisation", f"{user.org_name} ({user.org_id})"),
            ("role", role_text(user)),
            ("status", user_status(user)),
            ("created", fmt_time(user.created_at)),
        ]
    )


def key_status(key: KeyRead, now: datetime | None = None) -> Text:
    if not key.enabled:
        return Text("disabled", style="red")
    if key.expires_at is not None and _aware(key.expires_at) <= (now or datetime.now(UTC)):
        return Text("expired", style="yellow")
    return Text("enabled", style="green")


def keys_table(keys: list[KeyRead]) -> None:
    table = _table("ACCESS KEY", "USER", "STATUS", "EXPIRES", "LAST USED", "CREATED", "DESCRIPTION")
    table.columns[0].no_wrap = True
    for key in keys:
        table.add_row(
            Text(key.id),
            _cell(key.user_name),
            key_status(key),
            fmt_time(key.expires_at) if key.expires_at else "never",
            fmt_time(key.last_used_at) if key.last_used_at else "never",
            fmt_time(key.created_at),
            Text(key.description),
        )
    out.print(table)


def key_detail(key: KeyRead) -> None:
    _details(
        [
            ("access key", key.id),
            ("user", f"{key.user_name} ({key.user_id})"),
            ("status", key_status(key)),
            ("expires", fmt_time(key.expires_at) if key.expires_at else "never"),
            ("description", key.description),
        ]
    )


def key_created_detail(key: KeyCreated, endpoint: str) -> None:
    _details(
        [
            ("endpoint", endpoint),
            ("access key", key.id),
            ("secret key", Text(key.secret_key, style="bold")),
            ("user", f"{key.user_name} ({key.user_id})"),
            ("expires", fmt_time(key.expires_at) if key.expires_at else "never"),
            ("description", key.description),
        ]
    )


def quota_amount(field: str, value: float | None, *, limit: bool) -> str:
    """A quota limit or use for people: None is 'unlimited' (a limit) or '-' (a use); sizes as 128 GiB."""
    if value is None:
        return "unlimited" if limit else "-"
    if field in ("memory", "storage"):
        return format_bytes(int(value))
    return format_number(value)


QUOTA_FIELD_NAMES = ("gpus", "cpus", "memory", "count", "storage")


def quota_table(report: QuotaReport) -> None:
    """Every field of ``train`` (the jobs' category) and ``total``; of the others, what is limited or in use."""
    table = _table("CATEGORY", "FIELD", "USED", "LIMIT")
    hidden = 0
    for category in report.categories:
        for field in QUOTA_FIELD_NAMES:
            limit = getattr(category.limits, field)
            used = getattr(category.used, field)
            idle = limit is None and not used
            if field == "storage" and category.category != "total" and idle:
                continue  # storage is limited for the organisation as a whole only
            if category.category not in ("train", "total") and idle:
                hidden += 1
                continue
            full = limit is not None and used is not None and used >= limit
            table.add_row(
                category.category,
                field,
                Text(quota_amount(field, used, limit=False), style="red" if full else ""),
                Text(quota_amount(field, limit, limit=True), style="dim" if limit is None else ""),
            )
    out.print(Text(f"organisation {report.org_name} ({report.org_id})", style="bold"))
    out.print(table)
    if hidden:
        err.print(Text("(categories and fields not shown are unlimited and unused)", style="dim"))


OUTCOME_STYLES = {"success": "green", "failed": "yellow", "denied": "red", "unauthenticated": "red"}


def audit_table(events: list[AuditRead]) -> None:
    table = _table("TIME", "ORG", "USER", "KEY", "ACTION", "RESOURCE", "OUTCOME", "STATUS", "CLIENT")
    for column in table.columns[:4]:
        column.no_wrap = True  # times and ids stay whole; the resource folds
    for event in events:
        table.add_row(
            fmt_time(event.time),
            _cell(event.org_name or event.org_id),  # the name people read; the id where there is no name
            _cell(event.user_name or event.user_id),
            _cell(event.key_id),
            _cell(event.action),
            _cell(event.resource),
            Text(event.outcome, style=OUTCOME_STYLES.get(event.outcome.lower(), "yellow")),
            str(event.status),
            _cell(event.client),
        )
    out.print(table)


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
def byte_progress(
    description: str, total: int | None = None
) -> Iterator[tuple[Callable[[int], None], Callable[[int], None]]]:
    """A byte progress bar with speed on stderr (only drawn on a terminal); yields (set_total, advance)."""
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
        yield (lambda n: progress.update(task, total=n)), (lambda n: progress.advance(task, n))


@contextmanager
def transfer_progress(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """A byte progress bar on stderr (only drawn on a terminal); yields the ``progress(n)`` callback."""
    with byte_progress(description, total) as (_, advance):
        yield advance

"""``kiln usage``: CPU, memory and GPU time held, and its cost, grouped (org admins: their organisation; the
platform admin: any or all). ``kiln prices``: the price table, versioned in time."""

from __future__ import annotations

import sys
from enum import StrEnum
from typing import Annotated

import typer
from rich import box
from rich.table import Table

from kiln.cli.common import connect, emit_json, info, out
from kiln.cli.output import fmt_time
from kiln.cli.parsing import TIME_HINT, parse_time
from kiln.domain.usage import GROUPS, UsageReport, format_hours, format_money

app = typer.Typer(help="The price table (the platform admin sets it).", no_args_is_help=True)


class UsageFormat(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


def _time(value: str | None, flag: str) -> str | None:
    if value is None:
        return None
    try:
        return parse_time(value).isoformat()
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=flag) from None


def _hours(seconds: float) -> str:
    return format_hours(seconds)  # as the console prints them: 0.00167, not 0.00


def _label(key: str | None, name: str | None) -> str:
    return (name or "") if name == key else f"{name} ({key})"


def _bytes(value: int) -> str:
    return "-" if not value else f"{value / 1024**3:,.2f}G"


def usage_table(report: UsageReport) -> None:
    table = Table(box=box.SIMPLE, show_edge=False, pad_edge=False)
    groups = [report.by.upper()] + ([report.split.upper()] if report.split else [])
    if report.by == "job":  # whose each job is
        groups.append("OWNER")
    cost = f"COST ({report.currency})" if report.currency else "COST"
    for column in (*groups, "ATTEMPTS", "CPU-H", "USED CPU-H", "GIB-H", "PEAK MEM", "GPU-H", cost):
        table.add_column(column, justify="left" if column in groups else "right")
    for row in report.rows:
        labels = [_label(row.key, row.name)] + ([_label(row.split, row.split_name)] if report.split else [])
        if report.by == "job":
            labels.append(f"{row.user_name or row.user_id or '-'}@{row.org_name or row.org_id or '-'}")
        table.add_row(
            *labels,
            str(row.attempts),
            _hours(row.cpu_seconds),
            _hours(row.used_cpu_seconds),
            _hours(row.memory_gib_seconds),
            _bytes(row.peak_memory_bytes),
            _hours(row.gpu_seconds),
            format_money(row.cost),
        )
    table.add_row(
        "total", *([""] * (len(groups) - 1)), "", _hours(report.cpu_seconds), _hours(report.used_cpu_seconds),
        _hours(report.memory_gib_seconds), "", _hours(report.gpu_seconds), format_money(report.cost),
    )  # fmt: skip
    out.print(table)
    info(
        f"{fmt_time(report.since)} to {fmt_time(report.until)}" + (f", organisation {report.org}" if report.org else "")
    )


def usage(
    by: Annotated[str, typer.Option("--by", help=f"Group by: {', '.join(GROUPS)}.")] = "user",
    split: Annotated[
        str | None, typer.Option("--split", help="And by a second group (--by day --split user: per user a day).")
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, max=100_000, help="The top rows only.")] = None,
    org: Annotated[str | None, typer.Option("--org", help="An organisation (the platform admin: default all).")] = None,
    since: Annotated[str, typer.Option("--since", help=f"From: {TIME_HINT}.")] = "30d",
    until: Annotated[str | None, typer.Option("--until", help="Until (same forms; default now).")] = None,
    output: Annotated[UsageFormat, typer.Option("--output", "-o", case_sensitive=False)] = UsageFormat.table,
) -> None:
    """CPU, memory and GPU time held (every gang member's, from placement to release) and its cost under the price
    table, grouped; a running job's use so far is counted."""
    for flag, value in (("--by", by), ("--split", split)):
        if value is not None and value not in GROUPS:
            raise typer.BadParameter(f"one of {', '.join(GROUPS)}", param_hint=flag)
    start, end = _time(since, "--since"), _time(until, "--until")
    with connect() as client:
        if output is UsageFormat.csv:
            sys.stdout.write(client.usage_csv(by, org, start, end, split=split, limit=limit))
            return
        report = client.usage(by, org, start, end, split=split, limit=limit)
    if output is UsageFormat.json:
        emit_json(report.model_dump(mode="json"))
    else:
        usage_table(report)


@app.command("list")
def list_prices(output: Annotated[str, typer.Option("--output", "-o")] = "table") -> None:
    """Every price version, oldest first."""
    with connect() as client:
        versions = client.prices()
    if output == "json":
        emit_json([v.model_dump(mode="json") for v in versions])
        return
    if not versions:
        info("no prices: usage costs nothing")
        return
    table = Table(box=box.SIMPLE, show_edge=False, pad_edge=False)
    currency = versions[-1].currency
    for column in ("FROM", "CATEGORY", "RESOURCE", "GPU TYPE", f"PER HOUR ({currency})" if currency else "PER HOUR"):
        table.add_column(column)
    for version in versions:
        for rate in version.rates:
            table.add_row(
                fmt_time(version.effective_from), rate.category, rate.resource, rate.gpu_type, f"{rate.rate:g}"
            )
    out.print(table)


@app.command("set")
def set_prices(
    cpu_hour: Annotated[float | None, typer.Option("--cpu-hour", min=0, help="Per CPU-hour.")] = None,
    memory_gib_hour: Annotated[float | None, typer.Option("--memory-gib-hour", min=0, help="Per GiB-hour.")] = None,
    gpu_hour: Annotated[
        list[str] | None, typer.Option("--gpu-hour", help="RATE, or TYPE=RATE (e.g. H200=3.2); repeatable.")
    ] = None,
    category: Annotated[str | None, typer.Option("--category", help="Only this category's: train, serve, dev.")] = None,
) -> None:
    """A new price version from now on (the platform admin); rates not given are carried over."""
    gpus: dict[str, float] = {}
    for item in gpu_hour or []:
        gpu_type, _, rate = item.rpartition("=")
        try:
            gpus[gpu_type or "*"] = float(rate)
        except ValueError:
            raise typer.BadParameter(f"{item!r}: RATE or TYPE=RATE", param_hint="--gpu-hour") from None
    with connect() as client:
        version = client.set_prices(cpu_hour, memory_gib_hour, gpus, category)
    info(f"prices from {fmt_time(version.effective_from)}: " + ", ".join(
        f"{r.resource}{'' if r.gpu_type == '*' else ':' + r.gpu_type}"
        f"{'' if r.category == '*' else ' (' + r.category + ')'} {r.rate:g}/h"
        for r in version.rates
    ))  # fmt: skip

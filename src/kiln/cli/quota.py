"""``kiln quota``: an organisation's limits and use per category; ``kiln quota set`` (platform admins)."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from kiln.cli.common import EXIT_USAGE, Output, OutputFormat, connect, emit_json, fail, out
from kiln.cli.output import quota_table
from kiln.cli.parsing import parse_quota_limit
from kiln.cli.verbs import OrgOrCommandGroup
from kiln.domain.quantities import format_bytes

if TYPE_CHECKING:
    from kiln.domain.schemas import QuotaReport

app = typer.Typer(
    cls=OrgOrCommandGroup,
    help="Quotas: what an organisation's jobs may hold at once (GPUs, CPUs, memory, count) and store.\n\n"
    "`kiln quota [ORG]` shows the limits and use of ORG (default: your organisation; platform admins may name "
    "any), e.g. `kiln quota acme`; `kiln quota set ORG ...` changes them.",
    invoke_without_command=True,
)


class Category(StrEnum):
    train = "train"
    serve = "serve"
    dev = "dev"
    total = "total"


def _show(report: QuotaReport, output: OutputFormat) -> None:
    if output is OutputFormat.json:
        emit_json(report.model_dump(mode="json"))
    else:
        quota_table(report)
        if report.storage is not None and report.storage.total:
            # What the storage use is made of, the kinds in use only: where to look to free some.
            kinds = report.storage.model_dump()
            parts = [f"{name} {format_bytes(size)}" for name, size in kinds.items() if size]
            out.print(f"storage in use: {', '.join(parts)}")


@app.callback()
def show(
    ctx: typer.Context,
    org: Annotated[
        str | None,
        typer.Option("--org", help="Organisation id or name (default: yours); or name it first: kiln quota ORG."),
    ] = None,
    output: Output = OutputFormat.table,
) -> None:
    """Show the quota of an organisation: per category, each field's use and limit."""
    if ctx.invoked_subcommand is not None:
        return
    with connect() as client:
        report = client.quota(org)
    _show(report, output)


def _limit(help_text: str) -> Any:
    return typer.Option(help=f"{help_text}; 'unlimited' lifts the limit.")


@app.command("set")
def set_quota(
    org: Annotated[str, typer.Argument(help="The organisation's id or name.")],
    category: Annotated[Category, typer.Option(case_sensitive=False, help="What the limits apply to.")] = (
        Category.train
    ),
    gpus: Annotated[str | None, _limit("Whole GPUs")] = None,
    cpus: Annotated[str | None, _limit("CPU cores")] = None,
    memory: Annotated[str | None, _limit("Memory, e.g. 128G")] = None,
    count: Annotated[str | None, _limit("Jobs at once")] = None,
    storage: Annotated[str | None, _limit("Stored outputs, e.g. 1T (category total)")] = None,
    output: Output = OutputFormat.table,
) -> None:
    """Change limits of an organisation (platform admins); limits not given stay as they are."""
    given = {"gpus": gpus, "cpus": cpus, "memory": memory, "count": count, "storage": storage}
    fields: dict[str, int | float | None] = {}
    for field, text in given.items():
        if text is None:
            continue
        try:
            fields[field] = parse_quota_limit(field, text)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint=f"--{field}") from None
    if not fields:
        fail("give at least one of --gpus, --cpus, --memory, --count, --storage", EXIT_USAGE)
    with connect() as client:
        report = client.set_quota(org, category.value, **fields)
    _show(report, output)

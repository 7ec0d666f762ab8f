"""``kiln orgs``: list and show organisations; platform admins create them."""

from __future__ import annotations

from typing import Annotated

import typer

from kiln.cli.common import Output, OutputFormat, connect, emit_json, emit_list, info
from kiln.cli.output import org_detail, orgs_table

app = typer.Typer(help="Organisations (creating one: platform admins).", no_args_is_help=True)

OrgArg = Annotated[str, typer.Argument(help="The organisation's id or name.")]


@app.command()
def create(
    name: Annotated[str, typer.Argument(help="Lowercase letters, digits and '-', at most 63 characters.")],
    output: Output = OutputFormat.table,
) -> None:
    """Create an organisation (platform admins). Add its first user with `kiln users create NAME --org ORG`."""
    with connect() as client:
        org = client.create_org(name)
    if output is OutputFormat.json:
        emit_json(org.model_dump(mode="json"))
    else:
        org_detail(org)
        info(f"add its first admin with: kiln users create NAME --org {org.name} --role admin")


@app.command()
def update(
    org: OrgArg,
    weight: Annotated[
        float | None, typer.Option("--weight", min=0.001, help="Fair-share weight (default 1; 2 = twice the share).")
    ] = None,
    max_priority: Annotated[
        str | None, typer.Option("--max-priority", help="Highest priority its members may use: low, normal, high.")
    ] = None,
    output: Output = OutputFormat.table,
) -> None:
    """Change an organisation's scheduling settings (platform admins)."""
    if weight is None and max_priority is None:
        raise typer.BadParameter("give --weight and/or --max-priority")
    with connect() as client:
        found = client.update_org(org, share_weight=weight, max_priority=max_priority)
    if output is OutputFormat.json:
        emit_json(found.model_dump(mode="json"))
    else:
        org_detail(found)


@app.command("list")
def list_orgs(output: Output = OutputFormat.table) -> None:
    """The organisations you can see (all of them for platform admins)."""
    with connect() as client:
        orgs = client.list_orgs()
    emit_list(orgs, output, orgs_table, "no organisations")


@app.command()
def show(org: OrgArg, output: Output = OutputFormat.table) -> None:
    """One organisation."""
    with connect() as client:
        found = client.get_org(org)
    if output is OutputFormat.json:
        emit_json(found.model_dump(mode="json"))
    else:
        org_detail(found)

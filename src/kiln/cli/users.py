"""``kiln users``: users of an organisation and their roles (organisation admins manage their own)."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer

from kiln.cli.common import Output, OutputFormat, connect, emit_json, emit_list, info
from kiln.cli.output import user_detail, users_table

if TYPE_CHECKING:
    from kiln.domain.schemas import UserRead

app = typer.Typer(
    help="Users and their roles: admin (manages the organisation), member (runs jobs), viewer (reads only).",
    no_args_is_help=True,
)

UserArg = Annotated[str, typer.Argument(help="The user's id or name.")]
OrgOption = Annotated[str | None, typer.Option("--org", help="Organisation id or name (default: yours).")]


class Role(StrEnum):
    admin = "admin"
    member = "member"
    viewer = "viewer"


def _show(user: UserRead, output: OutputFormat) -> None:
    if output is OutputFormat.json:
        emit_json(user.model_dump(mode="json"))
    else:
        user_detail(user)


@app.command()
def create(
    name: Annotated[str, typer.Argument(help="Unique on the platform: lowercase letters, digits and '-'.")],
    org: OrgOption = None,
    role: Annotated[Role, typer.Option(case_sensitive=False, help="What the user may do.")] = Role.member,
    output: Output = OutputFormat.table,
) -> None:
    """Add a user (organisation admins: to their own organisation). Give them a key with `kiln keys create`."""
    with connect() as client:
        user = client.create_user(name, org=org, role=role.value)
    _show(user, output)
    if output is OutputFormat.table:
        info(f"give {user.name} an access key with: kiln keys create --user {user.name}")


@app.command("list")
def list_users(org: OrgOption = None, output: Output = OutputFormat.table) -> None:
    """The users of an organisation."""
    with connect() as client:
        users = client.list_users(org)
    emit_list(users, output, users_table, "no users")


@app.command()
def show(user: UserArg, output: Output = OutputFormat.table) -> None:
    """One user."""
    with connect() as client:
        found = client.get_user(user)
    _show(found, output)


@app.command()
def disable(user: UserArg, output: Output = OutputFormat.table) -> None:
    """Disable a user: none of their keys work until they are enabled again."""
    with connect() as client:
        found = client.disable_user(user)
    _show(found, output)


@app.command()
def enable(user: UserArg, output: Output = OutputFormat.table) -> None:
    """Enable a disabled user again."""
    with connect() as client:
        found = client.enable_user(user)
    _show(found, output)

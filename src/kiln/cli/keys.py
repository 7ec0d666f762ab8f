"""``kiln keys``: access keys. A key's secret is shown once, when the key is created."""

from __future__ import annotations

import shlex
import sys
from enum import StrEnum
from typing import Annotated

import typer
from rich.text import Text

from kiln.cli.common import Output, OutputFormat, connect, emit_json, emit_list, info
from kiln.cli.output import key_created_detail, key_detail, keys_table
from kiln.cli.parsing import parse_expiry

app = typer.Typer(help="Access keys (yours; organisation admins: their users' too).", no_args_is_help=True)

KeyArg = Annotated[str, typer.Argument(help="The access key id.")]
UserOption = Annotated[str | None, typer.Option("--user", help="User id or name (default: you).")]


class KeyOutput(StrEnum):
    table = "table"
    json = "json"
    env = "env"


SECRET_WARNING = "this is the only time the secret key is shown: Kiln cannot show it again. Store it now."


def env_lines(endpoint: str, access_key: str, secret_key: str) -> str:
    """Shell-sourceable lines in the format of admin.env (`set -a; . FILE; set +a`)."""
    pairs = (("KILN_ENDPOINT", endpoint), ("KILN_ACCESS_KEY", access_key), ("KILN_SECRET_KEY", secret_key))
    return "".join(f"{name}={shlex.quote(value)}\n" for name, value in pairs)


@app.command()
def create(
    user: UserOption = None,
    expires: Annotated[
        str | None,
        typer.Option(help="When the key stops working: a duration from now (30d, 12h) or an ISO-8601 time."),
    ] = None,
    description: Annotated[str, typer.Option(help="What the key is for.")] = "",
    output: Annotated[
        KeyOutput,
        typer.Option(
            "--output",
            "-o",
            case_sensitive=False,
            help="A table, JSON, or env: KILN_ENDPOINT/KILN_ACCESS_KEY/KILN_SECRET_KEY lines to source.",
        ),
    ] = KeyOutput.table,
) -> None:
    """Create an access key and print its secret, once."""
    expires_in = expires_at = None
    if expires is not None:
        try:
            expires_in, expires_at = parse_expiry(expires)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--expires") from None
    with connect() as client:
        key = client.create_key(user, expires_in=expires_in, expires_at=expires_at, description=description)
        endpoint = client.endpoint
    if output is KeyOutput.json:
        emit_json({**key.model_dump(mode="json"), "endpoint": endpoint})
    elif output is KeyOutput.env:
        sys.stdout.write(env_lines(endpoint, key.id, key.secret_key))
        sys.stdout.flush()
    else:
        key_created_detail(key, endpoint)
    info(Text("warning: ", style="bold yellow") + Text(SECRET_WARNING))
    if output is KeyOutput.table:
        info(f"use it elsewhere with: kiln login --endpoint {endpoint} --access-key {key.id}")


@app.command("list")
def list_keys(user: UserOption = None, output: Output = OutputFormat.table) -> None:
    """Access keys of a user (never their secrets)."""
    with connect() as client:
        keys = client.list_keys(user)
    emit_list(keys, output, keys_table, "no access keys")


@app.command()
def disable(key: KeyArg, output: Output = OutputFormat.table) -> None:
    """Disable a key: requests signed with it fail from now on."""
    with connect() as client:
        found = client.disable_key(key)
    if output is OutputFormat.json:
        emit_json(found.model_dump(mode="json"))
    else:
        key_detail(found)


@app.command()
def delete(key: KeyArg) -> None:
    """Delete a key for good."""
    with connect() as client:
        client.delete_key(key)
    info(f"deleted access key {key}")

"""``kiln login`` and ``kiln whoami``."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from kiln.cli.common import EXIT_USAGE, Output, OutputFormat, connect, emit_json, fail, info
from kiln.cli.output import display_path, whoami_detail


def login(
    endpoint: Annotated[str | None, typer.Option(help="Server URL, e.g. http://127.0.0.1:8080.")] = None,
    access_key: Annotated[str | None, typer.Option(help="Access key id.")] = None,
    secret_key: Annotated[str | None, typer.Option(help="Secret key (prompted for, hidden, when left out).")] = None,
) -> None:
    """Check credentials against the server and save them (mode 0600) for later commands."""
    from kiln.sdk.client import Client
    from kiln.sdk.config import read_config_file, write_config_file
    from kiln.settings import ClientSettings

    settings = ClientSettings()
    saved = read_config_file(settings.config)
    if not endpoint:
        default = settings.endpoint or saved.get("KILN_ENDPOINT") or "http://127.0.0.1:8080"
        endpoint = typer.prompt("Endpoint", default=default)
    if not access_key:
        access_key = typer.prompt("Access key", default=settings.access_key or saved.get("KILN_ACCESS_KEY"))
    if not secret_key:
        # Piped (`pass kiln/secret | kiln login ...`): read one line, without a prompt or an echo warning.
        interactive = sys.stdin.isatty()
        secret_key = typer.prompt("Secret key", hide_input=True) if interactive else sys.stdin.readline().strip()
    if not secret_key.strip():
        fail("no secret key given", EXIT_USAGE)
    endpoint = endpoint.strip().rstrip("/")
    with Client(endpoint, access_key.strip(), secret_key.strip(), settings=settings) as client:
        me = client.whoami()
    write_config_file(settings.config, endpoint, access_key.strip(), secret_key.strip())
    admin = ", platform admin" if me.platform_admin else ""
    info(f"logged in to {endpoint} as {me.user_name} (organisation {me.org_name}{admin})")
    info(f"credentials saved to {display_path(settings.config)}")


def whoami(output: Output = OutputFormat.table) -> None:
    """Who the current credentials belong to."""
    with connect() as client:
        me = client.whoami()
        endpoint = client.endpoint
    if output is OutputFormat.json:
        emit_json({**me.model_dump(mode="json"), "endpoint": endpoint})
    else:
        whoami_detail(me, endpoint)

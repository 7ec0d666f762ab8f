"""``kiln runtimes``: the catalog of managed runtimes, and installing one ahead of first use."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from kiln.cli.common import Output, OutputFormat, connect, emit_json, err, fail, info
from kiln.cli.output import runtimes_table

app = typer.Typer(help="The runtime catalog (managed Python environments).", no_args_is_help=True)


@app.command("list")
def list_runtimes(output: Output = OutputFormat.table) -> None:
    """Every catalog runtime and whether it is installed on the server."""
    with connect() as client:
        items = client.runtimes()
    if output is OutputFormat.json:
        emit_json([rt.model_dump(mode="json") for rt in items])
    else:
        runtimes_table(items)


@app.command()
def install(
    framework: Annotated[str, typer.Argument(help="e.g. pytorch, sklearn, python.")],
    version: Annotated[str | None, typer.Option("--version", "-v", help="Default: the catalog's default.")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the build has finished.")] = False,
    output: Output = OutputFormat.table,
) -> None:
    """Build a runtime on the server ahead of its first use (platform admins only)."""
    with connect() as client:
        runtime = client.install_runtime(framework, version)
        if wait and runtime.status == "installing":
            with err.status(f"building {runtime.name} ..."):
                while runtime.status == "installing":
                    time.sleep(2)
                    runtime = next((r for r in client.runtimes() if r.name == runtime.name), runtime)
    if output is OutputFormat.json:
        emit_json(runtime.model_dump(mode="json"))
    elif runtime.status == "failed":
        fail(f"runtime {runtime.name} failed to build: {runtime.message or 'see the server log'}")
    elif runtime.status == "installing":
        info(f"building runtime {runtime.name}; check with `kiln runtimes list`")
    else:
        info(f"runtime {runtime.name}: {runtime.status}")

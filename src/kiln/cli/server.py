"""``kiln server``: run the API server, scheduler and local executor in this process."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kiln.cli.common import EXIT_USAGE, fail

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def server(
    host: Annotated[str | None, typer.Option(help="Address to bind (default: $KILN_HOST, else 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port to bind (default: $KILN_PORT, else 8080).")] = None,
    home: Annotated[Path | None, typer.Option(help="State directory (default: $KILN_HOME, else ~/.kiln).")] = None,
    log_level: Annotated[
        str | None, typer.Option(help="critical, error, warning, info or debug (default: info; debug with --debug).")
    ] = None,
    debug: Annotated[
        bool, typer.Option("--debug", help="Log at debug level, and print the traceback of an error at start.")
    ] = False,
) -> None:
    """Start the Kiln server (settings from KILN_* environment variables; these options override them).

    A server that cannot start says why in one line (`error: ...`) and exits 1, or 2 for invalid settings."""
    from pydantic import ValidationError

    from kiln.api.startup import StartupError, settings_problems
    from kiln.settings import Settings

    level = (log_level or ("debug" if debug else "info")).lower()
    if level not in LOG_LEVELS:
        raise typer.BadParameter(f"must be one of {', '.join(LOG_LEVELS)}", param_hint="--log-level")
    overrides = {"host": host, "port": port, "home": str(home) if home is not None else None}
    try:
        settings = Settings(**{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]
    except ValidationError as exc:
        fail(f"invalid settings: {settings_problems(exc)}", EXIT_USAGE)

    from kiln.api.serve import serve  # heavy (uvicorn, the app): only here

    try:
        serve(settings, level.upper(), debug=debug)
    except StartupError as exc:
        fail(exc.message, exc.exit_code)

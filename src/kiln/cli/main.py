"""The ``kiln`` command: the Typer app and ``main()`` (the console script and ``python -m kiln``).

Exit codes: 0 success; 1 an error (``error: ...`` on stderr, no traceback) or a followed job that failed;
2 invalid usage or an invalid job spec; 130 interrupted, or a followed job that was cancelled.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from kiln import __version__
from kiln.cli import audit, auth, data, jobs, keys, logs, metrics, orgs, quota, render, run, runtimes, server, users
from kiln.cli.common import EXIT_ERROR, EXIT_INTERRUPTED, print_error
from kiln.errors import Forbidden, KilnError

app = typer.Typer(
    name="kiln",
    help="Kiln: a self-hosted deep-learning platform.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # never print credentials held in local variables
)


def _version(value: bool) -> None:
    if value:
        print(f"kiln {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Kiln: a self-hosted deep-learning platform."""


app.command(help=run.RUN_HELP, context_settings={"allow_interspersed_args": False})(run.run)
app.command()(logs.logs)
app.command()(metrics.metrics)
app.add_typer(jobs.app, name="jobs")
jobs.app.command("render")(render.render)
app.add_typer(runtimes.app, name="runtimes")
app.add_typer(data.app, name="data")
app.command()(auth.login)
app.command()(auth.whoami)
app.add_typer(orgs.app, name="orgs")
app.add_typer(users.app, name="users")
app.add_typer(keys.app, name="keys")
app.add_typer(quota.app, name="quota")
app.command()(audit.audit)
app.command()(server.server)


def main() -> None:
    try:
        app()
    except KilnError as exc:
        message = exc.message or exc.code
        if isinstance(exc, Forbidden) and "forbidden" not in message.lower():
            message = f"forbidden: {message}"  # say plainly that it is a matter of permissions
        print_error(message)
        sys.exit(EXIT_ERROR)
    except OSError as exc:  # e.g. a download destination or the config file that cannot be written
        print_error(str(exc))
        sys.exit(EXIT_ERROR)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()

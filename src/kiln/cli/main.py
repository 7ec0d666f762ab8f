"""The ``kiln`` command: the Typer app and ``main()`` (the console script and ``python -m kiln``).

Exit codes: 0 success; 1 an error (``error: ...`` on stderr, no traceback) or a followed job that failed;
2 invalid usage or an invalid job spec; 130 interrupted, or a followed job that was cancelled.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer

from kiln.cli.common import EXIT_ERROR, EXIT_INTERRUPTED, print_error
from kiln.cli.verbs import tidy
from kiln.errors import Forbidden, KilnError


def _version(value: bool) -> None:
    if value:
        from kiln.version import full_version

        print(f"kiln {full_version()}")
        raise typer.Exit()


def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Kiln: a self-hosted deep-learning platform."""


def _function(module: str, name: str, help_from: str | None = None, **settings: Any) -> Callable[[typer.Typer], None]:
    def register(app: typer.Typer) -> None:
        mod = importlib.import_module(f"kiln.cli.{module}")
        extra = {"help": getattr(mod, help_from)} if help_from else {}
        app.command(**settings, **extra)(getattr(mod, name))

    return register


def _group(module: str) -> Callable[[typer.Typer], None]:
    def register(app: typer.Typer) -> None:
        group: typer.Typer = importlib.import_module(f"kiln.cli.{module}").app
        if module == "jobs" and not any(c.name == "render" for c in group.registered_commands):
            group.command("render")(importlib.import_module("kiln.cli.render").render)
        app.add_typer(group, name=module)

    return register


def _group_of(module: str, name: str) -> Callable[[typer.Typer], None]:
    """The Typer group ``app`` of ``module``, under ``name``."""

    def register(app: typer.Typer) -> None:
        app.add_typer(importlib.import_module(f"kiln.cli.{module}").app, name=name)

    return register


# Every command, in the order help lists them, and how to add it: only the module of the command a command line
# names is imported (a CLI start-up of ~0.2 s instead of ~0.35 s), every one for the root's help or an unknown name.
COMMANDS: dict[str, Callable[[typer.Typer], None]] = {
    "run": _function("run", "run", help_from="RUN_HELP", context_settings={"allow_interspersed_args": False}),
    "logs": _function("logs", "logs"),
    "metrics": _function("metrics", "metrics"),
    "tune": _function("tune", "tune", help_from="TUNE_HELP"),
    "serve": _function("services", "serve"),
    "predict": _function("services", "predict"),
    "jobs": _group("jobs"),
    "runs": _group("runs"),
    "experiments": _group("experiments"),
    "studies": _group("studies"),
    "pipelines": _group("pipelines"),
    "services": _group("services"),
    "notebooks": _group("notebooks"),
    "tensorboard": _function("tensorboard", "tensorboard"),
    "runtimes": _group("runtimes"),
    "data": _group("data"),
    "models": _group("models"),
    "login": _function("auth", "login"),
    "whoami": _function("auth", "whoami"),
    "orgs": _group("orgs"),
    "users": _group("users"),
    "keys": _group("keys"),
    "quota": _group("quota"),
    "audit": _function("audit", "audit"),
    "usage": _function("usage", "usage"),
    "prices": _group_of("usage", "prices"),
    "budgets": _group("budgets"),
    "notify": _group("notify"),
    "server": _function("server", "server"),
    "admin": _group("admin"),
}


def build_app(only: str | None = None) -> typer.Typer:
    """The ``kiln`` Typer app, with every command or only ``only`` (a name in COMMANDS)."""
    app = typer.Typer(
        name="kiln",
        help="Kiln: a self-hosted deep-learning platform.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_show_locals=False,  # never print credentials held in local variables
    )
    app.callback()(_root)
    for name, register in COMMANDS.items():
        if only is None or name == only:
            register(app)
    tidy(app)  # `list` and `ls` in every collection; help text rewrapped into paragraphs
    return app


def _named(argv: list[str]) -> str | None:
    """The command a command line names, when it is one of COMMANDS (the root takes no option with a value)."""
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    return first if first in COMMANDS else None


def __getattr__(name: str) -> Any:
    if name == "app":  # the whole app, for tools and tests that import it
        return build_app()
    raise AttributeError(name)


def _one_line(exc: ValueError) -> str:
    """A ValueError as one line: a pydantic ValidationError as ``field: message`` for each field."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        problems = [
            f"{'.'.join(str(p) for p in error['loc']) or 'value'}: {str(error['msg']).removeprefix('Value error, ')}"
            for error in exc.errors()
        ]
        return "; ".join(problems)
    return " ".join(str(exc).split())


def main() -> None:
    try:
        build_app(_named(sys.argv[1:]))()
    except KilnError as exc:
        message = exc.message or exc.code
        if isinstance(exc, Forbidden) and "forbidden" not in message.lower():
            message = f"forbidden: {message}"  # say plainly that it is a matter of permissions
        print_error(message)
        sys.exit(EXIT_ERROR)
    except OSError as exc:  # e.g. a download destination or the config file that cannot be written
        print_error(str(exc))
        sys.exit(EXIT_ERROR)
    except ValueError as exc:  # an argument the SDK refused before sending anything (an empty id, say)
        print_error(_one_line(exc))
        sys.exit(EXIT_ERROR)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()

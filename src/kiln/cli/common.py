"""What every command shares: the two consoles, the client, the ``--output`` option and error exits."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from kiln.errors import KilnError

if TYPE_CHECKING:
    from kiln.sdk.client import Client

# Exit codes: 0 success, 1 error (or the job failed), 2 invalid usage, 130 interrupted / job cancelled.
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def _console(stderr: bool) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    # Piped output: do not wrap tables at 80 columns (keeps one row per line for grep/awk).
    wide = not stream.isatty() and "COLUMNS" not in os.environ
    return Console(stderr=stderr, width=200 if wide else None, highlight=False)


out = _console(stderr=False)
err = _console(stderr=True)


class OutputFormat(StrEnum):
    table = "table"
    json = "json"


Output = Annotated[
    OutputFormat,
    typer.Option("--output", "-o", case_sensitive=False, help="Print a table, or JSON for scripts."),
]


def print_error(message: str) -> None:
    err.print(Text("error: ", style="bold red") + Text(message), soft_wrap=True)


def fail(message: str, code: int = EXIT_ERROR) -> NoReturn:
    print_error(message)
    raise typer.Exit(code)


def info(message: str | Text) -> None:
    """A human message on stderr (stdout stays for data)."""
    err.print(message if isinstance(message, Text) else Text(message), soft_wrap=True)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
    sys.stdout.flush()


def emit_list(items: Sequence[Any], output: OutputFormat, table: Callable[[Any], None], empty: str) -> None:
    """A read command's list: JSON, a note when there is nothing, or the table."""
    if output is OutputFormat.json:
        emit_json([item.model_dump(mode="json") for item in items])
    elif not items:
        info(empty)
    else:
        table(items)


@contextmanager
def connect() -> Iterator[Client]:
    """A client from the environment / ``kiln login``'s file; lost connections become KilnErrors."""
    import httpx

    from kiln.sdk.client import Client

    with Client() as client:
        try:
            yield client
        except httpx.TransportError as exc:
            raise KilnError(f"connection to Kiln at {client.endpoint} failed: {exc}") from exc

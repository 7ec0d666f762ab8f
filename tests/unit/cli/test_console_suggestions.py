"""Every `kiln …` command the web console suggests (an empty page's hint: "`kiln data put LOCAL_PATH NAME` uploads
one") is a command the CLI has, with the options and as many arguments as it is shown with. The Datasets page
suggested `kiln datasets put NAME DIR`, which does not exist."""

from __future__ import annotations

import re
import shlex
from typing import Any

import typer.main

from kiln.cli.main import app
from tests.browser import REPO

SUGGESTION = re.compile(r"`(kiln [^`]+)`")


def _suggestions() -> list[tuple[str, str]]:
    found = []
    for page in sorted((REPO / "console" / "src").rglob("*.tsx")):
        found += [(page.name, text) for text in SUGGESTION.findall(page.read_text())]
    return found


def test_the_console_names_commands_the_cli_has() -> None:
    suggestions = _suggestions()
    assert len(suggestions) >= 10, suggestions  # the scan finds the hints
    root = typer.main.get_command(app)
    wrong = []
    for page, text in suggestions:
        words = shlex.split(text)[1:]
        command: Any = root  # Typer's own click (typer._click): looked at by what it has, not its classes
        while hasattr(command, "commands") and words and not words[0].startswith("-"):
            sub = command.commands.get(words[0])
            if sub is None:
                break
            command, words = sub, words[1:]
        if hasattr(command, "commands"):
            wrong.append((page, text, "no such command"))
            continue
        opts = [p for p in command.params if p.param_type_name == "option"]
        options = {name for p in opts for name in p.opts + p.secondary_opts}
        flags = {name for p in opts if p.is_flag for name in p.opts}
        arguments = [p for p in command.params if p.param_type_name == "argument"]
        positional, i = 0, 0
        while i < len(words):
            word = words[i]
            if word.startswith("-"):
                if word.split("=")[0] not in options:
                    wrong.append((page, text, f"no option {word}"))
                i += 1 if (word in flags or "=" in word) else 2
            else:
                positional += 1
                i += 1
        if positional > len(arguments) and not any(a.nargs == -1 for a in arguments):
            wrong.append((page, text, f"{positional} arguments, the command takes {len(arguments)}"))
    assert not wrong, wrong

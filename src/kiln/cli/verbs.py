"""How every command group reads, applied once to the whole Typer tree by ``kiln.cli.main.build_app``.

- A collection's listing command answers to ``list`` (shown in help) and ``ls`` (a hidden alias), like
  ``docker container ls`` / ``gh repo list``: a new group gets both by naming either.
- Help text is rewrapped into paragraphs. Typer's rich help keeps a docstring's single line breaks, so a
  docstring wrapped at 120 columns in the source showed broken lines at any terminal width; a paragraph now flows
  to the terminal's width. Paragraphs that start with ``\\b`` or hold indented or bulleted lines stay as written.
- ``OrgOrCommandGroup``: a group whose first word is either one of its commands or an organisation
  (``kiln quota acme`` beside ``kiln quota set acme ...``).
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import typer
from typer.core import TyperGroup, TyperOption
from typer.models import DefaultPlaceholder

LIST, LS = "list", "ls"
ALIAS_NOTE = f"Alias: {LS}."


def reflow(text: str) -> str:
    """``text`` with each paragraph on one line; verbatim paragraphs (``\\b``, indented or bulleted lines) kept."""
    text, formfeed, rest = inspect.cleandoc(text).partition("\f")
    paragraphs = []
    for paragraph in text.split("\n\n"):
        lines = paragraph.split("\n")
        if paragraph.startswith("\b") or any(line.startswith((" ", "\t", "- ", "* ", "• ")) for line in lines[1:]):
            paragraphs.append(paragraph)
        else:
            paragraphs.append(" ".join(line.strip() for line in lines if line.strip()))
    return "\n\n".join(p for p in paragraphs if p) + formfeed + rest


def _help_of(explicit: Any, callback: Any) -> str | None:
    if isinstance(explicit, str):
        return explicit
    if isinstance(explicit, DefaultPlaceholder) and isinstance(explicit.value, str):
        return explicit.value
    doc = inspect.getdoc(callback) if callback is not None else None
    return doc or None


def add_list_alias(group: typer.Typer) -> None:
    """Give ``group``'s listing command both names, ``list`` and a hidden ``ls``; nothing when it has none."""
    commands = group.registered_commands
    names = {c.name for c in commands}
    listing = next((c for c in commands if c.name == LIST), None) or next((c for c in commands if c.name == LS), None)
    if listing is None or {LIST, LS} <= names:
        return
    listing.name = LIST
    text = _help_of(listing.help, listing.callback) or ""
    if ALIAS_NOTE not in text:
        listing.help = f"{text}\n\n{ALIAS_NOTE}" if text else ALIAS_NOTE
    alias = copy.copy(listing)
    alias.name, alias.hidden = LS, True
    commands.append(alias)


def tidy(app: typer.Typer) -> None:
    """Apply this module's rules to ``app`` and every group below it (idempotent: build_app may run again)."""
    for command in app.registered_commands:
        text = _help_of(command.help, command.callback)
        if text is not None:
            command.help = reflow(text)
    for info in app.registered_groups:
        sub = info.typer_instance
        if sub is None:
            continue
        add_list_alias(sub)
        tidy(sub)
        callback = sub.registered_callback.callback if sub.registered_callback else None
        text = _help_of(info.help, None) or _help_of(sub.info.help, callback)
        if text is not None:
            info.help = reflow(text)
    if isinstance(app.info.help, str):
        app.info.help = reflow(app.info.help)


class OrgOrCommandGroup(TyperGroup):
    """A group that runs a subcommand, or, when its first word is none of them, takes that word as ``--org``
    (``kiln quota acme`` = ``kiln quota --org acme``). A first word followed by more words is left alone, so a
    mistyped command (``kiln quota sett acme``) still reads "No such command"."""

    ORG_OPTION = "--org"

    def _value_options(self) -> set[str]:
        return {
            name
            for param in self.params
            if isinstance(param, TyperOption) and not param.is_flag and not param.count
            for name in (*param.opts, *param.secondary_opts)
        }

    def _positionals(self, args: list[str], value_options: set[str]) -> list[int]:
        """Indexes of the words in ``args`` that are neither options nor option values (up to ``--``)."""
        found: list[int] = []
        skip = False
        for index, arg in enumerate(args):
            if skip:
                skip = False
            elif arg == "--":
                found.extend(range(index + 1, len(args)))
                break
            elif arg.startswith("-") and arg != "-":
                skip = arg in value_options
            else:
                found.append(index)
        return found

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # a (vendored) click Context
        value_options = self._value_options()
        words = self._positionals(args, value_options)
        first = words[0] if len(words) == 1 and self.ORG_OPTION in value_options else None
        if first is not None and "--" not in args[:first] and args[first] not in self.commands:
            if any(arg == self.ORG_OPTION or arg.startswith(self.ORG_OPTION + "=") for arg in args):
                message = f"name the organisation once: {args[first]} or {self.ORG_OPTION}, not both"
                raise typer.BadParameter(message, ctx=ctx, param_hint="ORG")
            args = [*args[:first], self.ORG_OPTION, args[first], *args[first + 1 :]]
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return ["[OPTIONS]", "[ORG]", "|", "COMMAND", "[ARGS]..."]

"""Every collection answers to ``list`` and ``ls``; help text flows in paragraphs at any terminal width; ``kiln quota
ORG`` beside ``kiln quota set``."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

import pytest
import typer.main
from typer.core import TyperGroup
from typer.testing import CliRunner

from kiln.cli.main import build_app
from kiln.cli.verbs import reflow

WIDTH = 200
BORDER = "│┃║"
# A line that ends inside a sentence: a lower-case word (with a comma or semicolon at most) at its end.
OPEN_END = re.compile(r"[a-z][a-z,;]*$")


def walk(group: TyperGroup, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], object]]:
    """(command path, command) of every command and group below ``group``, hidden ones included."""
    for name, command in group.commands.items():
        yield (*path, name), command
        if isinstance(command, TyperGroup):
            yield from walk(command, (*path, name))


@pytest.fixture(scope="module")
def root() -> TyperGroup:
    command = typer.main.get_command(build_app())
    assert isinstance(command, TyperGroup)
    return command


def test_every_collection_answers_to_list_and_ls(root: TyperGroup) -> None:
    groups = [(path, cmd) for path, cmd in walk(root) if isinstance(cmd, TyperGroup)]
    listing = {path for path, cmd in groups if {"list", "ls"} & set(cmd.commands)}
    assert {("jobs",), ("data",), ("runtimes",), ("orgs",), ("users",), ("keys",)} <= listing
    for path, group in groups:
        if path not in listing:
            continue
        commands = group.commands
        assert {"list", "ls"} <= set(commands), f"kiln {' '.join(path)}: {sorted(commands)}"
        same = [getattr(commands[verb].callback, "__wrapped__", None) for verb in ("list", "ls")]
        assert same[0] is not None and same[0] is same[1], path
        assert not commands["list"].hidden and commands["ls"].hidden, path  # help shows one name


def test_data_ls_and_list_are_one_command_and_help_names_the_alias() -> None:
    runner = CliRunner()
    for verb in ("list", "ls"):
        result = runner.invoke(build_app(), ["data", verb, "--help"], env={"COLUMNS": str(WIDTH)})
        assert result.exit_code == 0, result.output
        assert "List the organisation's datasets, or the versions of NAME." in result.output
        assert "Alias: ls." in result.output
    listed = runner.invoke(build_app(), ["data", "--help"], env={"COLUMNS": str(WIDTH)}).output
    assert re.search(r"│ list +List the organisation's datasets", listed) and not re.search(r"│ ls ", listed)


def _cells(line: str) -> tuple[int, str, int]:
    """(column where the text starts, the text, column its cell ends) of one rendered help line."""
    right = len(line.rstrip())
    end = right - 2 if right and line.rstrip()[-1] in BORDER else WIDTH - 1  # "text │": the border and padding
    body = line[:end].rstrip()
    body_start = len(body) - len(body.lstrip(" " + BORDER))
    return body_start, body.strip(" " + BORDER), end


def broken_lines(text: str) -> list[str]:
    """Pairs of lines where a sentence goes on to the next line although its next word would have fitted: a hard
    line break of the source, not the terminal's wrapping."""
    lines = text.splitlines()
    found = []
    for upper, lower in itertools.pairwise(lines):
        start, words, end = _cells(upper)
        next_start, next_words, _ = _cells(lower)
        if not words or not next_words or not OPEN_END.search(words) or not next_words[0].islower():
            continue
        if next_start < start:  # a new row of a table, not the same cell going on
            continue
        first = next_words.split()[0]
        if len(upper[:end].rstrip()) + 1 + len(first) <= end:
            found.append(f"{upper.rstrip()}\n{lower.rstrip()}")
    return found


def test_the_checker_finds_a_hard_break_and_passes_wrapping() -> None:
    wrapped = "x" * (WIDTH - 6) + " and\n more text."
    assert broken_lines(wrapped) == []
    assert broken_lines(" Upload the files; run the\n same command again.") != []


@pytest.mark.heavy  # every command's help rendered: make test-fast leaves it out
def test_every_help_text_flows_at_a_wide_terminal(root: TyperGroup) -> None:
    runner = CliRunner()
    app = build_app()
    problems = []
    paths = [(), *(path for path, command in walk(root) if not getattr(command, "hidden", False))]
    for path in paths:
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH)})
        assert result.exit_code == 0, (path, result.output)
        problems += [f"kiln {' '.join(path)} --help:\n{pair}" for pair in broken_lines(result.output)]
    assert len(paths) > 30
    assert not problems, "\n\n".join(problems)


def test_reflow_joins_lines_of_a_paragraph_and_keeps_verbatim_ones() -> None:
    text = """Upload a file. Only blobs the server lacks are
    sent, in parts.

    Examples:
      kiln data put ./x mnist
      kiln data get mnist@2 out

    \b
    kept
    as is"""
    assert reflow(text) == (
        "Upload a file. Only blobs the server lacks are sent, in parts.\n\n"
        "Examples:\n  kiln data put ./x mnist\n  kiln data get mnist@2 out\n\n\b\nkept\nas is"
    )
    assert reflow(reflow(text)) == reflow(text)


def test_quota_takes_an_organisation_as_its_first_word(monkeypatch: pytest.MonkeyPatch) -> None:
    """``kiln quota ORG`` is ``kiln quota --org ORG``; subcommands and typos of them stay what they were."""
    seen: list[object] = []

    class Recorder:
        def __enter__(self) -> Recorder:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def quota(self, org: str | None) -> None:
            seen.append(org)
            raise typer.Exit(0)

    monkeypatch.setattr("kiln.cli.quota.connect", Recorder)
    runner = CliRunner()
    for argv, org in (
        (["quota"], None),
        (["quota", "acme"], "acme"),
        (["quota", "acme", "-o", "json"], "acme"),
        (["quota", "-o", "json", "acme"], "acme"),
        (["quota", "--org", "acme"], "acme"),
    ):
        seen.clear()
        result = runner.invoke(build_app(), argv)
        assert (result.exit_code, seen) == (0, [org]), (argv, result.output)
    usage = runner.invoke(build_app(), ["quota", "--help"], env={"COLUMNS": str(WIDTH)}).output
    assert "kiln quota [OPTIONS] [ORG] | COMMAND [ARGS]..." in usage
    typo = runner.invoke(build_app(), ["quota", "sett", "acme", "--gpus", "1"])
    assert typo.exit_code == 2 and "No such command 'sett'" in typo.output
    twice = runner.invoke(build_app(), ["quota", "acme", "--org", "other"])
    assert twice.exit_code == 2 and "name the organisation once" in twice.output
    missing = runner.invoke(build_app(), ["quota", "set", "acme"])  # still the subcommand, still checked
    assert missing.exit_code == 2


def test_bracketed_text_in_option_help_is_shown(root: TyperGroup) -> None:
    """``[default: ...]`` in an option's help is rich markup to the help renderer, which drops it as an unknown tag
    (`kiln admin recover-key --help` lost where its defaults come from)."""
    runner = CliRunner()
    app = build_app()
    problems = []
    for path, command in walk(root):
        for param in getattr(command, "params", []):
            for bracketed in re.findall(r"\[[^\]]+\]", getattr(param, "help", None) or ""):
                result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH)})
                if bracketed not in " ".join(result.output.split()):
                    problems.append(f"kiln {' '.join(path)} {param.name}: {bracketed}")
    assert not problems, problems

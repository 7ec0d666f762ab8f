"""The benchmarks' READMEs document every option of every script, as the script's parser has it (issue 49).

Each script with an argparse parser has, in a README under ``benchmarks/``, a table of its options after the
marker ``<!-- options: NAME.py -->``: one row per option, its first cell naming the option (```--jobs N```), its
second the default as ``default_cell`` writes it (``-``: none, or a flag), as on a machine where no ``KILN_*``
variable is set (``failover.py``'s ``--postgres`` reads one). The parsers are read in one subprocess that runs
each script as ``__main__`` until it parses its arguments (``parse_args`` stops it there), so a script must not do
heavy work or imports before that: all of them together are read in a few seconds. ``--help`` and ``--smoke``
(every script's, added by ``report.parse_args``; the README's introduction says so) are not in the tables.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
MARKER = re.compile(r"^<!-- options: (\S+\.py) -->$")
OPTION = re.compile(r"`(--[\w-]+)")
UNTABLED = {"--help", "--smoke"}

# Runs each script given as __main__ until its parser's parse_args, and prints {script: {option: default}}.
_READ_PARSERS = """
import argparse, contextlib, io, json, runpy, sys
class Parsed(Exception):
    pass
def stop(self, *args, **kwargs):
    raise Parsed(self)
argparse.ArgumentParser.parse_args = stop
argparse.ArgumentParser.parse_known_args = stop
sys.path[:0] = ["benchmarks", "."]
found = {}
for path in sys.argv[1:]:
    sys.argv = [path]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(path, run_name="__main__")
    except Parsed as parsed:
        found[path.rsplit("/", 1)[-1]] = {
            max(a.option_strings, key=len): None if a.nargs == 0 else a.default  # a flag: no default
            for a in parsed.args[0]._actions
            if a.option_strings
        }
print(json.dumps(found, default=str))
"""


def default_cell(value: Any) -> str:
    """How a table writes an option's default: ``-`` for none (None, a flag's False, an empty list), a list's
    items space-separated, a float without a trailing ``.0``."""
    if value is None or value is False or value == [] or value == "":
        return "-"
    if isinstance(value, (list, tuple)):
        return " ".join(default_cell(v) for v in value)
    if isinstance(value, float):
        text = repr(value)
        return text[:-2] if text.endswith(".0") else text
    return str(value)


def scripts_with_parsers() -> list[Path]:
    return sorted(p for p in BENCHMARKS.glob("*.py") if "ArgumentParser(" in p.read_text())


@cache
def parsers() -> dict[str, dict[str, str]]:
    """{script: {option: its default as the table writes it}}, read from the scripts' own parsers."""
    paths = [str(p.relative_to(REPO)) for p in scripts_with_parsers()]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}  # the defaults where none is set
    done = subprocess.run(
        [sys.executable, "-c", _READ_PARSERS, *paths], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, dict[str, Any]] = json.loads(done.stdout)
    return {name: {k: default_cell(v) for k, v in opts.items() if k not in UNTABLED} for name, opts in found.items()}


def documented(text: str) -> dict[str, dict[str, str]]:
    """{script: {option: documented default}} from the tables after each ``<!-- options: NAME.py -->``."""
    tables: dict[str, dict[str, str]] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        marker = MARKER.match(line.strip())
        if marker is None:
            continue
        name = marker.group(1)
        assert name not in tables, f"two option tables of {name}"
        rows = tables[name] = {}
        for row in lines[i + 1 :]:
            if not row.startswith("|"):
                if rows or row.strip():
                    break
                continue
            cells = [c.strip() for c in row.strip().strip("|").split("|")]
            option = OPTION.search(cells[0])
            if option is None:
                continue  # the header and its rule
            assert len(cells) >= 2, f"{name}: the row of {option.group(1)} has no default cell"
            rows[option.group(1)] = cells[1].replace("`", "").strip()
    return tables


def all_documented() -> dict[str, dict[str, str]]:
    tables: dict[str, dict[str, str]] = {}
    for readme in sorted(BENCHMARKS.rglob("README.md")):
        for name, rows in documented(readme.read_text()).items():
            assert name not in tables, f"{name}'s options are in two READMEs"
            tables[name] = rows
    return tables


def test_every_script_with_a_parser_has_an_options_table() -> None:
    read = parsers()
    assert set(read) == {p.name for p in scripts_with_parsers()}, "a script's parser could not be read"
    tables = all_documented()
    assert sorted(set(read) - set(tables)) == [], "scripts whose options no README documents"
    assert sorted(set(tables) - set(read)) == [], "option tables of scripts that are not there (or have no parser)"


@pytest.mark.parametrize("script", [p.name for p in scripts_with_parsers()])
def test_documented_options_are_the_scripts_own(script: str) -> None:
    options, rows = parsers()[script], all_documented().get(script, {})
    assert sorted(set(rows) - set(options)) == [], f"{script}: documented, but the script has no such option"
    missing = {o: options[o] for o in options if o not in rows}
    assert missing == {}, f"{script}: options the README does not document (with their defaults)"
    wrong = {o: (rows[o], options[o]) for o in options if rows[o] != options[o]}
    assert wrong == {}, f"{script}: (documented default, the script's default)"


def test_the_tables_are_read_as_written() -> None:
    text = "\n".join(
        [
            "<!-- options: x.py -->",
            "",
            "| option | default | what it sets |",
            "| --- | --- | --- |",
            "| `--jobs N` | `100` | jobs |",
            "| `--skip [S ...]` | - | sections |",
            "",
            "| `--not-this` | 1 | another table |",
        ]
    )
    assert documented(text) == {"x.py": {"--jobs": "100", "--skip": "-"}}
    assert [default_cell(v) for v in (None, False, [], ["a", "b"], 1.0, 0.5, 3, "isolated")] == [
        "-",
        "-",
        "-",
        "a b",
        "1",
        "0.5",
        "3",
        "isolated",
    ]

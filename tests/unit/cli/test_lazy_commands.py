"""The ``kiln`` command imports only the module of the command a command line names."""

from __future__ import annotations

import subprocess
import sys

from kiln.cli.main import COMMANDS, build_app

PROBE = """
import sys
from kiln.cli import main
sys.argv = ["kiln", *sys.argv[1:]]
try:
    main.main()
except SystemExit:
    pass
loaded = sorted(m for m in sys.modules if m.startswith("kiln.cli.") and m.count(".") == 2)
print("LOADED", " ".join(loaded), file=sys.stderr)
"""


def loaded_for(*argv: str) -> tuple[set[str], str]:
    result = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=60)
    line = next(line for line in result.stderr.splitlines() if line.startswith("LOADED"))
    return set(line.split()[1:]), result.stdout + result.stderr


def test_a_command_line_imports_only_its_command_and_the_root_help_lists_them_all() -> None:
    loaded, output = loaded_for("data", "put", "--help")
    assert "kiln.cli.data" in loaded and "Files hashed and parts in flight" in output
    assert not loaded & {"kiln.cli.jobs", "kiln.cli.run", "kiln.cli.server", "kiln.cli.audit", "kiln.cli.render"}
    loaded, output = loaded_for("--help")
    assert {f"kiln.cli.{m}" for m in ("jobs", "run", "data", "server", "audit", "render")} <= loaded
    for name in COMMANDS:
        assert f" {name} " in output
    loaded, output = loaded_for("nosuch")
    assert "No such command 'nosuch'" in output


def test_the_whole_app_has_every_command_once_and_jobs_render() -> None:
    app = build_app()
    names = [c.name or c.callback.__name__ for c in app.registered_commands if c.callback]
    names += [g.name for g in app.registered_groups if g.name]
    assert sorted(names) == sorted(COMMANDS)
    build_app()  # building it again does not add jobs render twice
    jobs = next(g.typer_instance for g in app.registered_groups if g.name == "jobs")
    assert [c.name for c in jobs.registered_commands].count("render") == 1

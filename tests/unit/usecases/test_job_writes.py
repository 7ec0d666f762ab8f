"""Every change of a job's state goes through usecases/jobs/lifecycle.py: no other module of the server writes a job
event row or sets a job's state when it creates one (the bulk waiting notes of the reconciler are events without a
state change, written through the events table)."""

from __future__ import annotations

import ast
from pathlib import Path

import kiln

SRC = Path(kiln.__file__).parent
LIFECYCLE = SRC / "usecases" / "jobs" / "lifecycle.py"


def _calls(name: str) -> list[tuple[Path, ast.Call]]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name:
                found.append((path, node))
    return found


def test_only_the_lifecycle_module_builds_job_events() -> None:
    outside = [f"{p.relative_to(SRC)}:{c.lineno}" for p, c in _calls("JobEvent") if p != LIFECYCLE]
    assert outside == [], "build job events with usecases.lifecycle (create_job, transition, record)"


def test_no_module_creates_a_job_in_a_state_of_its_own() -> None:
    stated = [
        f"{p.relative_to(SRC)}:{c.lineno}"
        for p, c in _calls("Job")
        if any(k.arg in ("state", "reason") for k in c.keywords)
    ]
    assert stated == [], "create jobs with usecases.lifecycle.create_job"
    assert _calls("Job"), "the scan finds the job rows the server creates"

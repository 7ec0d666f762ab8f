"""No test waits longer than pytest-timeout lets it run: the waits a test writes out (``timeout=N`` of a call,
``time.monotonic() + N`` of a deadline) add up to less than its ``@pytest.mark.timeout`` or, without one, the
suite's timeout in pyproject.toml. An e2e test waited 900 s under a global 300 s: killed by the timeout, it said
nothing of what it was waiting for. A wait inside a loop counts once (this reads the code, it does not run it)."""

from __future__ import annotations

import ast
import tomllib

from tests.kilnserver import REPO

# Calls whose timeout= is a wait (a job factory's timeout= is the job's, not the test's).
WAITERS = frozenset({"run", "_kiln", "kiln", "wait", "wait_for", "communicate", "check_output", "get", "post"})
GLOBAL = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["timeout"]


def _number(node: ast.expr) -> float | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, int | float) else None


def _callee(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _waits(function: ast.FunctionDef) -> float:
    total = 0.0
    for node in ast.walk(function):
        if isinstance(node, ast.Call) and _callee(node) in WAITERS:
            for keyword in node.keywords:
                if keyword.arg == "timeout" and (value := _number(keyword.value)) is not None:
                    total += value
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left = node.left
            if (
                isinstance(left, ast.Call)
                and isinstance(left.func, ast.Attribute)
                and left.func.attr == "monotonic"
                and (value := _number(node.right)) is not None
            ):
                total += value
    return total


def _marked(function: ast.FunctionDef) -> float | None:
    for decorator in function.decorator_list:
        if (
            isinstance(decorator, ast.Call)
            and isinstance(decorator.func, ast.Attribute)
            and decorator.func.attr == "timeout"
            and decorator.args
        ):
            return _number(decorator.args[0])
    return None


def test_every_test_waits_less_than_its_timeout() -> None:
    too_long = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                waits = _waits(node)
                limit = _marked(node) or GLOBAL
                if waits >= limit:
                    too_long.append(f"{path.relative_to(REPO)}::{node.name} waits up to {waits:g} s, timeout {limit} s")
    assert not too_long, "\n".join(too_long)

"""The console's pure TypeScript modules (console/src/format.ts, runTable.ts, predictExample.ts) run by Node.js,
transpiled by the console's own TypeScript (its node_modules, from ``make console``): a test checks each against the
Python it must agree with."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.browser import REPO

RUNNER = """
const ts = require(process.argv[1]);
const fs = require("fs");
const js = ts.transpileModule(fs.readFileSync(process.argv[2], "utf8"), {
  compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 },
}).outputText;
import("data:text/javascript;base64," + Buffer.from(js).toString("base64")).then((module) => {
  const input = JSON.parse(fs.readFileSync(0, "utf8"));
  process.stdout.write(JSON.stringify((FUNCTION)(module, input)));
});
"""


def run_module(name: str, function: str, data: object) -> Any:
    """``function`` (JavaScript, ``(module, input) => answer``) applied to console/src/``name`` and ``data`` (sent
    as JSON); its answer, parsed from JSON."""
    console = REPO / "console"
    typescript = console / "node_modules" / "typescript"
    if not typescript.is_dir():
        pytest.fail(f"{typescript} is missing: run `make console`", pytrace=False)
    run = subprocess.run(
        ["node", "-e", RUNNER.replace("FUNCTION", function), str(typescript), str(console / "src" / name)],
        input=json.dumps(data),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)

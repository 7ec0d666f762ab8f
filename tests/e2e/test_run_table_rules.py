"""One set of rules for the runs table in the CLI and the console: console/src/runTable.ts, run by Node.js
(transpiled by the console's own TypeScript), gives what kiln.domain.run_table gives — each number's text, each
param's, the default columns of a table of a study's trials, a notebook's run and a replica's, and each state."""

from __future__ import annotations

from typing import Any

import pytest

from kiln.domain.run_table import default_columns, format_number, format_value, run_state
from kiln.sdk.tracking import TrackedRun
from tests.console_modules import run_module

pytestmark = pytest.mark.needs("node")

NUMBERS = [
    0.00012009732465102296, 0.9123456, 1 / 3, 2 / 3, 123.456, 999.95, 999.9999, 1000.5, -1000.5, 12345.678, 3.0,
    1.0625, -1.0625, 0.125, 1.2345e-5, 9.99995e-5, 1e-4, 2.5e15, 1e300, 5e-324, 0.0, -0.0, 64.0, 1e15 - 0.5,
]  # fmt: skip
TEXTS = ["0.00012009732465102296", "0.0", "0.10", "64", "1e-3", "adam", "123456.789", "-0.000123456", ".5", "1."]
STATUSES = ["FINISHED", "KILLED", "SCHEDULED", "RUNNING", "FAILED"]


def _run(run_id: str, params: dict[str, str], metrics: dict[str, float], tags: dict[str, str]) -> TrackedRun:
    return TrackedRun(run_id, run_id, "exp-1", "FINISHED", "ann", 0, 0, params, tags, metrics)


TRIAL = {"kiln.objective": "val_acc", "kiln.state": "PRUNED"}
RUNS = [
    _run("nb", {"base_url": "/notebooks/nb-1/", "idle": "7200"}, {}, {}),
    _run("rep", {"max_batch_size": "32"}, {"system/cpu": 1.0}, {}),
    *(
        _run(f"t{i}", {"lr": lr, "width": "64", "opt": opt}, {"val_acc": 0.9, "loss": 0.1, "z": 1.0}, TRIAL)
        for i, (lr, opt) in enumerate((("0.1", "adam"), ("0.01", "adam"), ("0.001", "sgd")))
    ),
    _run("plain", {"lr": "0.5", "width": "64", "b": "1"}, {"loss": 0.2, "acc": 0.5}, {}),
]
RUNNER = """(t, [numbers, texts, runs, statuses]) => {
  const asRun = (r) => ({
    info: { run_id: r.id, run_name: r.id, status: r.status, user_id: "ann" },
    data: {
      params: Object.entries(r.params).map(([key, value]) => ({ key, value })),
      metrics: Object.entries(r.metrics).map(([key, value]) => ({ key, value })),
      tags: Object.entries(r.tags).map(([key, value]) => ({ key, value })),
    },
  });
  return {
    numbers: numbers.map((n) => t.formatNumber(n)),
    texts: texts.map((s) => t.formatValue(s)),
    columns: t.defaultColumns(runs.map(asRun)),
    single: t.defaultColumns(runs.slice(0, 1).map(asRun)),
    states: statuses.map((s) => t.runState(asRun({ id: "r", status: s, params: {}, metrics: {}, tags: {} }))),
    pruned: t.runState(asRun(runs[2])),
  };
}"""


def test_the_console_shows_a_runs_table_as_the_cli_does() -> None:
    runs: list[dict[str, Any]] = [
        {"id": r.id, "status": r.status, "params": r.params, "metrics": r.metrics, "tags": r.tags} for r in RUNS
    ]
    console_shows = run_module("runTable.ts", RUNNER, [NUMBERS, TEXTS, runs, STATUSES])
    assert console_shows["numbers"] == [format_number(n) for n in NUMBERS]
    assert console_shows["texts"] == [format_value(t) for t in TEXTS]
    assert console_shows["columns"] == default_columns(RUNS) and console_shows["columns"][:2] == [
        "metrics.val_acc",
        "params.lr",
    ]
    assert console_shows["single"] == default_columns(RUNS[:1])
    assert console_shows["states"] == [run_state(s, {}) for s in STATUSES]
    assert console_shows["pruned"] == RUNS[2].state == "PRUNED"

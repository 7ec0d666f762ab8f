"""The runs table as people read it, in ``kiln runs list`` and on the console's Runs page alike: a run's state in
Kiln's words, numbers rounded for display, and the columns shown when none were asked for. Pure functions;
console/src/runTable.ts is the same rules in TypeScript, and tests/e2e/test_run_table_rules.py runs it under Node.js
against these.

**States.** A run's state is named as its job's is everywhere else in Kiln (QUEUED, STARTING, RUNNING,
RESTARTING, SUCCEEDED, FAILED, CANCELLED), and a study's trial stopped by its pruner is PRUNED. MLflow's statuses
(SCHEDULED, RUNNING, FINISHED, FAILED, KILLED) stay what the MLflow protocol answers — its clients expect exactly
those five — and a run logged from outside Kiln (whose status its client set) is shown under the matching Kiln name.
Kiln's words win because a run of Kiln's is a job first: the Jobs page, ``kiln jobs list`` and ``kiln run
--follow`` already say SUCCEEDED and CANCELLED for the same thing, and PRUNED has no MLflow status. The server puts
the state in the run's ``kiln.state`` tag (a protocol answer has room for no other field), with a study's objective
in ``kiln.objective`` and ``kiln.objective.direction``.

**Numbers.** Four significant digits (``0.0001201``, ``1.235``, ``123.5``), a whole number from 1,000 up
(``12346``; the digits before the point are never rounded away), and scientific notation below 0.0001 and from
10¹⁵ (``1.201e-5``). Halves round away from zero, on the float's exact value (as JavaScript's ``toExponential``
does). A param's text is shown rounded only where it has more digits than that (``0.0`` and ``0.10`` stay as
typed; an Optuna-sampled ``0.00012009732465102296`` is ``0.0001201``). JSON output is never
rounded: rounding is for display only.

**Default columns.** The way a person picks them: a study's objective first; then the params whose values differ
between the runs shown (a param every run has the same value of, or that one run alone has, says nothing about
them), those most runs have first; then the metrics most runs report. Where no param differs (one run, or runs of
one configuration), the params most runs have.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from decimal import ROUND_HALF_UP, Decimal, localcontext
from typing import Protocol

# ---- states

STATE_TAG = "kiln.state"
OBJECTIVE_TAG = "kiln.objective"
DIRECTION_TAG = "kiln.objective.direction"
PRUNED = "PRUNED"
# MLflow's status of a run logged from outside Kiln, in Kiln's words (kiln.domain.tracking.run_status goes the
# other way for a job's run).
STATE_OF_STATUS = {
    "SCHEDULED": "QUEUED",
    "RUNNING": "RUNNING",
    "FINISHED": "SUCCEEDED",
    "FAILED": "FAILED",
    "KILLED": "CANCELLED",
}


def run_state(status: str, tags: Mapping[str, str]) -> str:
    """What a person reads as the run's state: the server's ``kiln.state`` tag, else its MLflow status renamed."""
    return tags.get(STATE_TAG) or STATE_OF_STATUS.get(status, status)


# ---- numbers

SIGNIFICANT = 4
_NUMERIC = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def format_number(x: float) -> str:
    """``x`` for a person: four significant digits; whole from 1,000 to 10¹⁵; scientific below 0.0001."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    sign = "-" if x < 0 else ""
    exact = Decimal(abs(x))  # the float's exact value: halves round as JavaScript rounds them
    if 1000 <= abs(x) < 1e15:
        return sign + str(exact.quantize(Decimal(1), rounding=ROUND_HALF_UP))
    with localcontext() as ctx:
        ctx.prec, ctx.rounding = SIGNIFICANT, ROUND_HALF_UP
        rounded = +exact
    digits = "".join(map(str, rounded.as_tuple().digits)).ljust(SIGNIFICANT, "0")[:SIGNIFICANT]
    exponent = rounded.adjusted()
    if -4 <= exponent < 15:
        if exponent < 0:
            text = "0." + "0" * (-exponent - 1) + digits
        else:
            whole = digits.ljust(exponent + 1, "0")
            text = whole[: exponent + 1] + "." + whole[exponent + 1 :]
        return sign + _trimmed(text)
    return f"{sign}{_trimmed(digits[0] + '.' + digits[1:])}e{'+' if exponent > 0 else '-'}{abs(exponent)}"


def _trimmed(text: str) -> str:
    return text.rstrip("0").rstrip(".") if "." in text else text


def format_value(value: object) -> str:
    """A cell of the runs table: ``-`` for nothing, a number rounded, a numeric text (a param) rounded where it has
    more digits than four, any other text as it is."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return format_number(float(value))
    text = str(value)
    if _NUMERIC.match(text):
        shown = format_number(float(text))
        if len(shown) < len(text) and float(shown) != float(text):
            return shown
    return text


# ---- default columns

PARAM_COLUMNS = 4
METRIC_COLUMNS = 4


class RunRow(Protocol):
    """What the column chooser reads of a run (``kiln.sdk.tracking.TrackedRun`` is one)."""

    @property
    def params(self) -> Mapping[str, str]: ...
    @property
    def metrics(self) -> Mapping[str, float]: ...
    @property
    def tags(self) -> Mapping[str, str]: ...


def _most_first(counts: Counter[str]) -> list[str]:
    return sorted(counts, key=lambda k: (-counts[k], k))


def default_columns(runs: Sequence[RunRow], params: int = PARAM_COLUMNS, metrics: int = METRIC_COLUMNS) -> list[str]:
    """The columns (``metrics.X``, ``params.X``) to show ``runs`` with when none were asked for, most telling first:
    the study's objective, the params that differ between the runs, the metrics most of them report."""
    objectives = Counter(r.tags[OBJECTIVE_TAG] for r in runs if r.tags.get(OBJECTIVE_TAG))
    having: Counter[str] = Counter()
    values: dict[str, set[str]] = {}
    for run in runs:
        for key, value in run.params.items():
            having[key] += 1
            values.setdefault(key, set()).add(value)
    differing = {k for k in having if len(values[k]) > 1}
    reported = Counter(k for r in runs for k in r.metrics)
    return choose_columns(objectives, having, differing, reported, params, metrics)


def choose_columns(
    objectives: Mapping[str, int],
    having: Mapping[str, int],
    differing: Collection[str],
    reported: Mapping[str, int],
    params: int = PARAM_COLUMNS,
    metrics: int = METRIC_COLUMNS,
) -> list[str]:
    """:func:`default_columns` from what it counts of the runs (the server counts these in SQL, without reading every
    param of every run): how many runs have each objective, each param (``having``), which params' values differ
    between them, and how many runs report each metric."""
    objective = _most_first(Counter(objectives))[0] if objectives else None
    differ = Counter({k: n for k, n in having.items() if k in differing})
    chosen_params = _most_first(differ or Counter(having))[:params]
    shown = Counter({k: n for k, n in reported.items() if "/" not in k and k != objective})
    chosen_metrics = _most_first(shown)[:metrics]
    return [
        *([f"metrics.{objective}"] if objective else []),
        *(f"params.{k}" for k in chosen_params),
        *(f"metrics.{k}" for k in chosen_metrics),
    ]

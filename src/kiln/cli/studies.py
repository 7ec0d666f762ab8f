"""``kiln studies``: list, show, trials, best, stop, export and events of hyperparameter tuning studies; and how a
study and its trials are shown (also by ``kiln tune --follow``)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from kiln.cli.common import Output, OutputFormat, connect, emit_json, emit_list, info, out
from kiln.cli.output import fmt_duration, fmt_time, plural
from kiln.domain.studies import StudyState, TrialState

if TYPE_CHECKING:
    from kiln.domain.studies import StudyEventRead, StudyRead, StudySpec, TrialRead

app = typer.Typer(
    help="Inspect and stop hyperparameter tuning studies (start one with kiln tune).", no_args_is_help=True
)

StudyArg = Annotated[str, typer.Argument(help="The study id.")]

STUDY_STYLES = {
    StudyState.RUNNING: "blue",
    StudyState.SUCCEEDED: "green",
    StudyState.FAILED: "red",
    StudyState.STOPPED: "magenta",
}
TRIAL_STYLES = {
    TrialState.RUNNING: "blue",
    TrialState.SUCCEEDED: "green",
    TrialState.PRUNED: "yellow",
    TrialState.FAILED: "red",
    TrialState.CANCELLED: "magenta",
}
# Up to this many parameters get a column each in the trials table; more share one PARAMS column.
PARAM_COLUMNS = 6


class TrialOrder(StrEnum):
    objective = "objective"
    number = "number"


# -- rendering ----------------------------------------------------------------------------------------------------


def fmt_number(value: float | None) -> str:
    """An objective value or a float parameter, to 6 significant digits (CSV and JSON keep every digit)."""
    if value is None:
        return "-"
    return f"{value:.6g}"


def fmt_param(value: bool | int | float | str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return fmt_number(value) if isinstance(value, float) else str(value)


def params_text(params: dict[str, bool | int | float | str], names: list[str] | None = None) -> str:
    """``lr=0.01 width=64``, in the order of ``names`` (default: the trial's own)."""
    keys = [n for n in names if n in params] if names is not None else list(params)
    return " ".join(f"{key}={fmt_param(params[key])}" for key in keys)


def trial_state_text(trial: TrialRead) -> Text:
    """The trial's state; a pruned one with the step the pruner stopped it at: ``PRUNED@3``."""
    label = trial.state.value
    if trial.state is TrialState.PRUNED and trial.pruned_step is not None:
        label += f"@{trial.pruned_step}"
    return Text(label, style=TRIAL_STYLES.get(trial.state, ""))


def prune_reason(trial: TrialRead) -> str:
    """Why the pruner stopped the trial, short: ``0.5 < 0.866667 of 3`` (its value at the rung, the cutoff it missed,
    how many other trials' values the cutoff came from); ``0.3@4`` where the value is of a step below the rung; the
    median rule's ``best 0.5 < median 0.8 of 3``. Empty for a trial without a report."""
    report = trial.pruning
    if report is None or report.value is None or report.cutoff is None:
        return ""
    side = "<" if report.value < report.cutoff else ">"
    value = fmt_number(report.value)
    if report.step is not None and report.step != report.rung:
        value += f"@{report.step}"
    if report.rule == "median":
        return f"best {value} {side} median {fmt_number(report.cutoff)} of {report.compared}"
    return f"{value} {side} {fmt_number(report.cutoff)} of {report.compared}"


def stopping_text(spec: StudySpec) -> str:
    """The early stopping and its settings: ``asha (min_resource 5, reduction_factor 3, bootstrap_count 2)``."""
    es = spec.early_stopping
    if es.type == "none":
        return "none"
    if es.type == "median":
        return f"median (startup_trials {es.startup_trials}, warmup_steps {es.warmup_steps})"
    low = es.min_resource if es.min_resource is not None else ("auto" if es.type == "asha" else 1)
    parts = [f"min_resource {low}"] + ([f"max_resource {es.max_resource}"] if es.max_resource is not None else [])
    parts += [f"reduction_factor {es.reduction_factor}", f"bootstrap_count {es.bootstrap_count}"]
    return f"{es.type} ({', '.join(parts)})"


def study_state_text(state: StudyState) -> Text:
    return Text(state.value, style=STUDY_STYLES.get(state, ""))


def trial_value_text(trial: TrialRead) -> Text:
    """The final objective value; for a trial without one, the last value the pruner saw (dim, with its step)."""
    if trial.value is not None:
        return Text(fmt_number(trial.value))
    if trial.last_value is not None:
        step = f" @{trial.last_step}" if trial.last_step is not None else ""
        return Text(f"({fmt_number(trial.last_value)}{step})", style="dim")
    return Text("-", style="dim")


def study_duration(study: StudyRead, now: datetime | None = None) -> float:
    end = study.finished_at or now or datetime.now(UTC)
    return (_aware(end) - _aware(study.created_at)).total_seconds()


def _aware(dt: datetime) -> datetime:
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)


def trials_progress(study: StudyRead) -> str:
    """``3/4 (2 succeeded, 1 pruned, 1 running)``: ended of planned, then the counts that are not zero."""
    counts = study.trials
    ended = counts.total - counts.running
    parts = [
        f"{n} {label}"
        for n, label in (
            (counts.succeeded, "succeeded"),
            (counts.pruned, "pruned"),
            (counts.failed, "failed"),
            (counts.cancelled, "cancelled"),
            (counts.running, "running"),
        )
        if n
    ]
    return f"{ended}/{study.planned_trials}" + (f" ({', '.join(parts)})" if parts else "")


def _table(*columns: str) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for name in columns:
        table.add_column(name, overflow="fold")
    return table


def studies_table(studies: list[StudyRead]) -> None:
    table = _table("ID", "NAME", "STATE", "TRIALS", "BEST", "CREATED", "DURATION")
    table.columns[0].no_wrap = True
    for study in studies:
        best = fmt_number(study.best.value) if study.best is not None else "-"
        table.add_row(
            Text(study.id),
            Text(study.name),
            study_state_text(study.state),
            trials_progress(study),
            best,
            fmt_time(study.created_at),
            fmt_duration(study_duration(study)),
        )
    out.print(table)


def trials_table(trials: list[TrialRead], names: list[str]) -> None:
    """One row per trial in the order given: number, state (``PRUNED@k``), value, why the pruner stopped it (where
    it stopped any: ``PRUNED BY 0.5 < 0.866667 of 3``), parameters, duration, job."""
    own_columns = len(names) <= PARAM_COLUMNS
    why = any(prune_reason(t) for t in trials)  # a column of the pruner's reasons where it stopped any
    table = _table(
        "#",
        "STATE",
        "VALUE",
        *(["PRUNED BY"] if why else []),
        *(names if own_columns else ["PARAMS"]),
        "DURATION",
        "JOB",
    )
    table.columns[-1].no_wrap = True
    for trial in trials:
        if own_columns:
            params = [Text(fmt_param(trial.params[n]) if n in trial.params else "-") for n in names]
        else:
            params = [Text(params_text(trial.params, names))]
        reason = [Text(prune_reason(trial) or "-", style="" if trial.pruning else "dim")] if why else []
        table.add_row(
            str(trial.number),
            trial_state_text(trial),
            trial_value_text(trial),
            *reason,
            *params,
            fmt_duration(trial.duration_seconds),
            Text(trial.job_id or "-"),
        )
    out.print(table)


def _details(rows: list[tuple[str, str | Text | None]]) -> None:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for key, value in rows:
        grid.add_row(key, value if isinstance(value, Text) else Text("-" if value in (None, "") else str(value)))
    out.print(grid)


def study_detail(study: StudyRead) -> None:
    spec = study.spec
    best = None
    if study.best is not None:
        best = f"trial {study.best.number}: {fmt_number(study.best.value)} ({study.best.job_id or 'job deleted'})"
    _details(
        [
            ("id", study.id),
            ("name", study.name),
            ("state", study_state_text(study.state)),
            ("reason", study.reason),
            ("message", study.message),
            ("objective", f"{spec.objective.direction} {spec.objective.metric} ({spec.objective.aggregate} value)"),
            ("algorithm", spec.algorithm + (f", seed {spec.seed}" if spec.seed is not None else "")),
            ("early stopping", stopping_text(spec)),
            ("trials", trials_progress(study)),
            ("parallelism", str(spec.parallelism)),
            ("max failed", str(spec.max_failed_trials) if spec.max_failed_trials is not None else None),
            ("time budget", fmt_duration(spec.time_budget) if spec.time_budget else None),
            ("best", best),
            ("created", fmt_time(study.created_at)),
            ("finished", fmt_time(study.finished_at)),
            ("duration", fmt_duration(study_duration(study))),
            ("code", study.code_sha256[:12] if study.code_sha256 else None),
        ]
    )


def best_detail(trial: TrialRead, names: list[str]) -> None:
    rows: list[tuple[str, str | Text | None]] = [
        ("trial", str(trial.number)),
        ("value", fmt_number(trial.value)),
        ("job", trial.job_id or "(deleted)"),
        ("duration", fmt_duration(trial.duration_seconds)),
    ]
    rows += [(f"param {name}", fmt_param(trial.params[name])) for name in names if name in trial.params]
    _details(rows)


def trial_line(trial: TrialRead, names: list[str] | None = None) -> Text:
    """One ended trial on one line, as ``kiln tune --follow`` prints it:
    ``trial 3  PRUNED at step 2 (0.61)  lr=0.01 width=64  4s  job-…``."""
    if trial.state is TrialState.PRUNED:
        step = f" at step {trial.pruned_step}" if trial.pruned_step is not None else ""
        last = f" ({fmt_number(trial.last_value)})" if trial.last_value is not None else ""
        if prune_reason(trial):
            last = f" ({prune_reason(trial)})"
        outcome = Text(f"PRUNED{step}{last}", style=TRIAL_STYLES[trial.state])
    else:
        outcome = Text(trial.state.value, style=TRIAL_STYLES.get(trial.state, ""))
        if trial.value is not None:
            outcome += Text(f" {fmt_number(trial.value)}")
    parts = [Text(f"trial {trial.number}"), outcome, Text(params_text(trial.params, names))]
    parts += [Text(fmt_duration(trial.duration_seconds)), Text(trial.job_id or "-", style="dim")]
    if trial.message and trial.state in (TrialState.FAILED, TrialState.CANCELLED):
        parts.append(Text(trial.message, style="dim"))
    return Text("  ").join(p for p in parts if p.plain)


def study_events_table(events: list[StudyEventRead]) -> None:
    table = _table("TIME", "TRANSITION", "REASON", "TRIAL", "MESSAGE")
    for event in events:
        transition = Text("")
        if event.to_state is not None:
            before = study_state_text(event.from_state) if event.from_state else Text("-", style="dim")
            transition = before + Text(" → ") + study_state_text(event.to_state)
        trial = "-" if event.trial is None else str(event.trial)
        table.add_row(fmt_time(event.time), transition, event.reason, trial, Text(event.message))
    out.print(table)


def describe_end(study: StudyRead) -> str:
    text = f"study {study.id} {study.state}"
    if study.reason:
        text += f" ({study.reason})"
    if study.message and study.state is not StudyState.SUCCEEDED:
        text += f": {study.message}"
    return f"{text}; trials {trials_progress(study)}"


# -- commands -----------------------------------------------------------------------------------------------------


@app.command("list")
def list_studies(
    state: Annotated[
        StudyState | None, typer.Option("--state", "-s", case_sensitive=False, help="Only studies in this state.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="At most this many (newest first).")] = 50,
    output: Output = OutputFormat.table,
) -> None:
    """List studies, newest first."""
    with connect() as client:
        studies = client.list_studies(state, limit)
    emit_list(studies, output, studies_table, "no studies")


@app.command()
def show(study_id: StudyArg, output: Output = OutputFormat.table) -> None:
    """A study's state, objective and counts, then its trials sorted by objective (best first)."""
    from kiln.sdk.studies import parameter_names

    with connect() as client:
        study = client.get_study(study_id)
        trials = client.study_trials(study_id)
    if output is OutputFormat.json:
        emit_json({"study": study.model_dump(mode="json"), "trials": [t.model_dump(mode="json") for t in trials]})
        return
    study_detail(study)
    if trials:
        out.print()
        trials_table(trials, parameter_names(trials, study.spec))
    else:
        info("no trials yet")


@app.command()
def trials(
    study_id: StudyArg,
    order: Annotated[
        TrialOrder, typer.Option(case_sensitive=False, help="objective: best first (default); number: as started.")
    ] = TrialOrder.objective,
    output: Output = OutputFormat.table,
) -> None:
    """A study's trials with their state (PRUNED@step), value, why the pruner stopped it (its value at the rung <
    the cutoff of N other trials there), parameters, duration and job."""
    from kiln.sdk.studies import parameter_names

    with connect() as client:
        study = client.get_study(study_id)
        items = client.study_trials(study_id, order.value)
    emit_list(items, output, lambda rows: trials_table(rows, parameter_names(rows, study.spec)), "no trials yet")


@app.command()
def best(study_id: StudyArg, output: Output = OutputFormat.table) -> None:
    """The best succeeded trial: its parameters, value and job id (an error while no trial has succeeded)."""
    from kiln.sdk.studies import parameter_names

    with connect() as client:
        study = client.get_study(study_id)
        trial = client.best_trial(study_id)
    if output is OutputFormat.json:
        emit_json(trial.model_dump(mode="json"))
    else:
        best_detail(trial, parameter_names([trial], study.spec))


@app.command()
def stop(study_id: StudyArg, output: Output = OutputFormat.table) -> None:
    """Stop a study (idempotent): no new trial starts and every running trial's job is cancelled."""
    with connect() as client:
        study = client.stop_study(study_id)
    if output is OutputFormat.json:
        emit_json(study.model_dump(mode="json"))
    else:
        info(describe_end(study))


@app.command()
def export(
    study_id: StudyArg,
    file: Annotated[
        Path | None, typer.Option("--output", "-o", dir_okay=False, help="Write the CSV here (default: stdout).")
    ] = None,
) -> None:
    """The trials as CSV, by number: number, state, value, param.<name> for each parameter, pruned_step, job_id,
    duration_seconds."""
    with connect() as client:
        if file is None or str(file) == "-":
            rows = client.export_trials_csv(study_id, sys.stdout)
            sys.stdout.flush()
            return
        rows = client.export_trials_csv(study_id, file)
    info(f"wrote {plural(rows, 'trial')} to {file}")


@app.command()
def events(study_id: StudyArg, output: Output = OutputFormat.table) -> None:
    """A study's state changes and its trials' starts and ends, oldest first."""
    with connect() as client:
        items = client.study_events(study_id)
    if output is OutputFormat.json:
        emit_json([event.model_dump(mode="json") for event in items])
    else:
        study_events_table(items)

"""`kiln tune` and `kiln studies` without a server: reading study.yaml (errors name the field), and what the tables
and the --follow lines show (PRUNED at step k, values, parameters)."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from kiln.cli import studies as render
from kiln.cli.spec import SpecError
from kiln.cli.tune import final_exit_code, load_study_spec
from kiln.domain.studies import (
    PruneReport,
    StudyRead,
    StudySpec,
    StudyState,
    TrialCounts,
    TrialRead,
    TrialState,
)

NOW = datetime(2026, 1, 31, 9, 0, tzinfo=UTC)
STUDY_YAML = """\
name: digits
trial:
  command: python train.py --lr {lr} --width {width}
  runtime: {python: /usr/bin/python3}
  env: {EPOCHS: 3, VERBOSE: true}
parameters:
  lr: {type: float, low: 1.0e-4, high: 0.1, log: true}
  width: {type: int, low: 16, high: 128, step: 16}
objective: {metric: val_acc, direction: maximize}
algorithm: tpe
early_stopping: asha
max_trials: 20
parallelism: 2
time_budget: 30m
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(text)
    return path


def spec_error(tmp_path: Path, text: str) -> str:
    with pytest.raises(SpecError) as caught:
        load_study_spec(write(tmp_path, text))
    return str(caught.value)


def test_a_study_yaml_is_read_with_its_trials_env_as_text_and_name_replaced(tmp_path: Path) -> None:
    spec = load_study_spec(write(tmp_path, STUDY_YAML), name="digits-2")
    assert spec.name == "digits-2" and spec.trial.env == {"EPOCHS": "3", "VERBOSE": "true"}
    assert spec.early_stopping.type == "asha" and spec.time_budget == 1800 and spec.parallelism == 2
    assert spec.parameters["lr"].log and spec.parameters["width"].step == 16


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("low: 1.0e-4, high: 0.1", "low: 0.5, high: 0.1"), "parameters.lr: low: 0.5 is above high (0.1)"),
        (("metric: val_acc", "metric: ''"), "objective.metric:"),
        (("{type: int, low: 16, high: 128, step: 16}", "{type: categorical}"), "parameters.width: choices:"),
        (("max_trials: 20", "max_trial: 20"), "max_trial: unknown field (did you mean 'max_trials'?)"),
        (("runtime:", "runtim:"), "trial.runtim: unknown field (did you mean 'trial.runtime'?)"),
        (
            ("log: true}", "log: true, steps: 2}"),
            "parameters.lr.steps: unknown field (did you mean 'parameters.lr.step'?)",
        ),
        (("direction: maximize", "direction: up"), "objective.direction:"),
        (("parallelism: 2", "parallelism: two"), "parallelism:"),
    ],
)
def test_a_bad_study_yaml_names_the_file_and_the_field(tmp_path: Path, change: tuple[str, str], expected: str) -> None:
    old, new = change
    assert old in STUDY_YAML
    message = spec_error(tmp_path, STUDY_YAML.replace(old, new))
    assert message.startswith(f"invalid study spec in {tmp_path / 'study.yaml'}:")
    assert expected in message, message


def test_a_study_yaml_that_is_not_a_mapping_or_not_yaml_is_refused(tmp_path: Path) -> None:
    assert "expected a mapping" in spec_error(tmp_path, "- just\n- a list\n")
    assert "not valid YAML" in spec_error(tmp_path, "trial: [unclosed\n")
    assert "trial: Field required" in spec_error(tmp_path, "objective: {metric: a, direction: minimize}\n")


def study(state: StudyState, **fields: Any) -> StudyRead:
    base: dict[str, Any] = {
        "id": "st-1",
        "name": "digits",
        "org_id": "org-1",
        "user_id": "usr-1",
        "state": state,
        "spec": StudySpec.model_validate(
            {
                "trial": {"command": "python train.py --lr {lr}"},
                "parameters": {
                    "lr": {"type": "float", "low": 0.001, "high": 0.1},
                    "act": {"type": "categorical", "choices": ["relu", "tanh"]},
                },
                "objective": {"metric": "val_acc", "direction": "maximize"},
                "max_trials": 4,
            }
        ),
        "planned_trials": 4,
        "trials": TrialCounts(total=4, succeeded=2, pruned=1, running=1),
        "created_at": NOW,
        "updated_at": NOW,
    }
    return StudyRead(**(base | fields))


def trial(number: int, state: TrialState, **fields: Any) -> TrialRead:
    base: dict[str, Any] = {
        "study_id": "st-1",
        "number": number,
        "state": state,
        "params": {"lr": 0.0123456789, "act": "relu"},
        "created_at": NOW,
        "job_id": f"job-{number}",
    }
    return TrialRead(**(base | fields))


@pytest.fixture
def console(monkeypatch: pytest.MonkeyPatch) -> Console:
    # A wide console of its own: the shared one's width depends on COLUMNS when kiln.cli.common was first imported.
    console = Console(file=io.StringIO(), width=200, color_system=None, highlight=False)
    monkeypatch.setattr(render, "out", console)
    return console


def lines(console: Console) -> list[str]:
    return console.file.getvalue().splitlines()  # type: ignore[attr-defined]


def test_the_trials_table_shows_pruned_at_step_values_and_a_column_per_parameter(console: Console) -> None:
    trials = [
        trial(2, TrialState.SUCCEEDED, value=0.975, duration_seconds=75),
        trial(0, TrialState.SUCCEEDED, value=0.9, duration_seconds=9),
        trial(1, TrialState.PRUNED, pruned_step=3, last_step=3, last_value=0.61, params={"lr": 0.5, "act": "tanh"}),
        trial(3, TrialState.RUNNING, last_step=1, last_value=0.4, job_id=None),
    ]
    render.trials_table(trials, ["lr", "act"])
    header, *rows = [line for line in lines(console) if line.strip() and not line.startswith("─")]
    assert header.split() == ["#", "STATE", "VALUE", "lr", "act", "DURATION", "JOB"]
    cells = [row.split() for row in rows]
    assert [c[0] for c in cells] == ["2", "0", "1", "3"]  # the order given (the server's: by objective)
    assert cells[0] == ["2", "SUCCEEDED", "0.975", "0.0123457", "relu", "1m15s", "job-2"]
    assert cells[2][:5] == ["1", "PRUNED@3", "(0.61", "@3)", "0.5"]  # no final value: the last one it reported
    assert cells[3][:4] == ["3", "RUNNING", "(0.4", "@1)"] and cells[3][-1] == "-"


def test_the_trials_table_and_the_followed_line_say_why_a_trial_was_pruned(console: Console) -> None:
    report = PruneReport(rule="asha", rung=5, step=5, value=0.5, cutoff=0.8666667, compared=3, needed=2)
    pruned = trial(1, TrialState.PRUNED, pruned_step=5, last_step=5, last_value=0.5, pruning=report)
    skipped = PruneReport(rule="asha", rung=15, step=14, value=0.7, cutoff=0.75, compared=4, needed=2)
    earlier = trial(3, TrialState.PRUNED, pruned_step=15, last_step=16, last_value=0.8, pruning=skipped)
    median = PruneReport(rule="median", rung=3, step=3, value=2.5, cutoff=2.0, compared=5, needed=5)
    loss = trial(4, TrialState.PRUNED, pruned_step=3, last_step=3, last_value=2.5, pruning=median)
    render.trials_table([trial(0, TrialState.SUCCEEDED, value=0.9), pruned, earlier, loss], ["lr", "act"])
    header, *rows = [line for line in lines(console) if line.strip() and not line.startswith("─")]
    assert header.split() == ["#", "STATE", "VALUE", "PRUNED", "BY", "lr", "act", "DURATION", "JOB"]
    assert "0.5 < 0.866667 of 3" in rows[1] and "0.7@14 < 0.75 of 4" in rows[2], rows
    assert "best 2.5 > median 2 of 5" in rows[3] and rows[0].split()[3] == "-", rows
    line = render.trial_line(pruned)
    assert line.plain.startswith("trial 1  PRUNED at step 5 (0.5 < 0.866667 of 3)  lr=0.0123457"), line.plain
    # Without a pruned trial (or one pruned before the reports were kept), no column.
    console.file.seek(0)  # type: ignore[attr-defined]
    console.file.truncate()  # type: ignore[attr-defined]
    render.trials_table([trial(0, TrialState.SUCCEEDED, value=0.9)], ["lr", "act"])
    assert "PRUNED" not in console.file.getvalue()  # type: ignore[attr-defined]


def test_many_parameters_share_one_column(console: Console) -> None:
    params = {f"p{i}": i for i in range(render.PARAM_COLUMNS + 1)}
    render.trials_table([trial(0, TrialState.SUCCEEDED, value=1.0, params=params)], list(params))
    header = next(line for line in lines(console) if line.strip())
    assert "PARAMS" in header.split() and "p0" not in header.split()
    assert "p0=0 p1=1" in console.file.getvalue()  # type: ignore[attr-defined]


def test_a_followed_trial_is_one_line_with_its_outcome_params_and_duration() -> None:
    done = render.trial_line(trial(0, TrialState.SUCCEEDED, value=0.9375, duration_seconds=12), ["lr", "act"])
    assert done.plain == "trial 0  SUCCEEDED 0.9375  lr=0.0123457 act=relu  12s  job-0"
    pruned = render.trial_line(trial(1, TrialState.PRUNED, pruned_step=2, last_value=0.5, duration_seconds=3))
    assert pruned.plain.startswith("trial 1  PRUNED at step 2 (0.5)  lr=0.0123457 act=relu  3s")
    failed = render.trial_line(trial(2, TrialState.FAILED, message="exit code 3", duration_seconds=1))
    assert failed.plain.endswith("job-2  exit code 3")


def test_the_study_views_say_how_far_it_is_and_how_it_ended(console: Console) -> None:
    best = trial(2, TrialState.SUCCEEDED, value=0.975)
    running = study(StudyState.RUNNING, best=best, created_at=NOW - timedelta(minutes=2))
    assert render.trials_progress(running) == "3/4 (2 succeeded, 1 pruned, 1 running)"
    render.studies_table([running])
    row = next(line for line in lines(console) if line.startswith("st-1"))
    assert row.split()[:5] == ["st-1", "digits", "RUNNING", "3/4", "(2"] and "0.975" in row
    render.study_detail(running)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "maximize val_acc (last value)" in text and "trial 2: 0.975 (job-2)" in text

    failed = study(StudyState.FAILED, reason="TooManyFailedTrials", message="3 trials failed (max 2)")
    assert render.describe_end(failed).startswith("study st-1 FAILED (TooManyFailedTrials): 3 trials failed (max 2)")
    assert [final_exit_code(study(s)) for s in StudyState] == [1, 0, 1, 130]  # RUNNING, SUCCEEDED, FAILED, STOPPED

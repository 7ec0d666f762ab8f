"""The study spec: what it refuses (naming the field), the grid, and the job spec a trial gets."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from kiln.domain.spec import JobSpec, format_param, param_env_name
from kiln.domain.studies import ParameterSpec, StudySpec, substitute, trial_spec


def study(**extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "trial": {"command": "python train.py --lr {lr}"},
        "parameters": {"lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True}},
        "objective": {"metric": "val_acc", "direction": "maximize"},
    }
    base.update(extra)
    return base


def refusal(data: dict[str, Any]) -> tuple[str, str]:
    with pytest.raises(ValidationError) as info:
        StudySpec.model_validate(data)
    error = info.value.errors()[0]
    return ".".join(str(p) for p in error["loc"]), error["msg"]


def test_defaults_and_early_stopping_by_name() -> None:
    spec = StudySpec.model_validate(study(early_stopping="asha"))
    assert (spec.algorithm, spec.max_trials, spec.parallelism) == ("tpe", 10, 1)
    assert spec.early_stopping.type == "asha" and spec.early_stopping.reduction_factor == 3
    assert spec.planned_trials == 10
    assert StudySpec.model_validate(study(time_budget="1h30m")).time_budget == 5400


@pytest.mark.parametrize(
    ("change", "where", "says"),
    [
        ({"unknown": 1}, "unknown", "Extra inputs"),
        ({"parameters": {"lr": {"type": "float", "low": 2, "high": 1}}}, "parameters.lr", "low: 2 is above high (1)"),
        ({"parameters": {"c": {"type": "categorical"}}}, "parameters.c", "needs at least one choice"),
        ({"parameters": {"c": {"type": "categorical", "choices": []}}}, "parameters.c.choices", "at least 1"),
        ({"parameters": {"w": {"type": "int", "low": 1.5, "high": 4}}}, "parameters.w", "whole number"),
        ({"parameters": {"lr": {"type": "float", "low": 0, "high": 1, "log": True}}}, "parameters.lr", "low > 0"),
        ({"parameters": {"lr": {"type": "float", "high": 1}}}, "parameters.lr", "low: a float parameter needs"),
        ({"parameters": {"lr": {"type": "float", "low": 0, "high": 1, "choices": [1]}}}, "parameters.lr", "choices"),
        ({"parameters": {"lr": {"type": "float", "low": 0, "high": 1, "lr": 1}}}, "parameters.lr.lr", "Extra"),
        ({"parameters": {}}, "parameters", "at least 1"),
        ({"parameters": {"bad-name": {"type": "int", "low": 1, "high": 2}}}, "parameters.bad-name.[key]", "pattern"),
        ({"objective": {"metric": "", "direction": "maximize"}}, "objective.metric", "at least 1"),
        ({"objective": {"metric": "  ", "direction": "maximize"}}, "objective.metric", "not empty"),
        ({"objective": {"metric": "acc", "direction": "up"}}, "objective.direction", "minimize"),
        ({"algorithm": "bayes"}, "algorithm", "random"),
        ({"early_stopping": "sometimes"}, "early_stopping.type", "asha"),
        ({"max_trials": 0}, "max_trials", "greater than or equal to 1"),
        ({"parallelism": 0}, "parallelism", "greater than or equal to 1"),
        ({"time_budget": "soon"}, "time_budget", "soon"),
        ({"algorithm": "grid"}, "", "grid search needs a step"),
        ({"trial": {"command": "x", "resorces": {}}}, "trial.resorces", "Extra"),
        ({"trial": {"command": "x", "params": {"lr": 1}}}, "", "lr is tuned"),
    ],
)
def test_refusals_name_the_field(change: dict[str, Any], where: str, says: str) -> None:
    loc, msg = refusal(study(**change))
    assert loc == where
    assert says in msg


def test_parameters_that_would_share_an_environment_variable_are_refused() -> None:
    parameters = {"lr": {"type": "int", "low": 1, "high": 2}, "LR": {"type": "int", "low": 1, "high": 2}}
    assert "would share KILN_PARAM_LR" in refusal(study(parameters=parameters))[1]


def test_grid_enumerates_every_dimension_and_caps_the_trials() -> None:
    spec = StudySpec.model_validate(
        study(
            algorithm="grid",
            max_trials=100,
            parameters={
                "lr": {"type": "float", "low": 0.1, "high": 0.3, "step": 0.1},
                "width": {"type": "int", "low": 16, "high": 64, "step": 16},
                "act": {"type": "categorical", "choices": ["relu", "tanh"]},
            },
        )
    )
    assert spec.grid() == {"lr": [0.1, 0.2, 0.3], "width": [16, 32, 48, 64], "act": ["relu", "tanh"]}
    assert spec.planned_trials == 3 * 4 * 2
    assert StudySpec.model_validate({**spec.model_dump(), "max_trials": 5}).planned_trials == 5
    assert ParameterSpec(type="int", low=1, high=3).grid("n") == [1, 2, 3]


def test_substitution_quotes_for_the_shell_and_keeps_other_braces() -> None:
    params = {"lr": 0.001, "act": "tanh; rm -rf /", "flag": True}
    assert substitute("run --lr {lr} --act {act} {flag} ${HOME} {other}", params) == (
        "run --lr 0.001 --act 'tanh; rm -rf /' true ${HOME} {other}"
    )
    assert substitute(["run", "--act={act}", "{lr}"], params) == ["run", "--act=tanh; rm -rf /", "0.001"]


def test_a_trial_spec_carries_its_parameters_and_labels() -> None:
    spec = StudySpec.model_validate(
        study(
            name="mlp",
            trial={
                "command": "python train.py --lr {lr}",
                "prepare_command": "echo {lr}",
                "params": {"epochs": 5},
                "labels": {"team": "a"},
            },
        )
    )
    job = trial_spec(spec, "study-1", 3, {"lr": 0.01})
    assert isinstance(job, JobSpec)
    assert job.name == "mlp-trial-3"
    assert job.command == "python train.py --lr 0.01"
    assert job.prepare_command == "echo 0.01"
    assert job.params == {"epochs": 5, "lr": 0.01}
    assert job.labels == {"team": "a", "kiln-study": "study-1", "kiln-trial": "3"}
    assert job.metrics.watch == ["val_acc"]  # the objective's points reach the pruner one by one
    assert job.experiment == "mlp"  # the study's runs sit together, not among the Default experiment's


def test_a_trials_experiment_is_the_studys_unless_its_spec_names_one() -> None:
    unnamed = StudySpec.model_validate(study())
    assert trial_spec(unnamed, "study-1", 0, {"lr": 0.01}).experiment == "tune val_acc"
    chosen = StudySpec.model_validate(study(name="mlp", trial={"command": "x", "experiment": "digits"}))
    assert trial_spec(chosen, "study-1", 0, {"lr": 0.01}).experiment == "digits"


def test_a_trial_watches_its_objective_beside_what_its_spec_watches() -> None:
    spec = StudySpec.model_validate(study(trial={"command": "x", "metrics": {"watch": ["loss", "val_acc"]}}))
    assert trial_spec(spec, "study-1", 0, {"lr": 0.01}).metrics.watch == ["loss", "val_acc"]
    spec = StudySpec.model_validate(study(trial={"command": "x", "metrics": {"watch": ["loss"]}}))
    assert trial_spec(spec, "study-1", 0, {"lr": 0.01}).metrics.watch == ["loss", "val_acc"]


def test_job_params_are_checked_and_formatted() -> None:
    assert JobSpec.model_validate({"command": "x", "params": {"a": 1, "b": 0.5, "c": "s", "d": False}}).params == {
        "a": 1,
        "b": 0.5,
        "c": "s",
        "d": False,
    }
    for bad in ({"a-b": 1}, {"a": [1]}, {"x": 1, "X": 2}):
        with pytest.raises(ValidationError):
            JobSpec.model_validate({"command": "x", "params": bad})
    assert [format_param(v) for v in (True, 3, 0.1, "x")] == ["true", "3", "0.1", "x"]
    assert param_env_name("lr") == "KILN_PARAM_LR"

"""Telling a grid study the last point of its grid: Optuna's GridSampler then calls ``study.stop()``, which raises
outside ``study.optimize``; Kiln asks and tells, so the studies task failed once per grid study at its end (the
error in every server log of the grid tests) before the trial was marked told."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from kiln.tasks.studies import _tell


def test_the_last_point_of_a_grid_is_told_without_the_stop_error() -> None:
    study = optuna.create_study(sampler=optuna.samplers.GridSampler({"x": [1, 2]}))
    trials = [study.ask() for _ in range(2)]
    for trial in trials:
        trial.suggest_categorical("x", [1, 2])
    with pytest.raises(RuntimeError, match=r"Study\.stop"):  # what Optuna does, told directly
        study.tell(trials[0], 1.0)
        study.tell(trials[1], 2.0)
    study = optuna.create_study(sampler=optuna.samplers.GridSampler({"x": [1, 2]}))
    trials = [study.ask() for _ in range(2)]
    for trial in trials:
        trial.suggest_categorical("x", [1, 2])
    for trial, value in zip(trials, (1.0, 2.0), strict=True):
        _tell(study, trial, value, TrialState.COMPLETE)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.COMPLETE]
    assert sorted(t.value for t in study.trials) == [1.0, 2.0]


def test_any_other_error_of_a_tell_still_raises() -> None:
    class Broken:
        def tell(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("the storage is gone")

    with pytest.raises(RuntimeError, match="the storage is gone"):
        _tell(Broken(), 0, 1.0, TrialState.COMPLETE)

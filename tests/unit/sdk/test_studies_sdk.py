"""The SDK's study calls that need no server: the CSV export's columns, the parameter order, the submit body, and
how ``follow_study`` reports each trial's end once and stops with the study."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from kiln.domain.studies import StudyRead, StudySpec, StudyState, TrialCounts, TrialRead, TrialState
from kiln.sdk.client import Client
from kiln.sdk.studies import Studies, StudiesMixin, parameter_names, study_body, write_trials_csv

NOW = datetime(2026, 1, 31, 9, 0, tzinfo=UTC)
SPEC: dict[str, Any] = {
    "name": "digits",
    "trial": {"command": "python train.py --lr {lr} --width {width}", "params": {"epochs": 5}},
    "parameters": {
        "width": {"type": "int", "low": 16, "high": 128},
        "lr": {"type": "float", "low": 1e-4, "high": 0.1, "log": True},
        "adam": {"type": "categorical", "choices": [True, False]},
    },
    "objective": {"metric": "val_acc", "direction": "maximize"},
    "algorithm": "random",
    "max_trials": 3,
}


def trial(number: int, state: TrialState, **fields: Any) -> TrialRead:
    base: dict[str, Any] = {"study_id": "st-1", "number": number, "state": state, "params": {}, "created_at": NOW}
    return TrialRead(**(base | fields))


def study(state: StudyState, **fields: Any) -> StudyRead:
    base: dict[str, Any] = {
        "id": "st-1",
        "name": "digits",
        "org_id": "org-1",
        "user_id": "usr-1",
        "state": state,
        "spec": StudySpec.model_validate(SPEC),
        "planned_trials": 3,
        "trials": TrialCounts(),
        "created_at": NOW,
        "updated_at": NOW,
    }
    return StudyRead(**(base | fields))


def test_the_csv_has_one_column_per_parameter_in_the_search_spaces_order() -> None:
    trials = [
        trial(
            0,
            TrialState.SUCCEEDED,
            params={"width": 64, "lr": 0.0123, "adam": True, "epochs": 5},
            value=0.9375,
            job_id="job-a",
            duration_seconds=12.5,
        ),
        trial(1, TrialState.PRUNED, params={"width": 16, "lr": 0.05, "adam": False}, pruned_step=2, job_id="job-b"),
        trial(2, TrialState.RUNNING, params={"width": 32}),
    ]
    names = parameter_names(trials, StudySpec.model_validate(SPEC))
    assert names == ["width", "lr", "adam", "epochs"]  # the space's order, then the trial spec's fixed params
    fh = io.StringIO()
    assert write_trials_csv(fh, trials, names) == 3
    rows = list(csv.reader(io.StringIO(fh.getvalue())))
    assert rows[0] == [
        "number",
        "state",
        "value",
        "param.width",
        "param.lr",
        "param.adam",
        "param.epochs",
        "pruned_step",
        "job_id",
        "duration_seconds",
    ]
    assert rows[1] == ["0", "SUCCEEDED", "0.9375", "64", "0.0123", "true", "5", "", "job-a", "12.5"]
    assert rows[2] == ["1", "PRUNED", "", "16", "0.05", "false", "", "2", "job-b", ""]
    assert rows[3] == ["2", "RUNNING", "", "32", "", "", "", "", "", ""]
    assert parameter_names(trials) == ["adam", "epochs", "lr", "width"]  # without the spec: sorted


def test_the_submit_body_is_checked_here_and_names_the_field() -> None:
    body = study_body(SPEC, "a" * 64)
    assert body["code_sha256"] == "a" * 64 and body["spec"]["parameters"]["lr"]["log"] is True
    bad = {**SPEC, "parameters": {"lr": {"type": "float", "low": 2, "high": 1}}}
    with pytest.raises(ValidationError, match="low: 2 is above high"):
        study_body(bad, None)


class ScriptedStudies(StudiesMixin):
    """``get_study`` and ``study_trials`` answer from a script, one step per poll: the iteration logic of
    ``follow_study`` without a server (the end-to-end test follows a real one)."""

    def __init__(self, steps: list[tuple[StudyRead, list[TrialRead]]]) -> None:
        self.steps = steps
        self.polls = 0

    def get_study(self, study_id: str) -> StudyRead:
        return self.steps[min(self.polls, len(self.steps) - 1)][0]

    def study_trials(self, study_id: str, order: str = "objective") -> list[TrialRead]:
        assert order == "number"
        answer = self.steps[min(self.polls, len(self.steps) - 1)][1]
        self.polls += 1
        return answer


def test_follow_yields_each_ended_trial_once_and_returns_the_ended_study() -> None:
    running = study(StudyState.RUNNING)
    ended = study(StudyState.SUCCEEDED, reason="Completed")
    steps = [
        (running, [trial(0, TrialState.RUNNING), trial(1, TrialState.RUNNING)]),
        (running, [trial(0, TrialState.SUCCEEDED, value=0.5), trial(1, TrialState.RUNNING)]),
        (running, [trial(0, TrialState.SUCCEEDED, value=0.5), trial(1, TrialState.PRUNED, pruned_step=1)]),
        # The study ended while a trial still shows RUNNING: follow waits for that trial's end too.
        (ended, [trial(0, TrialState.SUCCEEDED), trial(1, TrialState.PRUNED), trial(2, TrialState.RUNNING)]),
        (ended, [trial(0, TrialState.SUCCEEDED), trial(1, TrialState.PRUNED), trial(2, TrialState.CANCELLED)]),
    ]
    scripted = ScriptedStudies(steps)
    follow = scripted.follow_study("st-1", poll=0)
    seen = []
    with pytest.raises(StopIteration) as stop:
        while True:
            seen.append(next(follow))
    assert [(t.number, t.state) for t in seen] == [
        (0, TrialState.SUCCEEDED),
        (1, TrialState.PRUNED),
        (2, TrialState.CANCELLED),
    ]
    assert stop.value.value is ended and scripted.polls == 5


def test_follow_gives_up_on_a_trial_that_never_ends_once_the_settle_time_is_over() -> None:
    ended = study(StudyState.STOPPED)
    scripted = ScriptedStudies([(ended, [trial(0, TrialState.RUNNING)])])
    assert list(scripted.follow_study("st-1", poll=0, settle=0)) == []
    assert scripted.polls >= 1


def test_client_studies_is_the_same_calls_under_shorter_names() -> None:
    client = Client("http://127.0.0.1:9", "AK", "SK")
    try:
        assert isinstance(client.studies, Studies)
        names = {"create", "list", "get", "trials", "best", "stop", "events", "wait", "follow", "export_csv"}
        assert names <= set(dir(client.studies))
        with pytest.raises(ValueError, match="order"):
            client.study_trials("st-1", order="value")  # refused here, before any request
    finally:
        client.close()

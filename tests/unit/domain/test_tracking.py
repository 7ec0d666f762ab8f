"""What a run is: a job's run status from its state, params as numbers where they are ones, valid keys."""

from __future__ import annotations

import math

import pytest

from kiln.domain import tracking
from kiln.domain.states import JobState


def test_every_job_state_has_a_run_status_and_back() -> None:
    for state in JobState:
        status = tracking.run_status(state)
        assert status in tracking.RUN_STATUSES and str(state) in tracking.job_states(status)
    assert tracking.run_status("SUCCEEDED") == "FINISHED" and tracking.run_status("CANCELLED") == "KILLED"
    assert tracking.job_states("SCHEDULED") == ["QUEUED", "STARTING"]


def test_a_param_is_a_number_only_where_its_text_is_a_finite_one() -> None:
    assert [tracking.param_number(t) for t in ("0.01", " 64 ", "1e-3", "-2")] == [0.01, 64.0, 0.001, -2.0]
    assert [tracking.param_number(t) for t in ("adam", "nan", "inf", "", "1,5")] == [None] * 5
    assert [tracking.param_text(v) for v in (True, False, 3, 0.5, "x")] == ["true", "false", "3", "0.5", "x"]
    assert not math.isnan(tracking.param_number("1e308") or 0)


def test_keys_are_mlflows_alphabet_and_never_climb_out() -> None:
    for good in ("lr", "val/acc", "layer.0.weight", "time: s", "a-b_c"):
        assert tracking.check_key(good, "metric") == good
    for bad in ("", "a" * 251, "../x", "/abs", "a/../b", "tab\there", "semi;colon", "new\nline"):
        with pytest.raises(ValueError, match="metric"):
            tracking.check_key(bad, "metric")


def test_a_jobs_mlflow_environment_points_at_its_own_run() -> None:
    assert tracking.tracking_env("http://10.0.2.2:8080/", "job-1") == {
        "MLFLOW_TRACKING_URI": "http://10.0.2.2:8080/mlflow",
        "MLFLOW_RUN_ID": "job-1",
    }

"""The runs table a person reads (kiln.domain.run_table), from rows in a real database through the tracking use case,
the MLflow protocol's answer and the SDK's reading of it to ``kiln runs list``: an experiment holding a study's
trials (one pruned), a notebook's run, a service replica's and plain trainings — the mix a tester's Default held.

A pruned trial's run said CANCELLED with empty metric columns; the default columns were the first params
alphabetically (a notebook's base_url, a replica's max_batch_size); floats printed as 0.00012009732465102296; the
table was ~200 columns wide with ids folded over two lines."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kiln.api.mlflow import _run as mlflow_run
from kiln.cli import common
from kiln.cli import runs as runs_cli
from kiln.db.session import Database
from kiln.db.tables import Experiment, Job, Run, TuningStudy, TuningTrial
from kiln.domain.run_table import default_columns
from kiln.domain.tracking import Batch
from kiln.metrics.store import MetricsStore
from kiln.sdk.tracking import TrackedRun
from kiln.sdk.tracking import _run as sdk_run
from kiln.usecases.identity import Principal
from kiln.usecases.tracking import TrackingService
from tests.helpers import acme_database

ANN = Principal("usr-1", "ann", "org-1", "acme", "AK1", "member", False)
LR = 0.00012009732465102296  # what a sampler gives
TRIALS = {  # job id: (trial state, job state, lr, val_acc points)
    "job-01trial0000000": ("SUCCEEDED", "SUCCEEDED", LR, [0.52, 0.81, 0.9123456]),
    "job-01trial0000001": ("PRUNED", "CANCELLED", 0.0831, [0.11]),
    "job-01trial0000002": ("RUNNING", "RUNNING", 0.0012, [0.4, 0.6]),
}


@pytest.fixture
def tracking(tmp_path: Path) -> Iterator[TrackingService]:
    db = acme_database(f"sqlite:///{tmp_path / 'kiln.db'}")
    service = TrackingService(db, MetricsStore(db))
    _world(db, service)
    yield service
    db.dispose()


def _job_run(s: Any, job_id: str, name: str, state: str, experiment_id: str, start: int) -> None:
    s.add(Job(id=job_id, org_id="org-1", user_id="usr-1", name=name, spec={}, state=state))
    s.flush()
    s.add(
        Run(
            id=job_id,
            org_id="org-1",
            experiment_id=experiment_id,
            job_id=job_id,
            user_id="usr-1",
            name=name,
            status="RUNNING",
            start_time=start,
            lifecycle_stage="active",
        )
    )


def _world(db: Database, service: TrackingService) -> None:
    with db.transaction() as s:
        s.add(Experiment(id="exp-mixed", org_id="org-1", name="mixed"))
        s.add(
            TuningStudy(
                id="std-1",
                org_id="org-1",
                user_id="usr-1",
                name="digits",
                spec={"objective": {"metric": "val_acc", "direction": "maximize"}},
                state="RUNNING",
                planned_trials=3,
            )
        )
        s.flush()
        for number, (job_id, (trial_state, job_state, _, points)) in enumerate(TRIALS.items()):
            _job_run(s, job_id, f"digits-trial-{number}", job_state, "exp-mixed", 1_000 + number)
            s.add(
                TuningTrial(
                    study_id="std-1",
                    number=number,
                    optuna_trial_id=number,
                    job_id=job_id,
                    state=trial_state,
                    params={},
                    last_step=len(points) - 1,
                    last_value=points[-1],
                )
            )
        _job_run(s, "job-01notebook0000", "explore", "RUNNING", "exp-mixed", 900)
        _job_run(s, "job-01replica00000", "digits-svc-r1", "RUNNING", "exp-mixed", 901)
        for k in range(2):
            _job_run(s, f"job-01training000{k}", f"train-{k}", "SUCCEEDED", "exp-mixed", 950 + k)
    for job_id, (_, _, lr, points) in TRIALS.items():
        metrics = [{"key": "val_acc", "value": v, "timestamp": 1, "step": i} for i, v in enumerate(points)]
        if job_id != "job-01trial0000001":  # the pruned trial's job was stopped before it wrote its loss
            metrics.append({"key": "loss", "value": 1 / 3, "timestamp": 1, "step": 0})
        service.log(ANN, job_id, Batch(metrics=metrics, params={"lr": str(lr), "width": "64", "epochs": "10"}))
    service.log(ANN, "job-01notebook0000", Batch(params={"base_url": "/notebooks/nb-1/", "idle": "7200"}))
    service.log(ANN, "job-01replica00000", Batch(params={"max_batch_size": "32"}))
    for k in range(2):
        loss = [{"key": "loss", "value": 0.5 + k, "timestamp": 1, "step": 0}]
        service.log(ANN, f"job-01training000{k}", Batch(metrics=loss, params={"lr": f"0.0{k + 1}", "width": "64"}))


def _rows(tracking: TrackingService) -> list[TrackedRun]:
    """The runs as ``kiln runs list`` reads them: the use case's views, as the MLflow protocol answers them, as the
    SDK parses that answer."""
    views, _ = tracking.search_runs(ANN, ["exp-mixed"])
    return [sdk_run(json.loads(json.dumps(mlflow_run(v)))) for v in views]


def test_a_pruned_trials_run_says_pruned_with_its_last_objective_and_states_are_kiln_s(
    tracking: TrackingService,
) -> None:
    runs = {r.id: r for r in _rows(tracking)}
    pruned = runs["job-01trial0000001"]
    assert pruned.status == "KILLED"  # MLflow's clients still read MLflow's status
    assert pruned.state == "PRUNED" and pruned.metrics["val_acc"] == pytest.approx(0.11)
    assert pruned.tags["kiln.objective"] == "val_acc" and pruned.tags["kiln.objective.direction"] == "maximize"
    assert runs["job-01trial0000000"].state == "SUCCEEDED" and runs["job-01trial0000000"].status == "FINISHED"
    assert runs["job-01trial0000002"].state == "RUNNING"
    assert "kiln.objective" not in runs["job-01notebook0000"].tags


def test_the_default_columns_are_the_objective_the_params_that_differ_and_the_common_metrics(
    tracking: TrackingService,
) -> None:
    columns = default_columns(_rows(tracking))
    # width and epochs are the same in every run that has them; base_url, idle, max_batch_size one run's each
    assert columns == ["metrics.val_acc", "params.lr", "metrics.loss"]


@contextmanager
def _client_of(runs: list[TrackedRun]) -> Iterator[Any]:
    class Client:
        def search_runs(self, *args: Any, **kwargs: Any) -> list[TrackedRun]:
            return runs

    yield Client()


def test_kiln_runs_list_fits_80_columns_with_whole_ids_rounded_numbers_and_pruned(
    tracking: TrackingService, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = _rows(tracking)
    monkeypatch.setattr(runs_cli, "connect", lambda: _client_of(rows))
    monkeypatch.setattr(common.out, "width", 80)
    monkeypatch.setattr(common.err, "width", 80)
    result = CliRunner().invoke(runs_cli.app, ["list", "-e", "mixed"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), "\n" + result.stdout
    header = lines[0].split()
    assert header[:4] == ["RUN", "NAME", "STATE", "metrics.val_acc"], header
    by_id = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(by_id) == {r.id for r in rows}  # every id whole, on its own line
    assert by_id["job-01trial0000001"][1:4] == ["digits-trial-1", "PRUNED", "0.11"]
    assert by_id["job-01trial0000000"][1:5] == ["digits-trial-0", "SUCCEEDED", "0.9123", "0.0001201"]
    assert "left out to fit 80 columns: metrics.loss" in result.stderr and "--columns" in result.stderr
    as_json = CliRunner().invoke(runs_cli.app, ["list", "-e", "mixed", "-o", "json"])
    first = next(r for r in json.loads(as_json.stdout) if r["id"] == "job-01trial0000000")
    assert first["params"]["lr"] == str(LR) and first["metrics"]["val_acc"] == 0.9123456  # unrounded

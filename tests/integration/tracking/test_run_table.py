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
from sqlalchemy import event
from sqlalchemy.engine import Engine
from typer.testing import CliRunner

from kiln.api.mlflow import _run as mlflow_run
from kiln.cli import common
from kiln.cli import runs as runs_cli
from kiln.db.session import Database
from kiln.db.tables import Experiment, Job, Run, TuningStudy, TuningTrial
from kiln.domain.run_table import default_columns
from kiln.domain.tracking import Batch
from kiln.errors import InvalidInput, NotFound
from kiln.metrics.store import MetricsStore
from kiln.sdk.tracking import TrackedRun
from kiln.sdk.tracking import _run as sdk_run
from kiln.usecases.access.identity import Principal
from kiln.usecases.tracking.tracking import TrackingService
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


def test_a_table_search_sends_the_default_columns_it_chose_as_run_table_does_and_nothing_else(
    tracking: TrackingService,
) -> None:
    """The console's Runs page asks the server to choose its columns (default_columns) and gets only those of each
    run: it was sent every param and metric of every run (5,000 params for a page of 100 runs of 50 params)."""
    page = tracking.search_table(ANN, ["exp-mixed"], default_columns=True)
    assert page.columns == default_columns(_rows(tracking)) == ["metrics.val_acc", "params.lr", "metrics.loss"]
    runs = {v.id: sdk_run(json.loads(json.dumps(mlflow_run(v)))) for v in page.runs}
    assert set(runs) == {r.id for r in _rows(tracking)}
    for run in runs.values():
        assert set(run.params) <= {"lr"} and set(run.metrics) <= {"val_acc", "loss"}, run
        assert not [k for k in run.tags if k.startswith("kiln.label.")]
    assert runs["job-01notebook0000"].params == {}  # its base_url and idle are no column
    pruned = runs["job-01trial0000001"]  # its objective's last value as the pruner saw it, its state
    assert pruned.state == "PRUNED" and pruned.metrics == {"val_acc": pytest.approx(0.11)}
    assert pruned.tags["kiln.objective"] == "val_acc"
    assert runs["job-01training0001"].params == {"lr": "0.02"} and runs["job-01training0001"].metrics == {"loss": 1.5}


def test_a_table_search_sends_the_columns_asked_for_and_mlflows_search_everything(tracking: TrackingService) -> None:
    page = tracking.search_table(ANN, ["exp-mixed"], columns=["params.width", "tags.kiln.objective"])
    assert page.columns is None
    assert {v.id: v.params for v in page.runs}["job-01trial0000000"] == {"width": "64"}
    assert all(not v.metrics and set(v.params) <= {"width"} for v in page.runs)
    views, _ = tracking.search_runs(ANN, ["exp-mixed"])  # MLflow's clients: every param and metric, as before
    whole = {v.id: v for v in views}
    assert whole["job-01notebook0000"].params == {"base_url": "/notebooks/nb-1/", "idle": "7200"}
    assert {p.key for p in whole["job-01trial0000000"].metrics} == {"val_acc", "loss"}
    with pytest.raises(InvalidInput, match="columns"):
        tracking.search_table(ANN, ["exp-mixed"], columns=["lr"])


def test_a_table_search_names_its_experiment(tracking: TrackingService) -> None:
    """The console's first search names the experiment (no look-up of its id before it, so public/early.js sends
    it while the bundle loads); by name or by id, the same runs in the same order."""
    by_name = tracking.search_table(ANN, [], experiment_names=["mixed"], order_by=["metrics.loss DESC"])
    by_id = tracking.search_table(ANN, ["exp-mixed"], order_by=["metrics.loss DESC"])
    assert [v.id for v in by_name.runs] == [v.id for v in by_id.runs] and len(by_id.runs) == 7
    with pytest.raises(NotFound):
        tracking.search_table(ANN, [], experiment_names=["no-such"])


def test_a_search_sorted_by_a_metric_is_the_databases_from_an_index_ties_and_missing_last_paged_stably(
    tracking: TrackingService,
) -> None:
    """Sorted by a metric, the database orders every run by its last value (an index of each series' name, run and
    last value: no series row read), ties newest first, runs without the metric last, and pages follow on."""
    statements: list[tuple[str, Any]] = []

    def seen(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        if "ORDER BY" in statement and "metric_series" in statement and not many:
            statements.append((statement, parameters))

    event.listen(Engine, "before_cursor_execute", seen)  # the read engine's too
    try:
        pages, token = [], None
        while True:
            page = tracking.search_table(
                ANN, ["exp-mixed"], order_by=["metrics.loss DESC"], max_results=2, page_token=token, columns=[]
            )
            pages.append([v.id for v in page.runs])
            if not (token := page.next_page_token):
                break
    finally:
        event.remove(Engine, "before_cursor_execute", seen)
    # loss: training-1 1.5, training-0 0.5; the three trials 1/3 each except the pruned one (none), newest first;
    # the notebook, the replica and the pruned trial have none: last, newest first.
    assert [len(p) for p in pages] == [2, 2, 2, 1]
    assert [run for p in pages for run in p] == [
        "job-01training0001",
        "job-01training0000",
        "job-01trial0000002",
        "job-01trial0000000",
        "job-01trial0000001",
        "job-01replica00000",
        "job-01notebook0000",
    ]
    statement, parameters = statements[0]
    with tracking.db.engine.connect() as conn:
        plan = " ".join(str(row[-1]) for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters))
    assert "COVERING INDEX ix_metric_series_name_job_value" in plan, plan

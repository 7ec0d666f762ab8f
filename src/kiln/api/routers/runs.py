"""Runs (MLflow's: every job is one, and so is every run logged with MLflow's client): their metrics compared,
downsampled on the server, in one request; and the experiments listed with their run counts. The runs themselves
are read and written through MLflow's protocol at /mlflow (kiln.api.mlflow); its ``metrics/get-history`` sends
every point, which a chart of runs of a million points each cannot wait for."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import Response
from pydantic import StringConstraints

from kiln.api.deps import Caller, Kiln, model_response
from kiln.api.params import Step
from kiln.api.responses import errors
from kiln.api.routers.metrics import Downsample, Worker
from kiln.domain import limits
from kiln.domain.models import RunModelVersions
from kiln.domain.schemas import ExperimentList, RunMetrics
from kiln.domain.tracking import MAX_KEY
from kiln.usecases.tracking.metrics import SeriesQuery

router = APIRouter(tags=["runs"], responses=errors(403))

RunIds = Annotated[
    list[Annotated[str, StringConstraints(max_length=limits.MAX_ID_LENGTH)]],
    Query(
        min_length=1,
        max_length=limits.MAX_COMPARE_JOBS,
        description=f"A run id, repeated for each run (at most {limits.MAX_COMPARE_JOBS}); a job's run is its job id",
    ),
]
MAX_NAMES = 20  # with 50 run ids, the longest request (every value percent-encoded) stays under the head limit
MetricNames = Annotated[
    list[Annotated[str, StringConstraints(max_length=MAX_KEY)]] | None,
    Query(
        max_length=MAX_NAMES,
        description=f"A metric name, repeated for each metric (at most {MAX_NAMES}; default: every metric of the runs)",
    ),
]


@router.get(
    "/runs/metrics",
    response_model=RunMetrics,
    summary="The same metrics of several runs, downsampled (404 if any of them is not your organisation's)",
    responses=errors(404, 422),
)
def compare_run_metrics(
    caller: Caller,
    kiln: Kiln,
    run: RunIds,
    name: MetricNames = None,
    worker: Worker = None,
    step_min: Step = None,
    step_max: Step = None,
    downsample: Downsample = None,
) -> Response:
    run_ids = list(dict.fromkeys(run))
    names = list(dict.fromkeys(n for n in name or [] if n)) or None
    data = kiln.metrics.compare_runs(caller, run_ids, SeriesQuery(names, worker, step_min, step_max, downsample))
    return model_response(RunMetrics.model_construct(runs=data))


@router.get(
    "/runs/{run_id}/model-versions",
    response_model=RunModelVersions,
    summary="The model versions registered from a run (--from-run, or --from-job of the job that is the run)",
    responses=errors(404, 422),
)
def run_model_versions(
    run_id: Annotated[str, Path(max_length=limits.MAX_ID_LENGTH)], caller: Caller, kiln: Kiln
) -> RunModelVersions:
    return RunModelVersions(run_id=run_id, items=kiln.models.versions_of_run(caller, run_id))


@router.get(
    "/experiments",
    response_model=ExperimentList,
    summary="The organisation's experiments, each with its run count and when its newest run started",
    responses=errors(422),
)
def list_experiments(
    caller: Caller,
    kiln: Kiln,
    deleted: Annotated[bool, Query(description="The deleted experiments instead of the active ones")] = False,
    name: Annotated[str | None, Query(max_length=256, description="Only the experiment of this name")] = None,
) -> ExperimentList:
    view = "DELETED_ONLY" if deleted else "ACTIVE_ONLY"
    return ExperimentList(items=kiln.tracking.list_experiments(caller, view, name))

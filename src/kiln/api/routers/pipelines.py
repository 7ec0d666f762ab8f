"""Pipelines: start a run of a pipeline spec, read and list runs, cancel one, resume one; run one on a schedule."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from kiln.api.deps import Caller, Kiln
from kiln.api.responses import errors
from kiln.domain import limits
from kiln.domain.pipelines import (
    PipelineDryRun,
    PipelineRunList,
    PipelineRunRead,
    PipelineScheduleList,
    PipelineScheduleRead,
    PipelineScheduleSubmit,
    PipelineSubmit,
)

router = APIRouter(prefix="/pipelines", tags=["pipelines"], responses=errors(403))
RunId = Annotated[
    str, Path(max_length=limits.MAX_ID_LENGTH, description="A pipeline run's id, e.g. prun-01jd5y3c2k7q4m9x2a")
]


@router.post(
    "/runs",
    response_model=PipelineRunRead,
    status_code=201,
    summary="Start a run of a pipeline: its steps checked whole (422 naming steps.STEP.field), then driven",
    responses=errors(400, 422),
)
def create_pipeline_run(body: PipelineSubmit, caller: Caller, kiln: Kiln) -> PipelineRunRead:
    return kiln.pipelines.submit(caller, body)


@router.post(
    "/runs:dry-run",
    response_model=PipelineDryRun,
    summary="Check a run of a pipeline as POST /pipelines/runs would (its code aside), creating nothing",
    description="The SDK and CLI ask this before they upload the steps' code, so that a pipeline that would be "
    "refused uploads nothing. A custom method on the collection, as POST /jobs:dry-run.",
    responses=errors(400, 422),
)
def dry_run_pipeline(body: PipelineSubmit, caller: Caller, kiln: Kiln) -> PipelineDryRun:
    return kiln.pipelines.dry_run(caller, body)


@router.get("/runs", response_model=PipelineRunList, summary="Pipeline runs, newest first", responses=errors(422))
def list_pipeline_runs(
    caller: Caller,
    kiln: Kiln,
    name: Annotated[str | None, Query(max_length=128, description="Only runs of this pipeline")] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> PipelineRunList:
    return PipelineRunList(items=kiln.pipelines.list_runs(caller, name, limit))


@router.get("/runs/{run_id}", response_model=PipelineRunRead, responses=errors(404, 422))
def get_pipeline_run(run_id: RunId, caller: Caller, kiln: Kiln) -> PipelineRunRead:
    return kiln.pipelines.get(caller, run_id)


@router.post(
    "/runs/{run_id}/cancel",
    response_model=PipelineRunRead,
    summary="Cancel a running run: waiting steps cancelled, running steps' jobs cancelled",
    responses=errors(404, 409, 422),
)
def cancel_pipeline_run(run_id: RunId, caller: Caller, kiln: Kiln) -> PipelineRunRead:
    return kiln.pipelines.cancel(caller, run_id)


@router.post(
    "/runs/{run_id}/resume",
    response_model=PipelineRunRead,
    summary="Resume a failed or cancelled run: its failed, skipped and cancelled steps run again",
    responses=errors(404, 409, 422),
)
def resume_pipeline_run(run_id: RunId, caller: Caller, kiln: Kiln) -> PipelineRunRead:
    return kiln.pipelines.resume(caller, run_id)


ScheduleId = Annotated[
    str, Path(max_length=limits.MAX_ID_LENGTH, description="A pipeline schedule's id, e.g. psch-01jd5y3c2k7q4m9x")
]


@router.post(
    "/schedules",
    response_model=PipelineScheduleRead,
    status_code=201,
    summary="Run a pipeline on a cron schedule (UTC): checked whole now, each run's job steps again when it starts",
    responses=errors(400, 422),
)
def create_pipeline_schedule(body: PipelineScheduleSubmit, caller: Caller, kiln: Kiln) -> PipelineScheduleRead:
    return kiln.pipelines.schedule(caller, body)


@router.get("/schedules", response_model=PipelineScheduleList, summary="Pipeline schedules")
def list_pipeline_schedules(caller: Caller, kiln: Kiln) -> PipelineScheduleList:
    return PipelineScheduleList(items=kiln.pipelines.list_schedules(caller))


@router.delete(
    "/schedules/{schedule_id}", status_code=204, summary="Stop a pipeline schedule", responses=errors(404, 422)
)
def delete_pipeline_schedule(schedule_id: ScheduleId, caller: Caller, kiln: Kiln) -> Response:
    kiln.pipelines.unschedule(caller, schedule_id)
    return Response(status_code=204)

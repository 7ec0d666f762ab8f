"""Metrics: ingest spool lines over HTTP, query series (downsampled), summaries, comparisons, CSV."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from kiln.api.deps import Caller, Kiln, model_response
from kiln.api.params import JobId, Step
from kiln.api.responses import errors, raw_body
from kiln.domain import limits
from kiln.domain.schemas import MetricsCompare, MetricsData, MetricsIngested, MetricsSummary
from kiln.errors import PayloadTooLarge
from kiln.usecases.tracking.metrics import SeriesQuery

router = APIRouter(tags=["metrics"], responses=errors(403))

MAX_BODY = 8 * 1024 * 1024
CSV = "text/csv"

Names = Annotated[
    str | None,
    Query(max_length=limits.MAX_QUERY_LIST_LENGTH, description="Comma-separated metric names (default: all)"),
]
Worker = Annotated[str | None, Query(max_length=64, description="Only this member, e.g. worker0")]
Downsample = Annotated[
    int | None,
    Query(ge=4, le=limits.MAX_DOWNSAMPLE, description="At most this many points per series, keeping its shape"),
]
Format = Annotated[
    str, Query(max_length=4, pattern="^(json|csv)$", description="json, or csv (job_id,worker,name,step,time,value)")
]
NDJSON_BODY = raw_body("application/x-ndjson")


def _names(names: str | None) -> list[str] | None:
    out = [n.strip() for n in (names or "").split(",") if n.strip()]
    return out or None


def _csv(kiln: Kiln, data: dict[str, list]) -> StreamingResponse:  # type: ignore[type-arg]
    return StreamingResponse(kiln.metrics.csv_rows(data), media_type=CSV)


@router.post(
    "/jobs/{job_id}/metrics",
    response_model=MetricsIngested,
    summary="Send metric spool lines (ndjson; a job with its job token, or a member with jobs:write)",
    responses=errors(404, 422),
    openapi_extra=NDJSON_BODY,
)
async def post_metrics(job_id: JobId, request: Request, caller: Caller, kiln: Kiln) -> Response:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise PayloadTooLarge(f"metrics body over {MAX_BODY} bytes; send smaller batches")
        chunks.append(chunk)
    result = await run_in_threadpool(kiln.metrics.ingest, caller, job_id, b"".join(chunks))
    return model_response(result)


@router.get(
    "/jobs/{job_id}/metrics",
    response_model=MetricsData,
    summary="A job's metric series as [step, time, value] points",
    responses={200: {"content": {CSV: {}}}, **errors(404, 422)},
)
def get_metrics(
    job_id: JobId,
    caller: Caller,
    kiln: Kiln,
    names: Names = None,
    worker: Worker = None,
    step_min: Step = None,
    step_max: Step = None,
    downsample: Downsample = None,
    format: Format = "json",
) -> Response:
    q = SeriesQuery(_names(names), worker, step_min, step_max, downsample)
    series = kiln.metrics.query(caller, job_id, q)
    if format == "csv":
        return _csv(kiln, {job_id: series})
    return model_response(MetricsData.model_construct(series=series))


@router.get(
    "/jobs/{job_id}/metrics/summary",
    response_model=MetricsSummary,
    summary="Per series: count, first and last step, last value, min and max",
    responses=errors(404, 422),
)
def metrics_summary(job_id: JobId, caller: Caller, kiln: Kiln) -> Response:
    return model_response(MetricsSummary(series=kiln.metrics.summary(caller, job_id)))


@router.get(
    "/metrics/compare",
    response_model=MetricsCompare,
    summary="The same metrics of several jobs (404 if any of them is not yours to read)",
    responses={200: {"content": {CSV: {}}}, **errors(404, 422)},
)
def compare_metrics(
    caller: Caller,
    kiln: Kiln,
    jobs: Annotated[
        str,
        Query(
            max_length=limits.MAX_COMPARE_JOBS * (limits.MAX_ID_LENGTH + 1),
            description=f"Comma-separated job ids (at most {limits.MAX_COMPARE_JOBS})",
        ),
    ],
    names: Names = None,
    worker: Worker = None,
    step_min: Step = None,
    step_max: Step = None,
    downsample: Downsample = None,
    format: Format = "json",
) -> Response:
    job_ids = list(dict.fromkeys(j.strip() for j in jobs.split(",") if j.strip()))
    q = SeriesQuery(_names(names), worker, step_min, step_max, downsample)
    data = kiln.metrics.compare(caller, job_ids, q)
    if format == "csv":
        return _csv(kiln, data)
    return model_response(MetricsCompare.model_construct(jobs=data))

"""Metrics: ingest spool lines over HTTP, query series (downsampled), summaries, comparisons, CSV."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from kiln.api.deps import Caller, Kiln, model_response
from kiln.domain.schemas import MetricsCompare, MetricsData, MetricsIngested, MetricsSummary
from kiln.errors import PayloadTooLarge
from kiln.services.metrics import SeriesQuery

router = APIRouter(tags=["metrics"])

MAX_BODY = 8 * 1024 * 1024
CSV = "text/csv"

Names = Annotated[str | None, Query(description="Comma-separated metric names (default: all)")]
Downsample = Annotated[
    int | None, Query(ge=4, le=20_000, description="At most this many points per series, keeping its shape")
]
Format = Annotated[str, Query(pattern="^(json|csv)$", description="json, or csv (job_id,worker,name,step,time,value)")]


def _names(names: str | None) -> list[str] | None:
    out = [n.strip() for n in (names or "").split(",") if n.strip()]
    return out or None


def _csv(kiln: Kiln, data: dict[str, list]) -> StreamingResponse:  # type: ignore[type-arg]
    return StreamingResponse(kiln.metrics.csv_rows(data), media_type=CSV)


@router.post(
    "/jobs/{job_id}/metrics",
    response_model=MetricsIngested,
    summary="Send metric spool lines (ndjson; a job with its job token, or a member with jobs:write)",
)
async def post_metrics(job_id: str, request: Request, caller: Caller, kiln: Kiln) -> Response:
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
    responses={200: {"content": {CSV: {}}}},
)
def get_metrics(
    job_id: str,
    caller: Caller,
    kiln: Kiln,
    names: Names = None,
    worker: Annotated[str | None, Query(description="Only this member, e.g. worker0")] = None,
    step_min: Annotated[int | None, Query()] = None,
    step_max: Annotated[int | None, Query()] = None,
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
)
def metrics_summary(job_id: str, caller: Caller, kiln: Kiln) -> Response:
    return model_response(MetricsSummary(series=kiln.metrics.summary(caller, job_id)))


@router.get(
    "/metrics/compare",
    response_model=MetricsCompare,
    summary="The same metrics of several jobs (404 if any of them is not yours to read)",
    responses={200: {"content": {CSV: {}}}},
)
def compare_metrics(
    caller: Caller,
    kiln: Kiln,
    jobs: Annotated[str, Query(description="Comma-separated job ids")],
    names: Names = None,
    worker: Annotated[str | None, Query()] = None,
    step_min: Annotated[int | None, Query()] = None,
    step_max: Annotated[int | None, Query()] = None,
    downsample: Downsample = None,
    format: Format = "json",
) -> Response:
    job_ids = list(dict.fromkeys(j.strip() for j in jobs.split(",") if j.strip()))
    q = SeriesQuery(_names(names), worker, step_min, step_max, downsample)
    data = kiln.metrics.compare(caller, job_ids, q)
    if format == "csv":
        return _csv(kiln, data)
    return model_response(MetricsCompare.model_construct(jobs=data))

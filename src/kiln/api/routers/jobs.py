"""Jobs: submit (or check a submit: a dry run), read, list, cancel, rerun, delete, events, logs, artifacts,
checkpoints and the images in their TensorBoard event files."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Query, Request
from fastapi.responses import RedirectResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from kiln.api.deps import Caller, Kiln, caller_of, model_response, platform_of
from kiln.api.idempotency import Idempotent, mark_replayed, replayable
from kiln.api.params import FilePath, JobId
from kiln.api.responses import REDIRECT, errors, links, raw_body, with_links
from kiln.auth import signing
from kiln.domain import limits
from kiln.domain.job_requests import JobDryRun, JobRerun
from kiln.domain.schemas import (
    ArtifactList,
    ArtifactRead,
    EventList,
    JobList,
    JobRead,
    JobSubmit,
    TensorBoardImageList,
)
from kiln.domain.states import JobState
from kiln.errors import PayloadTooLarge
from kiln.metrics.tbimages import MAX_IMAGES, MEDIA_TYPES
from kiln.usecases.data.outputs import FileKind
from kiln.usecases.jobs.job_removal import JobRemoval

router = APIRouter(prefix="/jobs", tags=["jobs"], responses=errors(403))
JOB = {"job_id": "$response.body#/id"}
BINARY_BODY = raw_body("application/octet-stream")
TEXT_BODY = raw_body("text/plain")


@router.post(
    "",
    response_model=JobRead,
    status_code=201,
    summary="Submit a job (retry it safely with an Idempotency-Key)",
    responses=replayable(
        with_links(
            (400, 422),
            links(
                201,
                "The job, queued (with Idempotent-Replayed: the job an earlier request with the key created)",
                get_job=JOB,
                job_events=JOB,
                why=JOB,
                job_logs=JOB,
                list_artifacts=JOB,
                list_checkpoints=JOB,
                get_metrics=JOB,
                metrics_summary=JOB,
                cancel_job=JOB,
            ),
        )
    ),
)
def submit_job(body: JobSubmit, caller: Caller, kiln: Kiln, idempotency: Idempotent, response: Response) -> JobRead:
    job = kiln.jobs.submit(caller, body, idempotency)
    mark_replayed(response, idempotency)
    return job


@router.post(
    ":dry-run",
    response_model=JobDryRun,
    summary="Check a job as a submit would (spec, runtime, inputs, resources, quota, permissions); create nothing",
    description="A server-side dry run: the same checks and errors as POST /jobs, nothing created. The answer "
    "holds the spec as the job would get it (inputs pinned) and whether the code bundle is stored already, so a "
    "client uploads its code only once the job is known to be accepted, and only if it is missing.",
    responses=errors(400, 422),
)
def dry_run_job(body: JobSubmit, caller: Caller, kiln: Kiln) -> JobDryRun:
    # Its own route, not POST /jobs?dry_run=true: the audit names a request by its route, and a dry run must not
    # read as a submit there. A custom method on the collection (/jobs:dry-run, as Google's API design guide
    # writes them) rather than /jobs/dry-run, a path that GET and DELETE /jobs/{job_id} would match as well.
    return kiln.jobs.dry_run(caller, body)


@router.get("", response_model=JobList, summary="List jobs, newest first", responses=errors(422))
async def list_jobs(
    request: Request,
    state: Annotated[list[JobState] | None, Query(max_length=32, description="Only these states")] = None,
    limit: Annotated[int, Query(ge=1, le=limits.MAX_PAGE_SIZE)] = 50,
    before: Annotated[
        str | None,
        Query(max_length=limits.MAX_ID_LENGTH, description="Only jobs older than this job id (paging)"),
    ] = None,
) -> Response:
    # A hot read route: served from the list cache in the event loop when nothing changed since the last same
    # query (usecases/jobs/jobs.py), from the database in a worker thread otherwise. The caller and the platform are
    # taken from the request directly (two dependencies fewer to solve per request).
    caller, kiln = caller_of(request), platform_of(request)
    body = kiln.jobs.cached_list_json(caller, states=state, limit=limit, before=before)
    if body is None:
        body = await run_in_threadpool(kiln.jobs.list_jobs_json, caller, states=state, limit=limit, before=before)
    return Response(body, media_type="application/json")


@router.get("/{job_id}", response_model=JobRead, responses=errors(404, 422))
def get_job(job_id: JobId, caller: Caller, kiln: Kiln) -> Response:
    return model_response(kiln.jobs.get(caller, job_id))


@router.get(
    "/{job_id}/events",
    response_model=EventList,
    summary="Every state change and notable event",
    responses=errors(404, 422),
)
def job_events(job_id: JobId, caller: Caller, kiln: Kiln) -> Response:
    return model_response(EventList(items=kiln.jobs.events(caller, job_id)))


@router.post("/{job_id}/cancel", response_model=JobRead, summary="Cancel (idempotent)", responses=errors(404, 409, 422))
def cancel_job(job_id: JobId, caller: Caller, kiln: Kiln) -> JobRead:
    return kiln.jobs.cancel(caller, job_id)


@router.post(
    "/{job_id}/rerun",
    response_model=JobRead,
    status_code=201,
    summary="Submit a new job with this job's spec and code (any state)",
    responses=replayable(
        with_links(
            (400, 404, 409, 422),
            links(201, "The new job, queued", get_job=JOB, job_events=JOB, job_logs=JOB, cancel_job=JOB),
        )
    ),
)
def rerun_job(
    job_id: JobId, caller: Caller, kiln: Kiln, idempotency: Idempotent, response: Response, body: JobRerun | None = None
) -> JobRead:
    job = kiln.jobs.rerun(caller, job_id, body or JobRerun(), idempotency)
    mark_replayed(response, idempotency)
    return job


@router.delete(
    "/{job_id}",
    status_code=204,
    response_class=Response,
    summary="Delete an ended job: its record, events, log, metrics, artifacts and checkpoints",
    responses=errors(404, 409, 422),
)
def delete_job(job_id: JobId, caller: Caller, kiln: Kiln) -> Response:
    removal = JobRemoval(
        kiln.jobs,
        kiln.logs,
        kiln.store,
        kiln.backend,
        spools=kiln.metric_spools,
        drain_metrics=kiln.metrics_ingester.ingest_now,
    )
    removal.delete(caller, job_id)
    return Response(status_code=204)


@router.get(
    "/{job_id}/logs",
    summary="Log lines '<time> <O|E|K> <text>'",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}, **errors(404, 422)},
)
def job_logs(
    job_id: JobId,
    caller: Caller,
    kiln: Kiln,
    offset: Annotated[int, Query(ge=0, le=limits.MAX_INT64, description="Byte offset to start from")] = 0,
    follow: Annotated[bool, Query(description="Stream until the job ends")] = False,
    limit: Annotated[int, Query(ge=1, le=limits.MAX_LOG_READ_BYTES)] = 1024 * 1024,
) -> Response:
    if follow:
        kiln.jobs.get(caller, job_id)  # 404 now: once the stream has started, the status is already 200
        return StreamingResponse(kiln.outputs.follow_log(caller, job_id, offset), media_type="text/plain")
    data, next_offset, ended = kiln.outputs.read_log(caller, job_id, offset, limit)
    headers = {"X-Kiln-Next-Offset": str(next_offset), "X-Kiln-Job-Ended": "true" if ended else "false"}
    return Response(data, media_type="text/plain", headers=headers)


@router.get(
    "/{job_id}/artifacts",
    response_model=ArtifactList,
    summary="Files the job wrote to $KILN_OUTPUT_DIR",
    responses=errors(404, 422),
)
def list_artifacts(job_id: JobId, caller: Caller, kiln: Kiln) -> ArtifactList:
    return ArtifactList(items=kiln.outputs.list_files(caller, job_id, "artifact"))


@router.get(
    "/{job_id}/checkpoints",
    response_model=ArtifactList,
    summary="The job's stored $KILN_CHECKPOINT_DIR (what its next attempt starts from)",
    responses=errors(404, 422),
)
def list_checkpoints(job_id: JobId, caller: Caller, kiln: Kiln) -> ArtifactList:
    return ArtifactList(items=kiln.outputs.list_files(caller, job_id, "checkpoint"))


@router.get(
    "/{job_id}/tensorboard-images",
    response_model=TensorBoardImageList,
    summary="The images in the job's TensorBoard event files: tag, step and where each is, by tag then step",
    responses=errors(404, 422),
)
def tensorboard_images(job_id: JobId, caller: Caller, kiln: Kiln) -> Response:
    return model_response(kiln.outputs.tensorboard_images(caller, job_id))


# An event file's records never change once written: an image, named by its file, offset and index, is the same
# for as long as it exists. Private: it is the organisation's.
IMAGE_CACHE = "private, max-age=86400"


@router.get(
    "/{job_id}/tensorboard-images/image",
    response_class=Response,
    summary="One image of the job's TensorBoard event files, as listed (file, offset, index): PNG, JPEG, GIF or WebP",
    responses={
        200: {
            "description": "The image's bytes",
            "content": {kind: {"schema": {"type": "string", "format": "binary"}} for kind in MEDIA_TYPES},
            "headers": {"Cache-Control": {"schema": {"type": "string"}, "description": IMAGE_CACHE}},
        },
        **errors(400, 404, 422),
    },
)
def tensorboard_image(
    job_id: JobId,
    caller: Caller,
    kiln: Kiln,
    file: Annotated[
        str,
        Query(
            min_length=1,
            max_length=limits.MAX_PATH_LENGTH,
            description="The event file, relative to the job's TensorBoard dir (as listed)",
        ),
    ],
    offset: Annotated[int, Query(ge=0, le=limits.MAX_INT64, description="The byte offset of the image's record")],
    index: Annotated[int, Query(ge=0, lt=MAX_IMAGES, description="Which image of the record")] = 0,
) -> Response:
    data, media_type = kiln.outputs.tensorboard_image(caller, job_id, file, offset, index)
    headers = {"Cache-Control": IMAGE_CACHE, "X-Content-Type-Options": "nosniff"}
    return Response(data, media_type=media_type, headers=headers)


async def at_most(chunks: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    """The chunks of a streamed body, and 413 once they pass ``limit`` bytes."""
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"a file is at most {limit} bytes")
        yield chunk


async def _put_file(
    job_id: str, kind: FileKind, path: str, request: Request, caller: Caller, kiln: Kiln
) -> ArtifactRead:
    signed = request.headers.get(signing.HEADER_CONTENT.lower())
    expected = signed if signed and signing.SHA256_HEX.fullmatch(signed) else None
    length = request.headers.get("content-length", "")
    if length.isascii() and length.isdigit() and int(length) > limits.MAX_FILE_BYTES:
        raise PayloadTooLarge(f"a file is at most {limits.MAX_FILE_BYTES} bytes, not {length}")
    chunks = at_most(request.stream(), limits.MAX_FILE_BYTES)
    return await kiln.outputs.upload_file(caller, job_id, kind, path, chunks, expected)


@router.put(
    "/{job_id}/artifacts/{path:path}",
    response_model=ArtifactRead,
    status_code=201,
    summary="Upload an artifact (a running job, with its job token)",
    responses=errors(400, 404, 409, 422),
    openapi_extra=BINARY_BODY,
)
async def put_artifact(job_id: JobId, path: FilePath, request: Request, caller: Caller, kiln: Kiln) -> ArtifactRead:
    return await _put_file(job_id, "artifact", path, request, caller, kiln)


@router.put(
    "/{job_id}/checkpoints/{path:path}",
    response_model=ArtifactRead,
    status_code=201,
    summary="Upload a checkpoint file (a running job, with its job token: a pod's sync sidecar)",
    responses=errors(400, 404, 409, 422),
    openapi_extra=BINARY_BODY,
)
async def put_checkpoint(job_id: JobId, path: FilePath, request: Request, caller: Caller, kiln: Kiln) -> ArtifactRead:
    return await _put_file(job_id, "checkpoint", path, request, caller, kiln)


@router.put(
    "/{job_id}/tensorboard/{path:path}",
    response_model=ArtifactRead,
    status_code=201,
    summary="Upload a TensorBoard event file (a running job, with its job token: a pod's sync sidecar)",
    responses=errors(400, 404, 409, 422),
    openapi_extra=BINARY_BODY,
)
async def put_event_file(job_id: JobId, path: FilePath, request: Request, caller: Caller, kiln: Kiln) -> ArtifactRead:
    return await _put_file(job_id, "event", path, request, caller, kiln)


@router.post(
    "/{job_id}/logs",
    summary="Append lines to the job's log (a running job, with its job token)",
    responses=errors(400, 404, 409, 422),
    openapi_extra=TEXT_BODY,
)
async def append_logs(
    job_id: JobId,
    request: Request,
    caller: Caller,
    kiln: Kiln,
    stream: Annotated[
        str,
        Query(
            pattern=r"^[OE](@(worker|ps)[0-9]{1,4})?$",
            max_length=12,
            description="O (stdout) or E (stderr), with the member of a gang: O@worker1, E@ps0",
        ),
    ] = "O",
) -> dict[str, int]:
    body = await request.body()
    return {"lines": await run_in_threadpool(kiln.outputs.append_log, caller, job_id, body, stream)}


@router.get(
    "/{job_id}/code",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/gzip": {}}}, **errors(404, 422)},
    summary="The job's code bundle (tar.gz): what a pod fetches with its job token",
)
def get_code(job_id: JobId, caller: Caller, kiln: Kiln) -> StreamingResponse:
    key, size = kiln.outputs.code_key(caller, job_id)
    return StreamingResponse(
        kiln.store.iter_bytes(key), media_type="application/gzip", headers={"Content-Length": str(size)}
    )


def _file_response(kiln: Kiln, key: str, size: int, path: str, redirect: bool) -> Response:
    """A stored file's bytes, streamed; or, with ``redirect`` and a store that presigns (S3), a 307 to a
    short-lived store URL, as dataset files are served (a client must not send its credentials there)."""
    name = path.rsplit("/", 1)[-1]
    url = kiln.datasets.presigned_get(key, path) if redirect else None
    if url is not None:
        return RedirectResponse(url, status_code=307, headers={"X-Kiln-Size": str(size)})
    return StreamingResponse(
        kiln.store.iter_bytes(key),
        media_type="application/octet-stream",
        headers={"Content-Length": str(size), "Content-Disposition": f"attachment; filename*=UTF-8''{quote(name)}"},
    )


@router.get(
    "/{job_id}/artifacts/{path:path}",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/octet-stream": {}}}, **errors(400, 404, 422)},
)
def get_artifact(job_id: JobId, path: FilePath, caller: Caller, kiln: Kiln) -> Response:
    key, size = kiln.outputs.file_key(caller, job_id, "artifact", path)
    return _file_response(kiln, key, size, path, redirect=False)


@router.get(
    "/{job_id}/checkpoints/{path:path}",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}}, **REDIRECT, **errors(400, 404, 422)},
    summary="A checkpoint file's bytes: streamed, or a 307 redirect to a short-lived store URL (S3)",
)
def get_checkpoint(job_id: JobId, path: FilePath, caller: Caller, kiln: Kiln) -> Response:
    key, size = kiln.outputs.file_key(caller, job_id, "checkpoint", path)
    return _file_response(kiln, key, size, path, redirect=True)

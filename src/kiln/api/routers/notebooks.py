"""Notebooks: create (and start), read, list, start, stop, delete; the home a notebook's launcher restores and
saves; the event files a TensorBoard's launcher reads. JupyterLab (or TensorBoard) itself is reached under
``/notebooks/{id}/`` (kiln.api.notebook_proxy)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from kiln.api.deps import Caller, Kiln
from kiln.api.idempotency import Idempotent, mark_replayed, replayable
from kiln.api.responses import errors, raw_body
from kiln.domain.notebooks import MAX_HOME_BYTES, EventSources, NotebookList, NotebookRead, NotebookSpec
from kiln.errors import InvalidInput, PayloadTooLarge

router = APIRouter(prefix="/notebooks", tags=["notebooks"], responses=errors(403))
NotebookRef = Annotated[str, PathParam(max_length=63, description="A notebook's name or id")]
GZIP = raw_body("application/gzip")


@router.post(
    "",
    response_model=NotebookRead,
    status_code=201,
    summary="Create a notebook (JupyterLab in a runtime) and start it",
    responses=replayable(errors(400, 409, 422)),
)
def create_notebook(
    body: NotebookSpec, caller: Caller, kiln: Kiln, idempotency: Idempotent, response: Response
) -> NotebookRead:
    notebook = kiln.notebooks.create(caller, body, idempotency)
    mark_replayed(response, idempotency)
    return notebook


@router.get("", response_model=NotebookList, summary="List notebooks")
def list_notebooks(caller: Caller, kiln: Kiln) -> NotebookList:
    return NotebookList(items=kiln.notebooks.list_notebooks(caller))


@router.get("/{notebook}", response_model=NotebookRead, responses=errors(404, 422))
def get_notebook(notebook: NotebookRef, caller: Caller, kiln: Kiln) -> NotebookRead:
    return kiln.notebooks.get(caller, notebook)


@router.post(
    "/{notebook}/start",
    response_model=NotebookRead,
    summary="Start a stopped notebook again, with its home",
    responses=errors(404, 409, 422),
)
def start_notebook(notebook: NotebookRef, caller: Caller, kiln: Kiln) -> NotebookRead:
    return kiln.notebooks.start(caller, notebook)


@router.post(
    "/{notebook}/stop",
    response_model=NotebookRead,
    summary="Stop a notebook (its home is saved first)",
    responses=errors(404, 422),
)
def stop_notebook(notebook: NotebookRef, caller: Caller, kiln: Kiln) -> NotebookRead:
    return kiln.notebooks.stop(caller, notebook)


@router.delete(
    "/{notebook}",
    status_code=204,
    response_class=Response,
    summary="Delete a notebook and its home",
    responses=errors(404, 422),
)
def delete_notebook(notebook: NotebookRef, caller: Caller, kiln: Kiln) -> Response:
    kiln.notebooks.delete(caller, notebook)
    return Response(status_code=204)


@router.get(
    "/{notebook}/home",
    summary="The notebook's home as last saved (a gzip'd tar); 204 when it has none yet",
    response_class=Response,
    responses={
        200: {"content": {"application/gzip": {"schema": {"type": "string", "format": "binary"}}}},
        204: {"description": "It has no saved home yet"},
        **errors(404, 422),
    },
)
def get_notebook_home(notebook: NotebookRef, caller: Caller, kiln: Kiln) -> Response:
    handle = kiln.notebooks.open_home(caller, notebook)
    if handle is None:
        return Response(status_code=204)

    def chunks() -> Iterator[bytes]:
        with handle:
            while block := handle.read(1024 * 1024):
                yield block

    return StreamingResponse(chunks(), media_type="application/gzip")


@router.put(
    "/{notebook}/home",
    status_code=204,
    response_class=Response,
    summary="Replace the notebook's home (its launcher, with its job's token)",
    responses=errors(404, 413, 422),
    openapi_extra=GZIP,
)
async def put_notebook_home(notebook: NotebookRef, request: Request, caller: Caller, kiln: Kiln) -> Response:
    length = request.headers.get("content-length", "")
    if not (length.isascii() and length.isdigit()):
        raise InvalidInput("Content-Length: a home is sent whole, with its length")
    if int(length) > MAX_HOME_BYTES:
        raise PayloadTooLarge(f"a notebook home holds at most {MAX_HOME_BYTES} bytes compressed; this is {length}")
    fd, name = tempfile.mkstemp(prefix="kiln-home-")
    path = Path(name)
    try:
        written = 0
        with os.fdopen(fd, "wb") as tmp:
            async for block in request.stream():
                written += len(block)
                if written > int(length):
                    raise InvalidInput(f"the body is longer than its Content-Length ({length})")
                await run_in_threadpool(tmp.write, block)
        if written != int(length):
            raise InvalidInput(f"the body ended after {written} of its {length} bytes")
        await run_in_threadpool(kiln.notebooks.save_home, caller, notebook, path)
    finally:
        path.unlink(missing_ok=True)
    return Response(status_code=204)


@router.get(
    "/{notebook}/events",
    response_model=EventSources,
    summary="A TensorBoard's jobs and their TensorBoard event files kept in the store",
    responses=errors(404, 422),
)
def list_notebook_events(notebook: NotebookRef, caller: Caller, kiln: Kiln) -> EventSources:
    return EventSources(items=kiln.notebooks.events(caller, notebook))


@router.get(
    "/{notebook}/events/{job_id}/{path:path}",
    summary="One event file of a TensorBoard's job, from a byte offset on (event files only grow)",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
        **errors(404, 422),
    },
)
def get_notebook_event_file(
    notebook: NotebookRef,
    job_id: Annotated[str, PathParam(max_length=64)],
    path: Annotated[str, PathParam(max_length=1024)],
    caller: Caller,
    kiln: Kiln,
    offset: Annotated[int, Query(ge=0, le=2**50, description="The first byte to send")] = 0,
) -> StreamingResponse:
    handle = kiln.notebooks.open_event(caller, notebook, job_id, path, offset)

    def chunks() -> Iterator[bytes]:
        with handle:
            while block := handle.read(1024 * 1024):
                yield block

    return StreamingResponse(chunks(), media_type="application/octet-stream")

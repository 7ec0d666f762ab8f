"""Versioned datasets and their resumable, SHA-256-verified uploads (protocol: kiln.usecases.data.datasets)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from kiln.api.deps import Caller, Kiln
from kiln.api.params import DatasetName, DraftId, FilePath, PartNumber, UploadId, Version
from kiln.api.responses import REDIRECT, errors, links, raw_body, stored_file
from kiln.domain import dataset_refs
from kiln.domain.datasets import (
    DatasetManifest,
    DatasetRemoved,
    DatasetVersionRead,
    DraftCreate,
    DraftRead,
    PartRead,
    PartUrl,
    PartUrlRequest,
    PartUrls,
    PartUrlsRequest,
    SmallBlobsRead,
    UploadConfig,
    UploadCreate,
    UploadRead,
)
from kiln.errors import BadRequest

router = APIRouter(tags=["datasets"], responses=errors(403))
PART_SHA256_HEADER = "X-Kiln-Part-SHA256"
PartSha256 = Annotated[
    str | None,
    Header(alias=PART_SHA256_HEADER, max_length=64, description="The part's SHA-256, lowercase hex (required)"),
]
BINARY_BODY = raw_body("application/octet-stream")
DRAFT = {"draft_id": "$response.body#/id"}
UPLOAD = {"upload_id": "$response.body#/id"}
NAMED = {"name": "$response.body#/name"}
VERSION = {"name": "$response.body#/name", "version": "$response.body#/version"}


def _version(value: str) -> int | None:
    try:
        return dataset_refs.parse_version(value)
    except dataset_refs.DatasetRefError as exc:
        raise BadRequest(str(exc)) from None


@router.get("/datasets", summary="The organisation's datasets: name, latest version, size, last update")
def list_datasets(caller: Caller, kiln: Kiln) -> dict[str, Any]:
    return {"items": [d.model_dump(mode="json") for d in kiln.datasets.list_datasets(caller)]}


@router.post(
    "/datasets",
    response_model=DraftRead,
    status_code=201,
    summary="Start a version: send its manifest",
    responses={
        **errors(400, 409, 422),
        **links(201, "The draft, and the blobs it still needs", commit_draft=DRAFT),
    },
)
def create_draft(body: DraftCreate, caller: Caller, kiln: Kiln) -> DraftRead:
    return kiln.datasets.create_draft(caller, body)


@router.post(
    "/datasets/drafts/{draft_id}/commit",
    response_model=DatasetVersionRead,
    summary="Make a draft the next version (409 while blobs are missing)",
    responses={
        **errors(404, 409, 422),
        **links(
            200,
            "The new version",
            dataset_manifest=VERSION,
            dataset_versions=NAMED,
            remove_version=VERSION,
        ),
    },
)
def commit_draft(draft_id: DraftId, caller: Caller, kiln: Kiln) -> DatasetVersionRead:
    return kiln.datasets.commit(caller, draft_id)


@router.get("/datasets/{name}", summary="The versions of a dataset", responses=errors(400, 404, 422))
def dataset_versions(name: DatasetName, caller: Caller, kiln: Kiln) -> dict[str, Any]:
    items = kiln.datasets.versions(caller, name)
    return {"name": name, "items": [v.model_dump(mode="json") for v in items]}


@router.delete(
    "/datasets/{name}",
    response_model=DatasetRemoved,
    summary="Remove a dataset (every version)",
    responses=errors(400, 404, 409, 422),
)
def remove_dataset(name: DatasetName, caller: Caller, kiln: Kiln) -> DatasetRemoved:
    return kiln.datasets.remove(caller, name, None)


@router.get(
    "/datasets/{name}/versions/{version}",
    response_model=DatasetManifest,
    summary="The manifest of a version (a number or 'latest')",
    responses=errors(400, 404, 422),
)
def dataset_manifest(name: DatasetName, version: Version, caller: Caller, kiln: Kiln) -> DatasetManifest:
    return kiln.datasets.manifest(caller, name, _version(version))


@router.delete(
    "/datasets/{name}/versions/{version}",
    response_model=DatasetRemoved,
    summary="Remove one version",
    responses=errors(400, 404, 409, 422),
)
def remove_version(name: DatasetName, version: Version, caller: Caller, kiln: Kiln) -> DatasetRemoved:
    number = _version(version)
    if number is None:
        raise BadRequest("remove a version by its number")
    return kiln.datasets.remove(caller, name, number)


@router.get(
    "/datasets/{name}/versions/{version}/files/{path:path}",
    summary="A file's bytes: streamed, or a 307 redirect to a short-lived store URL (S3)",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}}, **REDIRECT, **errors(400, 404, 422)},
)
def dataset_file(name: DatasetName, version: Version, path: FilePath, caller: Caller, kiln: Kiln) -> Response:
    number = _version(version)
    if number is None:
        raise BadRequest("read files of a version by its number")
    key, entry = kiln.datasets.file(caller, name, number, path)
    return stored_file(kiln.store, key, entry.sha256, entry.size, kiln.datasets.presigned_get(key, entry.path))


@router.get(
    "/uploads/config",
    response_model=UploadConfig,
    summary="How this server takes uploads: through the API or presigned straight to the store, and part sizes",
)
def upload_config(caller: Caller, kiln: Kiln) -> UploadConfig:
    return kiln.datasets.config(caller)


@router.post(
    "/uploads",
    response_model=UploadRead,
    summary="Open (or resume) the upload session of a blob",
    responses={
        **errors(400, 422),
        **links(
            200,
            "The session (no id when the blob is already stored)",
            complete_upload=UPLOAD,
            put_part={**UPLOAD, "number": "1"},
            part_url={**UPLOAD, "number": "1"},
            part_urls=UPLOAD,
        ),
    },
)
def open_upload(body: UploadCreate, caller: Caller, kiln: Kiln) -> UploadRead:
    return kiln.datasets.open_upload(caller, body.sha256, body.size, body.part_size)


@router.post(
    "/uploads/blobs",
    response_model=SmallBlobsRead,
    summary="Many small blobs in one request: a JSON line {blobs: [{sha256, size}]}, then their bytes in order",
    responses=errors(400),
    openapi_extra=BINARY_BODY,
)
async def put_blobs(request: Request, caller: Caller, kiln: Kiln) -> SmallBlobsRead:
    data = await request.body()
    return await run_in_threadpool(kiln.datasets.put_blobs, caller, data)


@router.put(
    "/uploads/{upload_id}/parts/{number:int}",
    response_model=PartRead,
    summary="Send one part through the API (header X-Kiln-Part-SHA256: the part's SHA-256)",
    responses=errors(400, 404, 422),
    openapi_extra=BINARY_BODY,
)
async def put_part(
    upload_id: UploadId, number: PartNumber, request: Request, caller: Caller, kiln: Kiln, declared: PartSha256 = None
) -> PartRead:
    data = await request.body()
    return await run_in_threadpool(kiln.datasets.put_part, caller, upload_id, number, data, declared)


@router.post(
    "/uploads/{upload_id}/parts/{number:int}/url",
    response_model=PartUrl,
    summary="A presigned URL that takes one part straight to the store (S3)",
    responses=errors(400, 404, 422),
)
def part_url(upload_id: UploadId, number: PartNumber, body: PartUrlRequest, caller: Caller, kiln: Kiln) -> PartUrl:
    return kiln.datasets.part_url(caller, upload_id, number, body)


@router.post(
    "/uploads/{upload_id}/parts/urls",
    response_model=PartUrls,
    summary="Presigned URLs for many parts at once (S3): body {parts: [{number, size, md5}]}, at most 1,000",
    responses=errors(400, 404, 422),
)
def part_urls(upload_id: UploadId, body: PartUrlsRequest, caller: Caller, kiln: Kiln) -> PartUrls:
    return kiln.datasets.part_urls(caller, upload_id, body)


@router.post(
    "/uploads/{upload_id}/complete",
    response_model=UploadRead,
    summary="Assemble the blob from its verified parts",
    responses=errors(400, 404, 409, 422),
)
def complete_upload(upload_id: UploadId, caller: Caller, kiln: Kiln) -> UploadRead:
    return kiln.datasets.complete_upload(caller, upload_id)

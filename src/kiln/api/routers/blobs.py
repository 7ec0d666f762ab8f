"""Content-addressed code bundles."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from kiln.api.deps import Caller, Kiln
from kiln.api.params import Sha256
from kiln.api.responses import errors, links, raw_body
from kiln.auth import signing
from kiln.domain.schemas import BlobRead
from kiln.errors import DigestMismatch

router = APIRouter(prefix="/blobs", tags=["blobs"], responses=errors(403))
GZIP_BODY = raw_body("application/gzip")


@router.put(
    "/{sha256}",
    response_model=BlobRead,
    status_code=201,
    summary="Upload a code bundle (tar.gz)",
    responses={
        **errors(400, 422),
        **links(201, "The bundle, stored", head_blob={"sha256": "$response.body#/sha256"}),
    },
    openapi_extra=GZIP_BODY,
)
async def put_blob(sha256: Sha256, request: Request, caller: Caller, kiln: Kiln) -> BlobRead:
    signed = request.headers.get(signing.HEADER_CONTENT.lower())
    if signed not in (signing.UNSIGNED_PAYLOAD, sha256):
        raise DigestMismatch("X-Kiln-Content-SHA256 must be UNSIGNED-PAYLOAD or the blob's own hash")
    length = request.headers.get("content-length")
    declared = int(length) if length and length.isascii() and length.isdigit() else None
    blob = await kiln.blobs.upload(caller, sha256, request.stream(), declared)
    return BlobRead(sha256=blob.sha256, size=blob.size)


@router.head(
    "/{sha256}",
    summary="Whether a bundle is already uploaded (200) or not (404)",
    responses={
        200: {
            "description": "Uploaded",
            "headers": {"X-Kiln-Blob-Size": {"description": "Its size in bytes", "schema": {"type": "string"}}},
        },
        **errors(404, 422),
    },
)
def head_blob(sha256: Sha256, caller: Caller, kiln: Kiln) -> Response:
    blob = kiln.blobs.get(caller, sha256)
    return Response(status_code=200, headers={"Content-Length": "0", "X-Kiln-Blob-Size": str(blob.size)})

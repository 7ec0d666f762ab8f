"""Content-addressed code bundles."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response

from kiln.api.deps import Caller, Kiln
from kiln.auth import signing
from kiln.domain.schemas import SHA256_PATTERN, BlobRead
from kiln.errors import DigestMismatch

router = APIRouter(prefix="/blobs", tags=["blobs"])
Sha = Annotated[str, Path(pattern=SHA256_PATTERN, description="Lowercase hex SHA-256 of the bundle")]


@router.put("/{sha256}", response_model=BlobRead, status_code=201, summary="Upload a code bundle (tar.gz)")
async def put_blob(sha256: Sha, request: Request, caller: Caller, kiln: Kiln) -> BlobRead:
    signed = request.headers.get(signing.HEADER_CONTENT.lower())
    if signed not in (signing.UNSIGNED_PAYLOAD, sha256):
        raise DigestMismatch("X-Kiln-Content-SHA256 must be UNSIGNED-PAYLOAD or the blob's own hash")
    length = request.headers.get("content-length")
    blob = await kiln.blobs.upload(
        caller, sha256, request.stream(), int(length) if length and length.isdigit() else None
    )
    return BlobRead(sha256=blob.sha256, size=blob.size)


@router.head("/{sha256}", summary="Whether a bundle is already uploaded (200) or not (404)")
def head_blob(sha256: Sha, caller: Caller, kiln: Kiln) -> Response:
    blob = kiln.blobs.get(caller, sha256)
    return Response(status_code=200, headers={"Content-Length": "0", "X-Kiln-Blob-Size": str(blob.size)})

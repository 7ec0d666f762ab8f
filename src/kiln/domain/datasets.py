"""Request and response bodies of datasets: drafts and their manifests, uploads and their parts, versions."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from kiln.domain import limits
from kiln.domain.schemas import REQUEST, SHA256_PATTERN


class DatasetFileEntry(BaseModel):
    """One file of a manifest: its path relative to the dataset's root, its size and the SHA-256 of its bytes."""

    model_config = REQUEST

    path: str = Field(max_length=limits.MAX_PATH_LENGTH)
    size: int = Field(
        ge=0, le=limits.MAX_FILE_BYTES, description="Bytes; at most 5 TiB (S3's largest object).", strict=True
    )
    sha256: str = Field(max_length=64, pattern=SHA256_PATTERN)


class DraftCreate(BaseModel):
    model_config = REQUEST

    # Twice the longest name: a longer one is refused by the name's own rules (400, saying what they are).
    name: str = Field(
        max_length=2 * limits.MAX_DATASET_NAME_LENGTH,
        description="lowercase letters, digits and . _ - (at most 100)",
    )
    files: list[DatasetFileEntry] = Field(
        max_length=limits.MAX_MANIFEST_FILES,
        description="Every file of the version (a server may take fewer: KILN_DATASET_MAX_FILES).",
    )


class DraftRead(BaseModel):
    id: str = Field(description="The draft; commit it once every missing blob is uploaded.")
    name: str
    manifest_sha256: str
    files: int
    size: int
    missing: list[str] = Field(description="SHA-256 of the blobs the store does not hold yet.")
    missing_bytes: int
    version: int | None = Field(None, description="Set when the manifest is the latest version's: nothing to do.")


class UploadCreate(BaseModel):
    model_config = REQUEST

    sha256: str = Field(max_length=64, pattern=SHA256_PATTERN)
    size: int = Field(
        ge=0,
        le=limits.MAX_FILE_BYTES,
        description="Bytes: at most 5 TiB, and at most 10,000 parts of the session's part size (413 above it); "
        "within the organisation's storage quota (403).",
        strict=True,
    )
    part_size: int | None = Field(
        None,
        ge=1,
        le=limits.MAX_PART_BYTES,
        description="Preferred part size of a new session with presigned parts (S3): used when it is within the "
        "store's limits (5 MiB to 5 GiB, at most 10,000 parts), else the server's own. The answer says which.",
        strict=True,
    )


class UploadConfig(BaseModel):
    """How this server takes blob uploads, asked before hashing so that a client computes each part's digests in
    the same read as the whole file's SHA-256."""

    mode: Literal["api", "presigned"] = Field(
        description="api: parts go through the API with their SHA-256; presigned: straight to the store, each "
        "declared with its MD5 and CRC32"
    )
    part_size: int = Field(description="The part size of a new session that states no preference.")
    min_part_size: int = Field(description="The smallest part size a new session may ask for (presigned).")
    max_parts: int
    small_blob_bytes: int = Field(
        description="Blobs smaller than this go many to a request (POST /uploads/blobs) rather than one session "
        "each; 0: every blob has a session."
    )
    small_blobs_body_bytes: int = Field(description="The largest body POST /uploads/blobs takes, header included.")


class SmallBlob(BaseModel):
    model_config = REQUEST

    sha256: str = Field(max_length=64, pattern=SHA256_PATTERN)
    size: int = Field(ge=0, le=limits.MAX_SIGNED_BODY_BYTES, strict=True)


class SmallBlobsHeader(BaseModel):
    """The JSON line that starts a body of small blobs: what follows it, in order."""

    model_config = REQUEST

    blobs: list[SmallBlob] = Field(min_length=1, max_length=limits.MAX_SMALL_BLOBS)


class SmallBlobsRead(BaseModel):
    stored: int = Field(description="Blobs written to the store by this request.")
    present: int = Field(description="Blobs the organisation already held (not written again).")
    bytes: int = Field(description="Bytes written to the store.")


class UploadRead(BaseModel):
    id: str | None = Field(None, description="None when the blob is already stored (complete).")
    sha256: str
    size: int
    complete: bool
    mode: Literal["api", "presigned", "none"] = Field(
        description="api: PUT each part to /uploads/{id}/parts/{n}; presigned: ask /uploads/{id}/parts/{n}/url "
        "and PUT the part to the store"
    )
    part_size: int
    parts: int = Field(description="Number of parts (the last may be shorter).")
    received: list[int] = Field(default_factory=list, description="Parts the server already holds.")


class PartUrlRequest(BaseModel):
    model_config = REQUEST

    size: int = Field(ge=0, le=limits.MAX_PART_BYTES, strict=True)
    md5: str = Field(max_length=32, pattern=r"^[0-9a-f]{32}$", description="Hex MD5 of the part (the store checks it).")
    crc32: str = Field(
        max_length=8,
        pattern=r"^[0-9a-f]{8}$",
        description="The part's CRC32 (zlib's), 8 hex digits, big-endian (the store checks it: S3 flexible checksums).",
    )


class PartUrl(BaseModel):
    url: str
    method: str = "PUT"
    headers: dict[str, str] = Field(
        description="Headers to send with the part, exactly (Content-MD5, x-amz-checksum-crc32): they are signed."
    )
    expires_in: int


class PartUrlsItem(PartUrlRequest):
    number: int = Field(ge=1, le=limits.MAX_UPLOAD_PARTS, description="Part number, from 1", strict=True)


class PartUrlsRequest(BaseModel):
    model_config = REQUEST

    parts: list[PartUrlsItem] = Field(min_length=1, max_length=1000, description="At most 1,000 distinct parts.")


class NumberedPartUrl(PartUrl):
    number: int


class PartUrls(BaseModel):
    items: list[NumberedPartUrl] = Field(description="One presigned URL per part asked for, in the same order.")


class PartRead(BaseModel):
    number: int
    size: int


class DatasetSummary(BaseModel):
    name: str
    latest_version: int
    versions: int
    files: int
    size: int
    updated_at: datetime


class DatasetVersionRead(BaseModel):
    name: str
    version: int
    files: int
    size: int
    manifest_sha256: str
    created_at: datetime


class DatasetManifest(DatasetVersionRead):
    items: list[DatasetFileEntry]


class DatasetRemoved(BaseModel):
    name: str
    versions: list[int]
    blobs_deleted: int
    bytes_freed: int

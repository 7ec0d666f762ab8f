"""Path and query parameters the routes share, each bounded by a platform maximum (kiln.domain.limits) so that
the OpenAPI schema states it and an oversized value is a 422 naming the parameter."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import Path, Query
from pydantic import BeforeValidator

from kiln.domain import limits

JobId = Annotated[str, Path(max_length=limits.MAX_ID_LENGTH, description="A job id, e.g. job-01jd5y3c2k7q4m9x2a")]
StudyId = Annotated[str, Path(max_length=limits.MAX_ID_LENGTH, description="A study id, e.g. study-01jd5y3c2k7q4m9x2a")]
ServiceName = Annotated[str, Path(max_length=63, description="A service's name, e.g. digits")]
UploadId = Annotated[str, Path(max_length=limits.MAX_ID_LENGTH, description="An upload session's id")]
DraftId = Annotated[str, Path(max_length=limits.MAX_ID_LENGTH, description="A dataset draft's id")]
KeyId = Annotated[str, Path(max_length=limits.MAX_ID_LENGTH, description="An access key id")]
OrgRef = Annotated[str, Path(max_length=limits.MAX_NAME_LENGTH, description="Organisation id or name")]
UserRef = Annotated[str, Path(max_length=limits.MAX_NAME_LENGTH, description="User id or name")]
# Twice the longest name: a longer one is refused by the name's own rules (400, saying what they are).
DatasetName = Annotated[
    str,
    Path(
        max_length=2 * limits.MAX_DATASET_NAME_LENGTH, description="Lowercase letters, digits and . _ - (at most 100)"
    ),
]
Version = Annotated[
    str, Path(max_length=limits.MAX_VERSION_LENGTH, description="A version number (from 1), or 'latest' where allowed")
]
FilePath = Annotated[str, Path(max_length=limits.MAX_PATH_LENGTH, description="A file's path, '/'-separated, relative")]
Framework = Annotated[str, Path(max_length=limits.MAX_NAME_LENGTH, description="A catalog framework, e.g. pytorch")]
Sha256 = Annotated[
    str,
    Path(max_length=64, pattern=r"^[0-9a-f]{64}$", description="Lowercase hex SHA-256 of the bundle"),
]
PartNumber = Annotated[int, Path(ge=1, le=limits.MAX_UPLOAD_PARTS, description="Part number, from 1")]

OrgQuery = Annotated[
    str | None, Query(max_length=limits.MAX_NAME_LENGTH, description="Organisation id or name (platform admin)")
]
UserQuery = Annotated[str | None, Query(max_length=limits.MAX_NAME_LENGTH, description="User id or name")]
Step = Annotated[int | None, Query(ge=-limits.MAX_INT64, le=limits.MAX_INT64)]


def _iso_time(value: Any) -> Any:
    """An ISO 8601 time only: pydantic would also read a number as seconds since 1970, which the schema's
    date-time format does not allow."""
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            raise ValueError("an ISO 8601 time, e.g. 2026-01-31T12:00:00Z") from None
    return value


Time = Annotated[datetime | None, BeforeValidator(_iso_time)]

"""Bodies of the job routes that check before they act (a submit's dry run, a rerun); the rest of the job
schemas are in ``kiln.domain.schemas``."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from kiln.domain import limits
from kiln.domain.schemas import REQUEST
from kiln.domain.spec import JobSpec


class JobDryRun(BaseModel):
    """What a submit of the same body would create, after every check a submit makes; nothing was created."""

    spec: JobSpec = Field(description="The spec as the job would get it: each input's version pinned.")
    name: str
    code_sha256: str | None = None
    code_stored: bool | None = Field(
        None, description="Whether the server holds the code bundle already (upload it if not); None: no code."
    )


class JobRerun(BaseModel):
    model_config = REQUEST

    name: str | None = Field(
        None, min_length=1, max_length=limits.MAX_NAME_LENGTH, description="Display name (default: the job's)."
    )

    @field_validator("name")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or any(ord(c) < 32 for c in value)):
            raise ValueError("must be printable text")
        return value

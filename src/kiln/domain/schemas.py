"""Request and response bodies shared by the server and the SDK."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kiln.domain.spec import JobSpec
from kiln.domain.states import JobState

SHA256_PATTERN = r"^[0-9a-f]{64}$"


class JobSubmit(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec: JobSpec
    code_sha256: str | None = Field(
        None, pattern=SHA256_PATTERN, description="A code bundle uploaded with PUT /api/v1/blobs/{sha256}."
    )


class Allocation(BaseModel):
    cpus: float = 0.0
    memory: int | None = None
    gpus: list[int] = Field(default_factory=list)


class JobRead(BaseModel):
    id: str
    name: str
    org_id: str
    user_id: str
    state: JobState
    reason: str | None = None
    message: str | None = None
    spec: JobSpec
    code_sha256: str | None = None
    attempt: int = 0
    restarts: int = 0
    exit_code: int | None = None
    cancel_requested: bool = False
    allocation: Allocation | None = None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    running_at: datetime | None = None
    finished_at: datetime | None = None


class JobList(BaseModel):
    items: list[JobRead]


class EventRead(BaseModel):
    id: int
    job_id: str
    time: datetime
    from_state: JobState | None = None
    to_state: JobState | None = None
    reason: str
    message: str = ""


class EventList(BaseModel):
    items: list[EventRead]


class BlobRead(BaseModel):
    sha256: str
    size: int


class ArtifactRead(BaseModel):
    path: str
    size: int


class ArtifactList(BaseModel):
    items: list[ArtifactRead]


class RuntimeRead(BaseModel):
    name: str
    framework: str
    version: str
    default: bool = False
    packages: list[str] = Field(default_factory=list)
    status: str = Field(description="installed, not-installed, installing or failed")
    path: str | None = None
    message: str | None = None


class RuntimeList(BaseModel):
    items: list[RuntimeRead]


class WhoAmI(BaseModel):
    user_id: str
    user_name: str
    org_id: str
    org_name: str
    access_key: str
    platform_admin: bool


class ErrorBody(BaseModel):
    code: str
    message: str
    details: Any = None

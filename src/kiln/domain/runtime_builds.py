"""What the API says about a catalog runtime's build (``GET /runtimes/{name}``), shared by the server and the SDK."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from kiln.domain.schemas import RuntimeRead

BuildState = Literal["running", "succeeded", "failed"]


@dataclass(frozen=True)
class BuildInfo:
    """What the files of one build say about it (as the backend that ran it read them back)."""

    id: str
    state: BuildState
    phase: str
    message: str | None
    started_at: float
    finished_at: float | None
    log_bytes: int


# The phases of a build, in order, as the ``phase`` field names them.
PHASE_STARTING = "starting"
PHASE_WAITING = "waiting"  # for a build of the same runtime that a job's first use started
PHASE_VENV = "creating the virtualenv"
PHASE_PACKAGES = "installing packages"
PHASE_TESTING = "testing"
PHASE_DONE = "done"
PHASE_FAILED = "failed"


class RuntimeBuildRead(BaseModel):
    """One build of a runtime that ``kiln runtimes install`` (``POST /runtimes/{framework}/install``) started."""

    id: str = Field(description="The build's id (its start time in milliseconds since 1970)")
    state: BuildState
    phase: str = Field(
        description="starting, waiting (for a build a job started), creating the virtualenv, installing packages, "
        "testing (a smoke test of the interpreter), done or failed"
    )
    message: str | None = Field(
        None, description="While running: the build's last log line (pip's progress). Failed: what failed."
    )
    started_at: datetime
    finished_at: datetime | None = None
    log_bytes: int = Field(0, description="The size of the build's log (GET /runtimes/{name}/log)")


class RuntimeDetail(RuntimeRead):
    """A catalog runtime with its image, description and latest build started through the API."""

    image: str = ""
    description: str = ""
    build: RuntimeBuildRead | None = Field(
        None, description="The latest build started through the API; none when it never was (or only by jobs)"
    )

"""Notebooks: JupyterLab as a managed, authenticated development environment (``kiln notebooks create``).

A notebook is a named environment of an organisation. Each time it starts, Kiln submits a job of quota category
``dev`` (``python -m kiln.injob.notebook`` in the notebook's runtime with JupyterLab added, the ``+lab`` variant of
a catalog runtime): placed by the scheduler, run under the shim in the job's sandbox and network namespace like any
job. JupyterLab listens only on a Unix socket in the job's work dir, with a random token; users reach it through
Kiln's authenticated proxy under ``/notebooks/{id}/``. The job's ``$HOME`` is the notebook's persistent home, kept
in the store between starts.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kiln.domain import limits
from kiln.domain.durations import parse_duration
from kiln.domain.spec import EnvName, EnvValue, InputSpec, NetworkMode, Resources, RuntimeSpec

NOTEBOOK_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
NOTEBOOK_LABEL = "kiln-notebook"  # on each of a notebook's jobs: the notebook's id
CATEGORY = "dev"  # the quota category of notebook jobs
LAB_SUFFIX = "+lab"  # a catalog version with JupyterLab added: pytorch 2.13 → pytorch 2.13+lab
LAB_PACKAGES = ("jupyterlab>=4.6,<5",)
DEFAULT_IDLE_TIMEOUT = 3600.0
MAX_HOME_BYTES = 10 * 1024**3  # one notebook home, compressed


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class NotebookSpec(_Strict):
    """What ``kiln notebooks create`` asks for."""

    name: str = Field(max_length=63, description="Unique in the organisation: lower-case letters, digits and '-'.")
    runtime: RuntimeSpec = Field(
        default_factory=RuntimeSpec, description="A catalog runtime; the notebook runs its +lab variant."
    )
    resources: Resources = Field(default_factory=Resources)
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, max_length=limits.MAX_ENV_VARS)
    inputs: list[InputSpec] = Field(default_factory=list, max_length=limits.MAX_INPUTS)
    network: NetworkMode = Field("isolated", description="As a job's (isolated, none or host).")
    idle_timeout: float | None = Field(
        DEFAULT_IDLE_TIMEOUT,
        ge=0,
        le=limits.MAX_DURATION_SECONDS,
        description="Stop after this long idle (no kernel busy, no terminal, no action through the proxy), seconds "
        "or e.g. '30m', '2h'; 0 or null: never.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NOTEBOOK_NAME.fullmatch(value):
            raise ValueError(
                f"{value!r}: lower-case letters, digits and '-', starting and ending with a letter or digit"
            )
        return value

    @field_validator("runtime")
    @classmethod
    def _runtime(cls, value: RuntimeSpec) -> RuntimeSpec:
        if not value.framework:
            raise ValueError("a notebook runs a catalog runtime (framework and version; `kiln runtimes list`)")
        if value.version and value.version.endswith(LAB_SUFFIX):
            raise ValueError(f"name the runtime without {LAB_SUFFIX!r}: Kiln adds JupyterLab itself")
        return value

    @field_validator("idle_timeout", mode="before")
    @classmethod
    def _idle(cls, value: Any) -> Any:
        if value is None or value == 0 or value == "0":
            return None  # never idle
        return parse_duration(value)


class NotebookState(StrEnum):
    STARTING = "STARTING"  # its job is queued or starting, or JupyterLab is not answering yet
    RUNNING = "RUNNING"  # JupyterLab answers through the proxy
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"  # by its user, or culled when idle: `start` brings it back with its home
    FAILED = "FAILED"  # its job failed (the message says why: JupyterLab's last lines)


class NotebookRead(BaseModel):
    id: str
    name: str
    org_id: str
    user_id: str
    state: NotebookState
    message: str = ""
    spec: NotebookSpec
    job_id: str | None = Field(None, description="The job of its current (or last) start.")
    url: str = Field(description="Where it opens (the console's session, or a signed request).")
    last_activity: datetime | None = None
    created_at: datetime
    updated_at: datetime


class NotebookList(BaseModel):
    items: list[NotebookRead]

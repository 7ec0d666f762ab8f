"""Notebooks: JupyterLab as a managed, authenticated development environment (``kiln notebooks create``).

A notebook is a named environment of an organisation. Each time it starts, Kiln submits a job of quota category
``dev`` (``python -m kiln.injob.notebook`` in the notebook's runtime with JupyterLab added, the ``+lab`` variant of
a catalog runtime): placed by the scheduler, run under the shim in the job's sandbox and network namespace like any
job. JupyterLab listens only on a Unix socket in the job's work dir, with a random token; users reach it through
Kiln's authenticated proxy under ``/notebooks/{id}/``. The job's ``$HOME`` is the notebook's persistent home, kept
in the store between starts.

A notebook of kind ``tensorboard`` (``kiln tensorboard JOB…``) is the same machinery around TensorBoard instead:
its job runs ``python -m kiln.injob.tensorboard`` in the ``+tensorboard`` variant of its runtime, which copies the
named jobs' TensorBoard event files (kept in the store while they run and when they end) into a log dir with one
run per job and serves TensorBoard over them, reached through the same proxy.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kiln.domain import limits
from kiln.domain.durations import parse_duration
from kiln.domain.spec import EnvName, EnvValue, InputSpec, NetworkMode, Resources, RuntimeSpec

NOTEBOOK_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
NOTEBOOK_LABEL = "kiln-notebook"  # on each of a notebook's jobs: the notebook's id
CATEGORY = "dev"  # the quota category of notebook jobs
LAB_SUFFIX = "+lab"  # a catalog version with JupyterLab added: pytorch 2.13 → pytorch 2.13+lab
LAB_PACKAGES = ("jupyterlab>=4.6,<5",)
TENSORBOARD_SUFFIX = "+tensorboard"  # python 3 → python 3+tensorboard: a TensorBoard session's runtime
TENSORBOARD_PACKAGES = ("tensorboard>=2.17,<3",)
VARIANTS = {LAB_SUFFIX: (LAB_PACKAGES, "JupyterLab"), TENSORBOARD_SUFFIX: (TENSORBOARD_PACKAGES, "TensorBoard")}
MAX_TENSORBOARD_JOBS = 20
JOB_ID = re.compile(r"^job-[0-9a-z]{16}$")
NotebookKind = Literal["jupyterlab", "tensorboard"]
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
    kind: NotebookKind = Field(
        "jupyterlab", description="jupyterlab, or tensorboard: TensorBoard over the event files of `jobs`."
    )
    jobs: list[Annotated[str, Field(max_length=40)]] = Field(
        default_factory=list,
        max_length=MAX_TENSORBOARD_JOBS,
        description="kind tensorboard: the jobs (ids) whose TensorBoard event files it shows, one run per job.",
    )
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
        for suffix, (_, what) in VARIANTS.items():
            if value.version and value.version.endswith(suffix):
                raise ValueError(f"name the runtime without {suffix!r}: Kiln adds {what} itself")
        return value

    @field_validator("jobs")
    @classmethod
    def _jobs(cls, value: list[str]) -> list[str]:
        for job_id in value:
            if not JOB_ID.fullmatch(job_id):
                raise ValueError(f"{job_id[:80]!r} is not a job id (job-…, as `kiln jobs list` shows)")
        return list(dict.fromkeys(value))

    @model_validator(mode="after")
    def _kind(self) -> NotebookSpec:
        if self.kind == "tensorboard":
            if not self.jobs:
                raise ValueError("a tensorboard shows the event files of jobs: name at least one in `jobs`")
            if self.inputs:
                raise ValueError("a tensorboard reads its jobs' event files: it takes no `inputs`")
            if self.network == "host":
                raise ValueError(
                    "network: host cannot run a tensorboard: TensorBoard has no token of its own and listens on "
                    "127.0.0.1, which on the machine's own network every process there reaches; use network: "
                    "isolated (its own namespace, where Kiln alone reaches it)"
                )
        elif self.jobs:
            raise ValueError("`jobs` is for kind tensorboard; a jupyterlab notebook reads data through `inputs`")
        return self

    @property
    def suffix(self) -> str:
        """The catalog variant its runtime runs in."""
        return TENSORBOARD_SUFFIX if self.kind == "tensorboard" else LAB_SUFFIX

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


class EventFile(BaseModel):
    path: str = Field(description="Relative to the job's TensorBoard dir.")
    size: int


class EventSource(BaseModel):
    """One job a TensorBoard shows: its state and its event files kept in the store."""

    job_id: str
    state: str = Field(description="The job's state (DELETED: it was deleted since).")
    files: list[EventFile]


class EventSources(BaseModel):
    items: list[EventSource]

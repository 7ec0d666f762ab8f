"""Request and response bodies shared by the server and the SDK."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kiln.domain import limits
from kiln.domain.quantities import parse_memory
from kiln.domain.spec import JobSpec, Priority
from kiln.domain.states import JobState

SHA256_PATTERN = r"^[0-9a-f]{64}$"
# Request bodies: unknown fields are errors, and so are NaN and infinities (JSON has neither, but Python's parser
# takes NaN and Infinity, which compare false with every bound).
REQUEST = ConfigDict(extra="forbid", allow_inf_nan=False)


def _quantity(value: Any) -> Any:
    """Bytes from a quantity such as 128G (a string) or a number; the field's own bounds apply to the result."""
    if isinstance(value, str):
        if len(value) > limits.MAX_QUANTITY_LENGTH:
            raise ValueError(f"not a quantity: longer than {limits.MAX_QUANTITY_LENGTH} characters")
        try:
            return parse_memory(value)
        except OverflowError:
            raise ValueError(f"not a quantity: {value!r} is out of range") from None
    return value


class JobSubmit(BaseModel):
    model_config = REQUEST

    spec: JobSpec
    code_sha256: str | None = Field(
        None,
        max_length=64,
        pattern=SHA256_PATTERN,
        description="A code bundle uploaded with PUT /api/v1/blobs/{sha256}.",
    )


class AllocationSlot(BaseModel):
    """Where one gang member (worker or parameter server) runs."""

    node: str
    cpus: float
    memory: int | None = None
    gpus: list[int] = Field(default_factory=list)


class Allocation(BaseModel):
    """What a STARTING/RUNNING job holds: totals over its gang, and one slot per member."""

    cpus: float = 0.0
    memory: int | None = None
    gpus: list[int] = Field(default_factory=list)
    slots: list[AllocationSlot] = Field(default_factory=list)


class JobRead(BaseModel):
    id: str
    name: str
    org_id: str
    user_id: str
    org_name: str | None = Field(None, description="The name of the organisation org_id (what people read).")
    user_name: str | None = Field(None, description="The name of the user user_id who submitted it.")
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


class WhyAhead(BaseModel):
    """A job that holds this one back. Other organisations' jobs are counted, never named."""

    id: str | None = None
    name: str | None = None
    other_org: bool = False


class WhyRead(BaseModel):
    """Why a job is where it is: for a waiting job, which limit holds it (with the numbers) and what is ahead."""

    job_id: str
    state: JobState
    waiting: bool
    kind: str | None = Field(
        None,
        description="quota, capacity, gang, priority, reservation, preempting, selector, fairshare or backoff; "
        "None when the job does not wait.",
    )
    message: str
    position: int | None = Field(None, description="1-based place among the waiting jobs, in scheduling order.")
    queue_length: int = 0
    priority: Priority = "normal"
    ahead: list[WhyAhead] = Field(default_factory=list)


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


class TensorBoardImage(BaseModel):
    """One image in a job's TensorBoard event files, and where it is: GET .../tensorboard-images/image with its
    file, offset and index serves its bytes."""

    tag: str = Field(description="As written; '<dir>/<tag>' for an event file in a subdirectory (as for scalars)")
    step: int
    wall_time: float = Field(description="Seconds since 1970, as the event says")
    file: str = Field(description="The event file, relative to the job's TensorBoard dir")
    offset: int = Field(description="The byte offset of the image's record in the file")
    index: int = Field(description="Which image of the record (a TF2 image summary holds several)")
    width: int = Field(description="Pixels, as the summary says (0: not said)")
    height: int
    size: int = Field(description="The encoded image's bytes")
    media_type: str | None = Field(description="image/png, image/jpeg, image/gif or image/webp; None: not served")


class TensorBoardImageList(BaseModel):
    items: list[TensorBoardImage] = Field(description="Sorted by tag, then step")
    truncated: bool = Field(
        False, description="Not every image was listed: a file was read only up to the cap, or too many images"
    )
    notes: list[str] = Field(default_factory=list, description="Per file, why it was not read whole, or skipped")


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
    role: str = "member"
    job_id: str | None = None


class ErrorBody(BaseModel):
    """Every error answer: a stable ``code`` (kiln.errors), a message for people and, for some, details (a 422:
    ``[{field, message}]``; a 401: ``{reason}``; a 409 of an upload: ``{missing}``)."""

    code: str = Field(description="Stable, e.g. invalid_input, not_found, unauthenticated, payload_too_large.")
    message: str
    details: Any = Field(None, description="More about the error, where there is more; left out otherwise.")


# -- tenancy ---------------------------------------------------------------------------------------------

NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"


class OrgCreate(BaseModel):
    model_config = REQUEST

    name: str = Field(max_length=63, pattern=NAME_PATTERN, description="Lowercase letters, digits and '-', at most 63.")


class OrgRead(BaseModel):
    id: str
    name: str
    share_weight: float = 1.0
    max_priority: Priority = "normal"
    created_at: datetime


class OrgUpdate(BaseModel):
    """Scheduling settings of an organisation (platform admins); fields left out are unchanged."""

    model_config = REQUEST

    share_weight: float | None = Field(
        None,
        gt=0,
        le=limits.MAX_SHARE_WEIGHT,
        description="Fair-share weight against other organisations with pending work.",
        strict=True,
    )
    max_priority: Priority | None = Field(None, description="The highest priority class its members may use.")


class OrgList(BaseModel):
    items: list[OrgRead]


class UserCreate(BaseModel):
    model_config = REQUEST

    name: str = Field(max_length=63, pattern=NAME_PATTERN, description="Unique on the platform.")
    org: str | None = Field(
        None, max_length=limits.MAX_NAME_LENGTH, description="Organisation id or name; default: the caller's."
    )
    role: Literal["admin", "member", "viewer"] = "member"


class UserRead(BaseModel):
    id: str
    name: str
    org_id: str
    org_name: str
    role: str
    platform_admin: bool
    disabled: bool
    created_at: datetime


class UserList(BaseModel):
    items: list[UserRead]


class KeyCreate(BaseModel):
    model_config = REQUEST

    user: str | None = Field(
        None, max_length=limits.MAX_NAME_LENGTH, description="User id or name; default: the caller."
    )
    expires_at: datetime | None = Field(None, description="When the key stops working (UTC).")
    expires_in: float | None = Field(
        None,
        gt=0,
        le=limits.MAX_KEY_LIFETIME_SECONDS,
        description="Seconds from now (at most ten years); alternative to expires_at.",
        strict=True,
    )
    description: str = Field("", max_length=limits.MAX_DESCRIPTION_LENGTH)

    @field_validator("expires_at")
    @classmethod
    def _in_utc(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            try:
                value.astimezone(UTC)  # stored in UTC: 9999-12-31T23:00-05:00 has no UTC equivalent
            except OverflowError:
                raise ValueError("out of range in UTC") from None
        return value


class KeyRead(BaseModel):
    id: str
    user_id: str
    user_name: str
    org_id: str
    enabled: bool
    expires_at: datetime | None
    created_at: datetime
    last_used_at: datetime | None
    description: str = ""


class KeyCreated(KeyRead):
    secret_key: str = Field(description="Shown once, now; Kiln cannot show it again.")


class KeyList(BaseModel):
    items: list[KeyRead]


class QuotaSet(BaseModel):
    """Fields left out stay as they are; a field set to null becomes unlimited."""

    model_config = REQUEST

    category: Literal["train", "serve", "dev", "total"] = "train"
    gpus: int | None = Field(None, ge=0, le=limits.MAX_QUOTA_COUNT, strict=True)
    cpus: float | None = Field(None, ge=0, le=limits.MAX_QUOTA_CPUS, strict=True)
    memory: int | None = Field(None, ge=0, le=limits.MAX_QUOTA_BYTES, description="Bytes, or e.g. 128G", strict=True)
    count: int | None = Field(None, ge=0, le=limits.MAX_QUOTA_COUNT, strict=True)
    storage: int | None = Field(
        None, ge=0, le=limits.MAX_QUOTA_BYTES, description="Bytes, or e.g. 1T (category total only)", strict=True
    )

    @field_validator("memory", "storage", mode="before")
    @classmethod
    def _quantity(cls, value: Any) -> Any:
        return _quantity(value)


class QuotaFields(BaseModel):
    gpus: int | None = None
    cpus: float | None = None
    memory: int | None = None
    count: int | None = None
    storage: int | None = None


class QuotaCategory(BaseModel):
    category: str
    limits: QuotaFields
    used: QuotaFields


class StorageUse(BaseModel):
    """What an organisation's storage quota counts, in bytes, by kind; ``total`` (their sum) is the use of the
    ``total`` category's ``storage``."""

    code: int = Field(0, description="Code bundles.")
    outputs: int = Field(0, description="Jobs' outputs ($KILN_OUTPUT_DIR) kept in the store.")
    logs: int = Field(0, description="Jobs' logs (a running job's at its size now).")
    checkpoints: int = Field(0, description="Jobs' checkpoints ($KILN_CHECKPOINT_DIR) the store holds.")
    tensorboard: int = Field(0, description="Jobs' TensorBoard event files the store holds.")
    datasets: int = Field(0, description="Dataset blobs, and the full size of every open upload.")
    homes: int = Field(0, description="Notebook homes.")
    artifacts: int = Field(0, description="Artifacts of runs logged from outside Kiln.")

    @property
    def total(self) -> int:
        return sum(int(getattr(self, name)) for name in type(self).model_fields)


class QuotaReport(BaseModel):
    org_id: str
    org_name: str
    categories: list[QuotaCategory]
    storage: StorageUse | None = Field(None, description="What the organisation stores, by kind, in bytes.")


class AuditRead(BaseModel):
    id: int
    time: datetime
    org_id: str | None
    user_id: str | None
    org_name: str | None = Field(None, description="The name of org_id's organisation; None where it has none.")
    user_name: str | None = Field(None, description="The name of user user_id; None where it has none.")
    key_id: str | None
    action: str
    resource: str
    outcome: str
    status: int
    client: str
    detail: str = ""


class AuditList(BaseModel):
    items: list[AuditRead]


# -- metrics ------------------------------------------------------------------------------------------------


class MetricsIngested(BaseModel):
    """What POST /jobs/{job_id}/metrics stored: points, events, and malformed lines skipped."""

    points: int
    events: int
    errors: int


class MetricSeriesData(BaseModel):
    """One series' points as ``[step, time, value]``: ``step`` null for a series without steps (its x axis is
    the time); ``value`` a number, or a string (text metrics, and the non-finite numbers "nan", "inf", "-inf")."""

    name: str
    worker: str
    kind: Literal["scalar", "text"]
    source: str
    axis: Literal["step", "time"] = "step"
    count: int = Field(description="Points in the requested range, before downsampling.")
    points: list[list[int | float | str | None]] = Field(description="[step, time, value] triples, by x.")


class MetricsData(BaseModel):
    series: list[MetricSeriesData]


class MetricSeriesSummary(BaseModel):
    name: str
    worker: str
    kind: Literal["scalar", "text"]
    source: str
    count: int
    first_step: int | None = None
    last_step: int | None = None
    last_time: float | None = None
    last_value: float | str | None = None
    min: float | None = Field(None, description="Lowest finite value.")
    max: float | None = Field(None, description="Highest finite value.")


class MetricsSummary(BaseModel):
    series: list[MetricSeriesSummary]


class MetricsCompare(BaseModel):
    """The same series of several jobs, by job id."""

    jobs: dict[str, list[MetricSeriesData]]


class RunMetrics(BaseModel):
    """The same series of several runs, by run id (a job's run is its job id)."""

    runs: dict[str, list[MetricSeriesData]]


# -- experiments ---------------------------------------------------------------------------------------------


class ExperimentRead(BaseModel):
    """An experiment with how many runs it holds (its deleted runs not counted)."""

    id: str
    name: str
    lifecycle_stage: str = Field(description="active, or deleted (restorable through MLflow's protocol).")
    created_at: datetime
    updated_at: datetime
    tags: dict[str, str] = Field(default_factory=dict)
    run_count: int
    last_run_at: datetime | None = Field(None, description="When its newest run started.")


class ExperimentList(BaseModel):
    items: list[ExperimentRead]

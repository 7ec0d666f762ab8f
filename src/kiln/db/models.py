"""SQLAlchemy 2 models. Only services and repositories import this module; routes never do."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every database (SQLite keeps no zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the database")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime, dict[str, Any]: JSON}


class Organization(Base):
    __tablename__ = "organizations"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    # Fair-share weight between organisations with pending work (2.0: twice the share of a 1.0 organisation).
    share_weight: Mapped[float] = mapped_column(Float, default=1.0, server_default="1.0")
    # The highest priority class its members may submit at; only a platform admin raises it.
    max_priority: Mapped[str] = mapped_column(String(16), default="normal", server_default="normal")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class User(Base):
    __tablename__ = "users"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"), index=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    role: Mapped[str] = mapped_column(String(16), default="member")
    platform_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class AccessKey(Base):
    __tablename__ = "access_keys"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    secret_encrypted: Mapped[str] = mapped_column(Text)
    description: Mapped[str] = mapped_column(String(256), default="", server_default="")
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    expires_at: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(default=None)


class Nonce(Base):
    """Nonces seen per key inside the replay window; the primary key makes a replay fail to insert."""

    __tablename__ = "nonces"

    key_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    nonce: Mapped[str] = mapped_column(String(64), primary_key=True)
    seen_at: Mapped[datetime] = mapped_column(index=True)


class Blob(Base):
    """A content-addressed upload (code bundle) owned by an organisation."""

    __tablename__ = "blobs"

    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"), primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"))
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(128))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    code_sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str | None] = mapped_column(String(64), default=None)
    message: Mapped[str | None] = mapped_column(Text, default=None)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    exit_code: Mapped[int | None] = mapped_column(Integer, default=None)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # What the scheduler granted (cpus, memory, gpu indices) while STARTING/RUNNING.
    allocation: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    backend: Mapped[str] = mapped_column(String(32), default="local")
    # Backend-specific handle to the running attempt (e.g. the shim's pid and run dir).
    handle: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    lease_owner: Mapped[str | None] = mapped_column(String(128), default=None)
    lease_expires_at: Mapped[datetime | None] = mapped_column(default=None)
    not_before: Mapped[datetime | None] = mapped_column(default=None)
    cpus: Mapped[float] = mapped_column(Float, default=1.0)
    memory: Mapped[int | None] = mapped_column(BigInteger, default=None)
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    # Quota category the job counts against (train jobs now; serve and dev come with services and notebooks).
    category: Mapped[str] = mapped_column(String(16), default="train", server_default="train")
    output_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # The job's log's size when its latest attempt ended (the live size of a running job's is read from its file).
    log_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # Scheduling: priority class (0 low, 1 normal, 2 high), gang size (workers + parameter servers; cpus, memory
    # and gpus above are totals over the gang), and why a preemption was requested while it is under way.
    priority: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    workers: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    preempt_reason: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    running_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)

    __table_args__ = (Index("ix_jobs_org_created", "org_id", "created_at"),)


class Quota(Base):
    """Limits of one organisation in one category (or ``total``); NULL means unlimited."""

    __tablename__ = "quotas"

    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"), primary_key=True)
    category: Mapped[str] = mapped_column(String(16), primary_key=True)
    gpus: Mapped[int | None] = mapped_column(Integer, default=None)
    cpus: Mapped[float | None] = mapped_column(Float, default=None)
    memory: Mapped[int | None] = mapped_column(BigInteger, default=None)
    count: Mapped[int | None] = mapped_column(Integer, default=None)
    storage: Mapped[int | None] = mapped_column(BigInteger, default=None)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class AuditEvent(Base):
    """One mutating request or failed authentication. Never holds a secret, a body or a signature."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    time: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    org_id: Mapped[str | None] = mapped_column(String(32), default=None, index=True)
    user_id: Mapped[str | None] = mapped_column(String(32), default=None)
    key_id: Mapped[str | None] = mapped_column(String(64), default=None)
    action: Mapped[str] = mapped_column(String(96))
    resource: Mapped[str] = mapped_column(String(512), default="")
    outcome: Mapped[str] = mapped_column(String(32))
    status: Mapped[int] = mapped_column(Integer)
    client: Mapped[str] = mapped_column(String(64), default="")
    detail: Mapped[str] = mapped_column(String(256), default="")


class OfflineAction(Base):
    """Something ``kiln admin`` did to the database with no server running (a recovery key), for the next server
    start to announce in its log. Written in the transaction of the action and of its audit event; a server marks
    it ``announced_at`` once it has logged it."""

    __tablename__ = "offline_actions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    time: Mapped[datetime] = mapped_column(default=utcnow)
    action: Mapped[str] = mapped_column(String(96))
    audit_event_id: Mapped[int | None] = mapped_column(Integer, default=None)  # no foreign key: audit rows expire
    message: Mapped[str] = mapped_column(Text)
    announced_at: Mapped[datetime | None] = mapped_column(default=None)


class TaskLease(Base):
    """Which server runs a background task of one scope (kiln.services.task_leases): one row per scope. ``token``
    is the fencing token, one higher whenever the lease changes hands or is taken back after it expired."""

    __tablename__ = "task_leases"

    scope: Mapped[str] = mapped_column(String(96), primary_key=True)
    owner: Mapped[str] = mapped_column(String(128))
    token: Mapped[int] = mapped_column(BigInteger, default=1)
    acquired_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column()


class JobEvent(Base):
    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    time: Mapped[datetime] = mapped_column(default=utcnow)
    from_state: Mapped[str | None] = mapped_column(String(16), default=None)
    to_state: Mapped[str | None] = mapped_column(String(16), default=None)
    reason: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(Text, default="")


class MetricSeries(Base):
    """One metric of one job member (``worker0``): scalar or text, its x axis, and running totals for summaries."""

    __tablename__ = "metric_series"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    worker: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(8))  # scalar | text
    source: Mapped[str] = mapped_column(String(8), default="sdk")  # sdk | log | tb | sys | api
    axis: Mapped[str] = mapped_column(String(4), default="step")  # step | time: the x axis of its plots
    count: Mapped[int] = mapped_column(BigInteger, default=0)  # points so far (also the next point's seq)
    first_step: Mapped[int | None] = mapped_column(BigInteger, default=None)
    last_step: Mapped[int | None] = mapped_column(BigInteger, default=None)
    last_time: Mapped[float | None] = mapped_column(Float, default=None)
    last_value: Mapped[float | None] = mapped_column(Float, default=None)
    last_text: Mapped[str | None] = mapped_column(Text, default=None)
    min_value: Mapped[float | None] = mapped_column(Float, default=None)
    max_value: Mapped[float | None] = mapped_column(Float, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ux_metric_series_job_worker_name", "job_id", "worker", "name", unique=True),)


class MetricPoint(Base):
    """A point of a series. ``seq`` numbers a series' points in arrival order; ``value`` holds finite numbers,
    ``text`` strings and the non-finite numbers ("nan", "inf", "-inf": SQLite cannot store a NaN)."""

    __tablename__ = "metric_points"

    series_id: Mapped[int] = mapped_column(ForeignKey("metric_series.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    step: Mapped[int | None] = mapped_column(BigInteger, default=None)
    time: Mapped[float] = mapped_column(Float(precision=53))
    value: Mapped[float | None] = mapped_column(Float(precision=53), default=None)
    text: Mapped[str | None] = mapped_column(Text, default=None)

    __table_args__ = (Index("ix_metric_points_series_step", "series_id", "step"),)


class MetricChunk(Base):
    """The M4 summary (first, last, min and max point) of ``seq // CHUNK`` of a series' finite numeric points,
    kept up to date at ingestion: downsampling a long series reads these instead of every point."""

    __tablename__ = "metric_chunks"

    series_id: Mapped[int] = mapped_column(ForeignKey("metric_series.id", ondelete="CASCADE"), primary_key=True)
    chunk: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    count: Mapped[int] = mapped_column(Integer)
    first_x: Mapped[float] = mapped_column(Float(precision=53))
    first_t: Mapped[float] = mapped_column(Float(precision=53))
    first_v: Mapped[float] = mapped_column(Float(precision=53))
    last_x: Mapped[float] = mapped_column(Float(precision=53))
    last_t: Mapped[float] = mapped_column(Float(precision=53))
    last_v: Mapped[float] = mapped_column(Float(precision=53))
    min_x: Mapped[float] = mapped_column(Float(precision=53))
    min_t: Mapped[float] = mapped_column(Float(precision=53))
    min_v: Mapped[float] = mapped_column(Float(precision=53))
    max_x: Mapped[float] = mapped_column(Float(precision=53))
    max_t: Mapped[float] = mapped_column(Float(precision=53))
    max_v: Mapped[float] = mapped_column(Float(precision=53))


class MetricCursor(Base):
    """How far a job's spool file has been ingested (bytes); advanced in the transaction that stores its points."""

    __tablename__ = "metric_cursors"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    file: Mapped[str] = mapped_column(String(255), primary_key=True)
    offset: Mapped[int] = mapped_column(BigInteger, default=0)
    errors: Mapped[int] = mapped_column(Integer, default=0)  # malformed lines skipped so far
    reported: Mapped[bool] = mapped_column(Boolean, default=False)  # the one MetricsSpoolError event was written
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class DataBlob(Base):
    """The content of dataset files, content-addressed per organisation (``orgs/<org>/data/sha256/..``): one row
    however many files of however many versions hold these bytes."""

    __tablename__ = "data_blobs"

    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"), primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Dataset(Base):
    """A dataset name of an organisation; its content lives in numbered, immutable versions."""

    __tablename__ = "datasets"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"))
    name: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ux_datasets_org_name", "org_id", "name", unique=True),)


class DatasetVersion(Base):
    """A manifest of files. A draft (``version`` NULL) is invisible; committing it, once every blob is stored,
    gives it the next number and makes it the latest."""

    __tablename__ = "dataset_versions"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"))
    version: Mapped[int | None] = mapped_column(Integer, default=None)
    state: Mapped[str] = mapped_column(String(16), default="draft")  # draft | ready
    manifest_sha256: Mapped[str] = mapped_column(String(64))
    file_count: Mapped[int] = mapped_column(Integer, default=0)
    size: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    committed_at: Mapped[datetime | None] = mapped_column(default=None)

    __table_args__ = (
        Index("ux_dataset_versions_number", "dataset_id", "version", unique=True),
        Index("ix_dataset_versions_manifest", "dataset_id", "manifest_sha256"),
    )


class DatasetFile(Base):
    """One file of a dataset version: its relative path and the blob that holds its bytes."""

    __tablename__ = "dataset_files"

    version_id: Mapped[str] = mapped_column(ForeignKey("dataset_versions.id", ondelete="CASCADE"), primary_key=True)
    path: Mapped[str] = mapped_column(String(1024), primary_key=True)
    org_id: Mapped[str] = mapped_column(String(32))
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))

    __table_args__ = (Index("ix_dataset_files_org_sha", "org_id", "sha256"),)


class DataUpload(Base):
    """An open upload session of one blob: one per (organisation, sha256), so asking again resumes it. Its size
    counts against the storage quota from the moment it is opened."""

    __tablename__ = "data_uploads"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"))
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    part_size: Mapped[int] = mapped_column(BigInteger)
    mode: Mapped[str] = mapped_column(String(16))  # api | presigned
    store_upload_id: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ux_data_uploads_org_sha", "org_id", "sha256", unique=True),)


class DataUploadPart(Base):
    """A part of an upload session: what the client declared (size, checksums) and whether it was received."""

    __tablename__ = "data_upload_parts"

    upload_id: Mapped[str] = mapped_column(ForeignKey("data_uploads.id", ondelete="CASCADE"), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    md5: Mapped[str | None] = mapped_column(String(32), default=None)  # hex
    received: Mapped[bool] = mapped_column(Boolean, default=False)


class TuningStudy(Base):
    """A hyperparameter tuning study (kiln.domain.studies): its spec, state, and the counts and best trial the
    driver keeps current. Its sampler's and pruner's own records are Optuna's, in Optuna's tables."""

    __tablename__ = "tuning_studies"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"))
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(128))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    code_sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str | None] = mapped_column(String(64), default=None)
    message: Mapped[str | None] = mapped_column(Text, default=None)
    planned_trials: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)

    __table_args__ = (Index("ix_tuning_studies_org_created", "org_id", "created_at"),)


class TuningTrial(Base):
    """One trial of a study: the Optuna trial it is, the job that runs it, and what the driver saw of it.
    ``reported_seq`` is how far the objective's points were fed to the pruner; ``told`` whether Optuna was told
    the trial's end (the row's final state is written first, so a crash between the two is finished later)."""

    __tablename__ = "tuning_trials"

    study_id: Mapped[str] = mapped_column(ForeignKey("tuning_studies.id", ondelete="CASCADE"), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    optuna_trial_id: Mapped[int] = mapped_column(BigInteger)
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"), default=None, index=True)
    state: Mapped[str] = mapped_column(String(16))
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    value: Mapped[float | None] = mapped_column(Float(precision=53), default=None)
    reported_seq: Mapped[int] = mapped_column(BigInteger, default=-1)
    last_step: Mapped[int | None] = mapped_column(BigInteger, default=None)
    last_value: Mapped[float | None] = mapped_column(Float(precision=53), default=None)
    pruned_step: Mapped[int | None] = mapped_column(BigInteger, default=None)
    message: Mapped[str] = mapped_column(Text, default="")
    told: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)

    __table_args__ = (Index("ux_tuning_trials_optuna", "study_id", "optuna_trial_id", unique=True),)


class TuningEvent(Base):
    __tablename__ = "tuning_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study_id: Mapped[str] = mapped_column(ForeignKey("tuning_studies.id", ondelete="CASCADE"), index=True)
    time: Mapped[datetime] = mapped_column(default=utcnow)
    from_state: Mapped[str | None] = mapped_column(String(16), default=None)
    to_state: Mapped[str | None] = mapped_column(String(16), default=None)
    reason: Mapped[str] = mapped_column(String(64))
    trial: Mapped[int | None] = mapped_column(Integer, default=None)
    message: Mapped[str] = mapped_column(Text, default="")


class Service(Base):
    """A model service (kiln.domain.serving): its spec, the model version its current revision serves, and
    how many replicas it wants now (autoscaling moves it between the spec's min and max)."""

    __tablename__ = "services"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"))
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(63))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    code_sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    state: Mapped[str] = mapped_column(String(16))
    message: Mapped[str | None] = mapped_column(Text, default=None)
    model_name: Mapped[str] = mapped_column(String(100))
    model_version: Mapped[int] = mapped_column(Integer)
    revision: Mapped[int] = mapped_column(Integer, default=1)
    desired_replicas: Mapped[int] = mapped_column(Integer)
    last_request_at: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ux_services_org_name", "org_id", "name", unique=True),)


class ServiceReplica(Base):
    """One replica of a service: the job that runs it (category ``serve``), the revision and model version it
    serves, and where it stands for the router."""

    __tablename__ = "service_replicas"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    service_id: Mapped[str] = mapped_column(ForeignKey("services.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"), default=None, index=True)
    revision: Mapped[int] = mapped_column(Integer)
    model_version: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    ready_at: Mapped[datetime | None] = mapped_column(default=None)
    ended_at: Mapped[datetime | None] = mapped_column(default=None)


class ServiceKey(Base):
    """A service-scoped token (``kst.<id>.<secret>``): it may predict on its service and do nothing else. Only
    the secret's SHA-256 is kept."""

    __tablename__ = "service_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    service_id: Mapped[str] = mapped_column(ForeignKey("services.id", ondelete="CASCADE"), index=True)
    secret_sha256: Mapped[str] = mapped_column(String(64))
    created_by: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Model(Base):
    """A registered model of an organisation (kiln.domain.models): its versions are numbered from 1 and a number
    is never given twice while the model exists (``latest_version`` is the highest given so far)."""

    __tablename__ = "models"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"))
    name: Mapped[str] = mapped_column(String(100))
    latest_version: Mapped[int] = mapped_column(Integer, default=0)
    created_by: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ux_models_org_name", "org_id", "name", unique=True),)


class ModelVersion(Base):
    """An immutable version: files copied from a job's outputs, and its lineage. The job is not a foreign key:
    the lineage (its id, spec and metrics, copied here) outlives the job."""

    __tablename__ = "model_versions"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    framework: Mapped[str] = mapped_column(String(16))
    description: Mapped[str | None] = mapped_column(Text, default=None)
    source_path: Mapped[str] = mapped_column(String(1024))
    file_count: Mapped[int] = mapped_column(Integer, default=0)
    size: Mapped[int] = mapped_column(BigInteger, default=0)
    job_id: Mapped[str] = mapped_column(String(32), index=True)
    job_name: Mapped[str | None] = mapped_column(String(128), default=None)
    job_state: Mapped[str | None] = mapped_column(String(16), default=None)
    job_spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)  # name -> the last value of each scalar series
    study_id: Mapped[str | None] = mapped_column(String(32), default=None)
    trial_number: Mapped[int | None] = mapped_column(Integer, default=None)
    created_by: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ux_model_versions_number", "model_id", "version", unique=True),)


class ModelFile(Base):
    """One file of a model version: its path in the version and the data blob (``data_blobs``, shared with
    datasets) that holds its bytes."""

    __tablename__ = "model_files"

    version_id: Mapped[str] = mapped_column(ForeignKey("model_versions.id", ondelete="CASCADE"), primary_key=True)
    path: Mapped[str] = mapped_column(String(1024), primary_key=True)
    org_id: Mapped[str] = mapped_column(String(32))
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))

    __table_args__ = (Index("ix_model_files_org_sha", "org_id", "sha256"),)


class ModelAlias(Base):
    """A movable name of one version of a model (``production`` → 3)."""

    __tablename__ = "model_aliases"

    model_id: Mapped[str] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), primary_key=True)
    alias: Mapped[str] = mapped_column(String(63), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    updated_by: Mapped[str] = mapped_column(String(32))
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

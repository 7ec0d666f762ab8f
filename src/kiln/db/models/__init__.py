"""SQLAlchemy 2 models, one module per part of the platform. Only services and repositories import this package;
routes never do. Everything is importable from here: ``from kiln.db.models import Job``."""

from kiln.db.models.accounts import AccessKey, AuditEvent, IdempotencyKey, Nonce, OfflineAction, Organization, User
from kiln.db.models.base import Base, UTCDateTime, utcnow
from kiln.db.models.datasets import DataBlob, Dataset, DatasetFile, DatasetVersion, DataUpload, DataUploadPart
from kiln.db.models.jobs import Blob, Job, JobEvent, Quota, Server, TaskLease
from kiln.db.models.metrics import MetricChunk, MetricCursor, MetricPoint, MetricSeries
from kiln.db.models.registry import Model, ModelAlias, ModelFile, ModelVersion
from kiln.db.models.serving import Service, ServiceKey, ServiceReplica, ServiceTraffic
from kiln.db.models.studies import TuningEvent, TuningStudy, TuningTrial

__all__ = [
    "AccessKey",
    "AuditEvent",
    "Base",
    "Blob",
    "DataBlob",
    "DataUpload",
    "DataUploadPart",
    "Dataset",
    "DatasetFile",
    "DatasetVersion",
    "IdempotencyKey",
    "Job",
    "JobEvent",
    "MetricChunk",
    "MetricCursor",
    "MetricPoint",
    "MetricSeries",
    "Model",
    "ModelAlias",
    "ModelFile",
    "ModelVersion",
    "Nonce",
    "OfflineAction",
    "Organization",
    "Quota",
    "Server",
    "Service",
    "ServiceKey",
    "ServiceReplica",
    "ServiceTraffic",
    "TaskLease",
    "TuningEvent",
    "TuningStudy",
    "TuningTrial",
    "UTCDateTime",
    "User",
    "utcnow",
]

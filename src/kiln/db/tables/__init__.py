"""The ORM tables (SQLAlchemy 2 models), one module per part of the platform. Use cases, tasks and the scheduler
import this package; routes never do. Everything is importable from here: ``from kiln.db.tables import Job``."""

from kiln.db.tables.accounts import AccessKey, AuditEvent, IdempotencyKey, Nonce, OfflineAction, Organization, User
from kiln.db.tables.base import Base, UTCDateTime, utcnow
from kiln.db.tables.datasets import DataBlob, Dataset, DatasetFile, DatasetVersion, DataUpload, DataUploadPart
from kiln.db.tables.jobs import Blob, Job, JobEvent, OutputManifest, Quota, Server, TaskLease
from kiln.db.tables.metrics import MetricChunk, MetricCursor, MetricPoint, MetricSeries
from kiln.db.tables.notebooks import Notebook
from kiln.db.tables.notifications import NotificationDelivery, NotificationEvent, NotificationSubscription
from kiln.db.tables.pipelines import PipelineRun, PipelineSchedule, PipelineStep
from kiln.db.tables.registry import Model, ModelAlias, ModelFile, ModelVersion
from kiln.db.tables.serving import Service, ServiceKey, ServiceReplica, ServiceTraffic
from kiln.db.tables.studies import TuningEvent, TuningStudy, TuningTrial
from kiln.db.tables.tracking import Experiment, LoggedModel, Run, RunParam, RunTag
from kiln.db.tables.usage import Budget, Price, UsageDay, UsageHour, UsageRecord

__all__ = [
    "AccessKey",
    "AuditEvent",
    "Base",
    "Blob",
    "Budget",
    "DataBlob",
    "DataUpload",
    "DataUploadPart",
    "Dataset",
    "DatasetFile",
    "DatasetVersion",
    "Experiment",
    "IdempotencyKey",
    "Job",
    "JobEvent",
    "LoggedModel",
    "MetricChunk",
    "MetricCursor",
    "MetricPoint",
    "MetricSeries",
    "Model",
    "ModelAlias",
    "ModelFile",
    "ModelVersion",
    "Nonce",
    "Notebook",
    "NotificationDelivery",
    "NotificationEvent",
    "NotificationSubscription",
    "OfflineAction",
    "Organization",
    "OutputManifest",
    "PipelineRun",
    "PipelineSchedule",
    "PipelineStep",
    "Price",
    "Quota",
    "Run",
    "RunParam",
    "RunTag",
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
    "UsageDay",
    "UsageHour",
    "UsageRecord",
    "User",
    "utcnow",
]

"""The composition root: builds every part of a server from one Settings and owns their lifetimes."""

from __future__ import annotations

import fcntl
import gc
import logging
import os
from pathlib import Path
from typing import IO

from kiln.auth.ratelimit import RateLimiter
from kiln.auth.secrets import SecretBox, load_or_create_server_key
from kiln.backends import registry
from kiln.backends.base import Backend, BackendDeps
from kiln.backends.capabilities import ExtractsMetrics, RuntimeBuilder, SpecValidator
from kiln.backends.local.runtime_builder import host_runtime_builder
from kiln.db import migrate
from kiln.db.session import Database
from kiln.domain.catalog import DEFAULT_CATALOG, load_catalog_file
from kiln.domain.metric_limits import check_ceilings
from kiln.domain.spec import JobSpec
from kiln.errors import KilnError
from kiln.metrics.budget import MetricBudgets, limits_from_settings
from kiln.metrics.spools import metric_spools
from kiln.metrics.store import MetricsStore
from kiln.platform.server_metrics import ServerMetrics
from kiln.routing.router import Router
from kiln.routing.shadow import Shadows
from kiln.scheduler.loop import Reconciler
from kiln.scheduler.submit_placement import SubmitPlacement
from kiln.settings import Settings
from kiln.storage.logs import LogStore
from kiln.storage.store import ObjectStore
from kiln.tasks.backend_work import backend_tasks
from kiln.tasks.checkpoint_sync import CheckpointSync, EventSync
from kiln.tasks.leases import TaskLeases
from kiln.tasks.log_metrics import LogMetrics
from kiln.tasks.log_shipping import LogShipping
from kiln.tasks.metrics_ingest import MetricsIngester
from kiln.tasks.nonce_flush import nonce_flush
from kiln.tasks.notebooks import NotebookControl
from kiln.tasks.notifications import NotificationTask
from kiln.tasks.pipelines import PipelineDriver
from kiln.tasks.presence import ServerPresence
from kiln.tasks.purges import purges
from kiln.tasks.runner import Task, TaskRunner
from kiln.tasks.serving import ServingControl, spool_writer
from kiln.tasks.serving_routes import RouteSync, remote_traffic
from kiln.tasks.studies import StudyDriver
from kiln.usecases.access.accounts import AccountService
from kiln.usecases.access.audit import AuditService
from kiln.usecases.access.idempotency import Idempotency
from kiln.usecases.access.identity import Credentials, IdentityService
from kiln.usecases.access.quotas import QuotaService
from kiln.usecases.budgets import BudgetService
from kiln.usecases.data.blobs import BlobService
from kiln.usecases.data.datasets import DatasetService
from kiln.usecases.data.outputs import OutputService
from kiln.usecases.inputs.inputs import dataset_pinner, input_resolver, job_output_pinner, model_pinner
from kiln.usecases.inputs.output_manifests import OutputManifests
from kiln.usecases.jobs.jobs import JobService
from kiln.usecases.jobs.recovery import announce_offline_actions
from kiln.usecases.jobs.runtimes import RuntimeService
from kiln.usecases.jobs.scheduling import SchedulingService
from kiln.usecases.models.logged_models import LoggedModels
from kiln.usecases.models.model_registry import ModelRegistry
from kiln.usecases.models.serving import ServingService
from kiln.usecases.notebooks import NotebookService
from kiln.usecases.notifications.notification_sending import Sender
from kiln.usecases.notifications.notifications import NotificationService
from kiln.usecases.operations.nodes import NodeService
from kiln.usecases.operations.servers import ServerDirectory
from kiln.usecases.pipelines import PipelineService
from kiln.usecases.tracking.metrics import MetricsService
from kiln.usecases.tracking.run_artifacts import RunArtifacts
from kiln.usecases.tracking.tracking import TrackingService
from kiln.usecases.tuning.studies import StudyService
from kiln.usecases.usage.usage import SETTLE_PASS_SECONDS, UsageService

log = logging.getLogger(__name__)


class Platform:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        settings.home.mkdir(parents=True, exist_ok=True)
        os.chmod(settings.home, 0o700)
        settings.run_dir.mkdir(parents=True, exist_ok=True)
        self._lock = self._take_home_lock(settings.run_dir / "server.lock", settings.endpoint)
        self.db = Database(
            settings.resolved_database_url, settings.database_idle_transaction_seconds, metering=settings.metering
        )
        migrate.upgrade(self.db.engine)
        key = (
            settings.server_key.encode()
            if settings.server_key
            else load_or_create_server_key(settings.home / "server.key")
        )
        self.box = SecretBox(key)
        self.store = ObjectStore(settings.resolved_storage_url, **settings.storage_options)
        self.logs = LogStore(settings.logs_dir, self.store)  # read through every server (storage/logs.py)
        self.catalog = DEFAULT_CATALOG
        if settings.runtime_catalog is not None:
            path = settings.runtime_catalog
            self.catalog = DEFAULT_CATALOG.extended(load_catalog_file(path.read_text(), str(path)))
        self.identity = IdentityService(self.db, self.box, settings, key)
        self.accounts = AccountService(self.db, self.box, self.identity)
        self.quotas = QuotaService(self.db, self.logs)
        self.audit = AuditService(self.db, settings.audit_retention_days)
        self.rate_limiter = RateLimiter(settings.rate_limit_per_second, settings.rate_limit_burst)
        # The servers sharing the database, counted every heartbeat: each enforces its share of every rate limit.
        self.servers = ServerPresence(
            self.db,
            settings.resolved_instance_id,
            settings.endpoint,
            settings.server_heartbeat_seconds,
            on_count=self.rate_limiter.share,
        )
        self.server_directory = ServerDirectory(self.db, settings.server_heartbeat_seconds)  # who holds what
        # Metrics: the store both ingestion paths write through, the task that tails the jobs' spool files where
        # the backend puts them (a shim wakes it: the backend's metrics_ready), and the server's own numbers for
        # /metrics. A trial's new objective points are judged at once by the studies task, whichever path stored
        # them.
        # Every job's metrics budget (its spec's metrics.limits over KILN_METRICS_*), enforced by the store.
        metric_defaults, self.metric_ceilings = limits_from_settings(settings)
        self.metrics_store = MetricsStore(self.db, MetricBudgets(self.db, metric_defaults, self.metric_ceilings))
        self.prometheus = ServerMetrics(self.db, lambda: self.metrics_store.points_ingested)
        self.backend = self._backend()
        self.metric_spools = metric_spools(self.backend, settings.jobs_dir)
        self.metrics_ingester = MetricsIngester(
            self.db,
            self.metrics_store,
            self.metric_spools,
            owner=settings.resolved_instance_id,
            on_ingested=self._judge_trials,
        )
        # The Idempotency-Keys of every create (jobs, studies, services, model versions): one store of keys.
        self.idempotency = Idempotency(self.db, settings.idempotency_retention_seconds)
        # Datasets and model versions a job reads: pinned at submit, resolved to files when an attempt starts.
        self.datasets = DatasetService(self.db, self.store, settings, self.quotas)
        self.models = ModelRegistry(
            self.db, self.store, settings, self.quotas, self.metrics_ingester.ingest_now, self.idempotency
        )
        # Ended jobs' outputs that other jobs read: checked and read at submit, staged when an attempt starts.
        self.output_manifests = OutputManifests(self.db, self.store, self.models.tmp_dir)
        self.reconciler = Reconciler(
            self.db,
            self.backend,
            self.logs,
            settings,
            mint_token=self.identity.mint_job_token,
            resolve_inputs=input_resolver(self.datasets, self.models, self.output_manifests),
            on_admitted=self.prometheus.admission.observe,  # read for a whole pass in one query
            on_ended=lambda: self.pipeline_driver.wake(),  # a step's job ended: its next step starts now
        )
        self.usage = UsageService(
            self.db, settings.currency
        )  # every attempt's hold, metered by the job state machine; prices
        # Monthly cost limits, checked at every submit; one that stops running work acts in the task `usage`.
        self.budgets = BudgetService(self.db, self.usage, wake=lambda: self.tasks.wake("usage"))
        if settings.metrics_token:  # usage by organisation names organisations: only behind the token
            self.prometheus.report_usage(self.usage)
        self.jobs = JobService(
            self.db,
            self.catalog,
            self.backend.nodes,
            self.reconciler.wake,
            self._validate_spec,
            self.quotas,
            network_host_orgs=tuple(settings.network_host_org_list),
            idempotency=self.idempotency,
            backend_name=self.backend.name,
            resolve_dataset=dataset_pinner(self.datasets),
            pin_model=model_pinner(self.models),
            pin_job=job_output_pinner(self.output_manifests),
            budgets=self.budgets,
            place_now=SubmitPlacement(self.reconciler).place,  # a job that fits now skips the queue pass
        )
        self.scheduling = SchedulingService(self.db, self.backend, settings, self.jobs)
        self.nodes = NodeService(self.db, self.backend.nodes)
        self.blobs = BlobService(self.db, self.store, settings, self.quotas)
        self.outputs = OutputService(self.jobs, self.logs, self.store, self.blobs.tmp_dir, self.quotas)
        self.runtimes = RuntimeService(
            self.backend
            if isinstance(self.backend, RuntimeBuilder)
            else host_runtime_builder(self.catalog, settings.resolved_runtimes_dir)
        )
        shimless = [] if isinstance(self.backend, ExtractsMetrics) else [self.backend.name]
        self.log_metrics = LogMetrics(self.db, self.logs, self.metric_spools, shimless)
        self.metrics = MetricsService(self.db, self.jobs, self.metrics_store, on_ingested=self._judge_trials)
        self.tracking = TrackingService(self.db, self.metrics_store)  # experiments and runs (every job is a run)
        self.run_artifacts = RunArtifacts(self.tracking, self.outputs, self.store, self.blobs.tmp_dir, self.quotas)
        self.logged_models = LoggedModels(self.tracking, self.store, self.blobs.tmp_dir, self.quotas)  # MLflow 3's
        # Tuning studies: the use cases, and the task that runs their trials as jobs.
        self.study_driver = StudyDriver(self.db, self.jobs, settings.home, self.metrics_ingester.ingest_now)
        self.studies = StudyService(self.db, self.jobs, self.study_driver.wake, self.idempotency)
        # Model services: the router (in this process) forwards predicts to the replicas the serving task runs.
        # Every server routes from what the database records of the replicas (serving_routes), and the serving
        # task scales on every live server's traffic.
        self.router = Router(
            self._cold_start,
            latency_observer=self.prometheus.predict_latency.observe,
            batch_observer=self.prometheus.predict_batch.observe,
            track_observer=self.prometheus.observe_track,
        )
        self.shadows = Shadows(self.router)  # copies of predicts to a service's shadow version, compared
        server_id = settings.resolved_instance_id
        self.routes = RouteSync(self.db, self.router, self.box, server_id, self.servers.live_for)
        self.serving_control = ServingControl(
            self.db,
            self.jobs,
            self.router,
            self.logs,
            spool_writer(self.metrics_store),
            self.backend,
            box=self.box,
            remote_traffic=remote_traffic(self.db, server_id, self.servers.live_for),
        )
        self.serving = ServingService(
            self.db,
            self.jobs,
            self.models.resolve,
            self.serving_control.wake,
            self.router.in_flight,
            settings.endpoint,
            self.idempotency,
            traffic=self.router.version_traffic,
            shadow_traffic=self.shadows.stats,
        )
        # Pipelines: runs of declared steps (jobs, a model's registration, a service), driven by a leased task.
        self.pipeline_driver = PipelineDriver(
            self.db,
            self.jobs,
            self.output_manifests,
            self.models,
            self.serving,
            drain_metrics=self.metrics_ingester.ingest_now,
        )
        self.pipelines = PipelineService(self.db, self.jobs, self.pipeline_driver.wake)
        self.pipeline_driver.check = self.pipelines.check  # a scheduled run is checked as a submit is
        # Notebooks: JupyterLab as jobs of category dev, reached through the proxy (kiln.api.notebook_proxy).
        self.notebooks = NotebookService(
            self.db, self.jobs, self.store, settings.endpoint, self._wake_notebooks, self.quotas, self.idempotency
        )
        self.notebook_control = NotebookControl(self.db, self.notebooks, self.backend, self.logs)
        # Both reserve what they write against the organisation's storage quota, which counts running jobs' logs.
        self.checkpoints = CheckpointSync(
            self.db, self.backend, settings.checkpoint_sync_seconds, settings.resolved_instance_id, self.logs
        )
        self.event_sync = EventSync(
            self.db, self.backend, settings.tensorboard_sync_seconds, settings.resolved_instance_id, self.logs
        )
        self.log_shipping = LogShipping(self.db, self.logs, settings.resolved_instance_id, settings.log_ship_seconds)
        # Notifications: subscriptions, and the leased task that delivers what job ends record in the outbox.
        notify = settings.notifications
        self.notifier = NotificationTask(self.db, notify, Sender(notify, self.box, settings.endpoint))
        self.notifications = NotificationService(self.db, self.box, notify, self.notifier.wake)
        # Every piece of background work is a task of one runner, which /readyz and /metrics report.
        self.tasks = TaskRunner(TaskLeases(self.db, settings.resolved_instance_id), settings.lease_seconds)
        for task in self._background_tasks():
            self.tasks.add(task)
        self.prometheus.report_tasks(self.tasks.status)

    def _validate_spec(self, spec: JobSpec) -> None:
        """At submit: the backend's checks, and a metrics budget within the operator's ceilings (422 naming the
        field above one)."""
        check_ceilings(spec.metrics.limits, self.metric_ceilings)
        if isinstance(self.backend, SpecValidator):
            self.backend.validate(spec)

    def _background_tasks(self) -> list[Task]:
        nonces = self.identity.nonces
        tasks = [
            self.servers.task(),
            self.reconciler.task(),
            self.metrics_ingester.task(),
            self.log_metrics.task(),
            self.checkpoints.task(),
            self.event_sync.task(),
            self.log_shipping.task(),
            self.study_driver.task(),
            self.pipeline_driver.task(),
            self.serving_control.task(),
            self.routes.task(),
            self.notebook_control.task(),
            self.notifier.task() if self.settings.notifications.notifications_send else None,
            nonce_flush(nonces) if nonces is not None else None,
            *purges(self.identity, self.audit, self.idempotency),
            Task.writing("usage", self.budgets.usage_pass, SETTLE_PASS_SECONDS, lease_scope="usage"),
            *backend_tasks(self.backend),
        ]
        return [task for task in tasks if task is not None]

    def _wake_notebooks(self) -> None:
        self.tasks.wake("notebooks")

    def _cold_start(self, service_id: str) -> None:
        """A predict found no replica it can reach: the service wants one (recorded for whichever server runs the
        serving task), and this server reads the routes again now, not at the next interval."""
        self.routes.wake()
        self.serving.cold_start(service_id)

    def _backend(self) -> Backend:
        """The backend KILN_BACKEND names, from the registry (one that cannot be loaded is named, with why). Its
        shims wake the reconciler (an attempt changed) and the metrics ingester (a watched metric was written)."""
        deps = BackendDeps(
            self.settings,
            self.store,
            self.logs,
            self.catalog,
            wake=self._wake,
            metrics_ready=self._metrics_ready,
        )
        return registry.create(self.settings.backend, deps)

    def _wake(self, job_id: str | None = None) -> None:
        """The reconciler's wake-up, for the backend built before it (the reconciler drives the backend)."""
        self.reconciler.wake(job_id)

    def _metrics_ready(self, job_id: str | None = None) -> None:
        """The metrics ingester's wake-up, for the backend built before it (the ingester reads the spool files
        where the backend says they are)."""
        self.metrics_ingester.wake(job_id)

    def _judge_trials(self, job_ids: set[str]) -> None:
        """New points of these jobs were stored: the studies task (built after the metrics) judges the trials."""
        self.study_driver.judge_soon(job_ids)

    @staticmethod
    def _take_home_lock(path: Path, endpoint: str) -> IO[str]:
        """One server per $KILN_HOME: its jobs and leases belong to exactly one reconciler. The holder writes its
        pid and address into the lock file, so that a second server can say which one holds it."""
        fh = open(path, "a+")  # noqa: SIM115 - held open for the server's lifetime
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = " ".join(fh.read(200).split())
            fh.close()
            home = path.parent.parent
            raise KilnError(
                f"another Kiln server{f' (pid {holder})' if holder else ''} is running with KILN_HOME={home}; "
                "stop it, or set KILN_HOME (or pass --home) to another directory for this one"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}, {endpoint}\n")
        fh.flush()
        return fh

    def start(self) -> Credentials | None:
        announce_offline_actions(self.db)  # what `kiln admin` did while no server ran, logged once
        creds = self.identity.bootstrap() if self.settings.bootstrap else None
        self.servers.beat()  # counted before the first request: its limits are shared from the start
        # Everything loaded so far lives as long as the server: out of the collector's sight, so that the
        # collections requests trigger scan only what they allocate. Done here, before the task threads start:
        # a collection runs the finalizers of whatever garbage any thread left, in the collecting thread, and one
        # in the application's startup (with the tasks running) is the one place a server was seen to hang on
        # its way up (CI, stop 40: "Waiting for application startup." for 120 s, not reproduced since).
        gc.collect()
        gc.freeze()
        self.tasks.start()
        return creds

    def close(self) -> None:
        self.tasks.stop()
        self.notifier.close()
        self.backend.close()
        self.db.dispose()
        self._lock.close()

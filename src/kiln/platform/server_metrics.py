"""The server's own numbers for ``/metrics`` (kiln.api.prometheus serves them): the prometheus-client registry
of one server, the instruments the API and the reconciler feed, and what is read at scrape time: jobs by state
and backend, counted in the database (so they are right after a restart, and across servers sharing a PostgreSQL
database), and the background tasks of this server. Aggregates only: the one tenant label is the organisation of
the usage counters (bounded by the organisations, never a job or a user), exported only where /metrics needs a
token (``KILN_METRICS_TOKEN``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from kiln.db.session import Database
from kiln.db.tables import Job
from kiln.domain.states import JobState
from kiln.tasks.runner import TaskStatus
from kiln.usecases.usage.usage import UsageService

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
ADMISSION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0)


class _DatabaseCollector(Collector):
    """Counts read from the database on every scrape (so they are right after a restart, and across servers
    sharing a PostgreSQL database), and the ingestion counter of this process."""

    def __init__(self, db: Database, points_ingested: Callable[[], int]) -> None:
        self.db = db
        self.points_ingested = points_ingested

    def describe(self) -> Iterator[Any]:
        return iter(())  # no collect() at registration time: that would query the database

    def collect(self) -> Iterator[Any]:
        jobs = GaugeMetricFamily("kiln_jobs", "Jobs by state and backend.", labels=["state", "backend"])
        queued = 0
        try:
            with self.db.read() as s:
                rows = s.execute(select(Job.state, Job.backend, func.count()).group_by(Job.state, Job.backend)).all()
        except Exception:
            log.exception("reading job counts for /metrics failed")
            rows = []
        counts: dict[tuple[str, str], int] = {}
        for state, backend, n in rows:
            counts[(state, backend)] = n
            if state == JobState.QUEUED:
                queued += n
        for state in JobState:  # every state, zeros included: a series that vanishes breaks rate() and alerts
            backends = {b for (_, b) in counts} or {"local"}
            for backend in sorted(backends):
                jobs.add_metric([str(state), backend], counts.get((str(state), backend), 0))
        yield jobs
        yield GaugeMetricFamily("kiln_queue_length", "Jobs waiting in the queue (QUEUED).", value=queued)
        points = CounterMetricFamily(
            "kiln_metrics_points_ingested", "Metric points stored since this server started (spool files and HTTP)."
        )
        points.add_metric([], self.points_ingested())
        yield points


class _UsageCollector(Collector):
    """What each organisation held and what it cost, as counters (``rate()`` of them: CPUs held now): the
    usage records (kiln.usecases.usage.usage) summed once over all time at the first scrape, then over the time since
    the previous scrape only (the holds that overlap it: the open ones and those just ended), so a scrape costs
    the same with a year of records as with a day's. Every server counts the same totals from the database."""

    FIGURES = (
        ("kiln_usage_cpu_seconds", "CPU-seconds held (every gang member's), by organisation."),
        ("kiln_usage_memory_gib_seconds", "GiB-seconds of memory held, by organisation."),
        ("kiln_usage_gpu_seconds", "GPU-seconds held, by organisation."),
        ("kiln_usage_cost", "Cost under the price table, by organisation."),
    )

    def __init__(self, db: Database, usage: UsageService) -> None:
        self.db = db
        self.usage = usage
        self.totals: dict[str, list[float]] = {}
        self.counted_until = 0.0  # the totals hold every hold's time before this (Unix seconds)
        self.lock = threading.Lock()

    def describe(self) -> Iterator[Any]:
        return iter(())

    def collect(self) -> Iterator[Any]:
        with self.lock:
            now = time.time()
            if now > self.counted_until:
                try:
                    with self.db.read() as s:
                        added = self.usage.by_org(s, self.counted_until, now)
                except Exception:
                    log.exception("reading usage for /metrics failed")
                else:
                    for org, figures in added.items():
                        total = self.totals.setdefault(org, [0.0] * len(self.FIGURES))
                        for i, value in enumerate(figures):
                            total[i] += value
                    self.counted_until = now
            totals = {org: list(values) for org, values in self.totals.items()}
        for i, (name, help_text) in enumerate(self.FIGURES):
            family = CounterMetricFamily(name, help_text, labels=["org"])
            for org in sorted(totals):
                family.add_metric([org], totals[org][i])
            yield family


class _TaskCollector(Collector):
    """Per background task (kiln.tasks.runner) of this server: runs, errors, when the last run ended, how long
    it took. Labelled by task name only (a fixed set, no tenant in it)."""

    def __init__(self, status: Callable[[], list[TaskStatus]]) -> None:
        self.status = status

    def describe(self) -> Iterator[Any]:
        return iter(())

    def collect(self) -> Iterator[Any]:
        runs = CounterMetricFamily("kiln_task_runs", "Runs of each background task.", labels=["task"])
        errors = CounterMetricFamily("kiln_task_errors", "Runs of each background task that raised.", labels=["task"])
        last = GaugeMetricFamily(
            "kiln_task_last_run_timestamp_seconds", "When the task's last run ended (Unix time).", labels=["task"]
        )
        duration = GaugeMetricFamily(
            "kiln_task_duration_seconds", "How long the task's last run took.", labels=["task"]
        )
        for task in self.status():
            runs.add_metric([task.name], task.runs)
            errors.add_metric([task.name], task.errors)
            if task.last_finished is not None:
                last.add_metric([task.name], task.last_finished)
            if task.last_duration is not None:
                duration.add_metric([task.name], task.last_duration)
        yield from (runs, errors, last, duration)


class ServerMetrics:
    """The registry of one server and the instruments the API and the reconciler feed."""

    def __init__(self, db: Database, points_ingested: Callable[[], int]) -> None:
        self.db = db
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Histogram(
            "kiln_http_request_duration_seconds",
            "API request latency by method, route template and status.",
            ["method", "route", "status"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.admission = Histogram(
            "kiln_job_admission_seconds",
            "From a job entering the queue (submitted, re-queued or restarting) to STARTING.",
            buckets=ADMISSION_BUCKETS,
            registry=self.registry,
        )
        # Model services' predicts, over all services (no tenant labels on this unauthenticated endpoint; a
        # service's own numbers are in the metrics store, as points of its replicas' jobs).
        self.predict_latency = Histogram(
            "kiln_predict_duration_seconds",
            "Predict requests the router forwarded: from the router to the replica's answer.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.predict_batch = Histogram(
            "kiln_predict_batch_size",
            "Sizes of the batches replicas answered forwarded predicts in.",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096),
            registry=self.registry,
        )
        # Per track of a traffic split (stable, canary, shadow: the copies): three values, never a version number or
        # a service's name.
        self.predict_track_requests = Counter(
            "kiln_predict_track_requests",
            "Predicts the router forwarded, by track of the service's traffic split and outcome (ok, error).",
            ["track", "outcome"],
            registry=self.registry,
        )
        self.predict_track_latency = Histogram(
            "kiln_predict_track_duration_seconds",
            "Predicts the router forwarded, by track of the service's traffic split: router to answer.",
            ["track"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_DatabaseCollector(db, points_ingested))

    def observe_track(self, track: str, seconds: float, error: bool) -> None:
        """One forwarded predict of ``track`` (``stable``, ``canary``, or ``shadow``: a copy)."""
        self.predict_track_requests.labels(track, "error" if error else "ok").inc()
        self.predict_track_latency.labels(track).observe(seconds)

    def report_usage(self, usage: UsageService) -> None:
        """Export what each organisation held and what it cost (``usage`` reads the records)."""
        self.registry.register(_UsageCollector(self.db, usage))

    def report_tasks(self, status: Callable[[], list[TaskStatus]]) -> None:
        """Export the background tasks that ``status`` describes (the platform's runner)."""
        self.registry.register(_TaskCollector(status))

    def render(self) -> bytes:
        return generate_latest(self.registry)

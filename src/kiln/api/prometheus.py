"""``/metrics``: the server's own numbers in the Prometheus text format (prometheus-client).

Only aggregates, never a tenant-identifying label: jobs by state and backend (counted in the database at scrape
time), the queue length, the admission latency (QUEUED → STARTING, observed by the reconciler), API request
latency by route template and status (never a raw path with ids in it), and the metric points ingested.
Open like most exporters; with ``KILN_METRICS_TOKEN`` set it needs ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import object_session
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kiln.api.responses import errors
from kiln.db.models import Job, JobEvent, utcnow
from kiln.db.session import Database
from kiln.domain.states import JobState

log = logging.getLogger(__name__)

API_PREFIX = "/api/v1"
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


class ServerMetrics:
    """The registry of one server and the instruments the API and the reconciler feed."""

    def __init__(self, db: Database, points_ingested: Callable[[], int]) -> None:
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
        self.registry.register(_DatabaseCollector(db, points_ingested))

    def observe_start(self, job: Job) -> None:
        """The reconciler's hook, inside the transaction that moved ``job`` to STARTING."""
        try:
            s = object_session(job)
            since = None
            if s is not None:
                since = s.scalar(
                    select(JobEvent.time)
                    .where(JobEvent.job_id == job.id, JobEvent.to_state.in_([JobState.QUEUED, JobState.RESTARTING]))
                    .order_by(JobEvent.id.desc())
                    .limit(1)
                )
            since = since or job.created_at
            self.admission.observe(max(0.0, (utcnow() - since).total_seconds()))
        except Exception:  # a metric must never stop a job from starting
            log.exception("observing the admission latency failed")

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestMetricsMiddleware:
    """Times every HTTP request; labels it with the route template (``/api/v1/jobs/{job_id}``), not the path."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            platform = getattr(scope["app"].state, "platform", None) if "app" in scope else None
            server_metrics = getattr(platform, "prometheus", None)
            if server_metrics is not None:
                route = scope.get("route")
                template = getattr(route, "path", None) or "unmatched"
                api = scope["path"].startswith(API_PREFIX + "/")
                if api and template.startswith("/") and not template.startswith(API_PREFIX + "/"):
                    template = API_PREFIX + template  # the route of an included router: its path without the prefix
                server_metrics.requests.labels(scope["method"], template, str(status)).observe(
                    time.perf_counter() - started
                )


router = APIRouter(tags=["health"])


@router.get(
    "/metrics",
    summary="Server metrics in the Prometheus text format (KILN_METRICS_TOKEN: needs that bearer token)",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}, **errors(401, signed=False)},
)
async def prometheus_metrics(request: Request) -> Response:
    platform = request.app.state.platform
    token = platform.settings.metrics_token
    if token:
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return Response(
                '{"code": "unauthenticated", "message": "/metrics needs Authorization: Bearer <KILN_METRICS_TOKEN>"}',
                status_code=401,
                media_type="application/json",
                headers={"WWW-Authenticate": "Bearer"},
            )
    body = await run_in_threadpool(platform.prometheus.render)
    return Response(body, media_type=CONTENT_TYPE_LATEST)

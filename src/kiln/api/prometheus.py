"""``/metrics``: the server's own numbers in the Prometheus text format (prometheus-client).

Only aggregates, never a tenant-identifying label: jobs by state and backend (counted in the database at scrape
time), the queue length, the admission latency (QUEUED → STARTING, observed by the reconciler), API request
latency by route template and status (never a raw path with ids in it), the metric points ingested and the
background tasks. The registry and what it reads at scrape time are kiln.platform.server_metrics
(``platform.prometheus``); this module times the requests and serves the text. Open like most exporters; with
``KILN_METRICS_TOKEN`` set it needs ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import hmac
import time

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kiln.api.responses import errors

API_PREFIX = "/api/v1"


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

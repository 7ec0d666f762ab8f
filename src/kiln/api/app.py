"""The FastAPI application."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from anyio import to_thread
from fastapi import FastAPI
from fastapi.routing import APIRoute, APIRouter
from starlette.routing import Mount, Route, compile_path

from kiln import __version__
from kiln.api import docs, session
from kiln.api.auth import SignatureMiddleware
from kiln.api.console import MLFLOW_UI_PATHS, ConsoleFallback, console_dir
from kiln.api.errors import RouteMethods, install_error_handlers
from kiln.api.mlflow import create_mlflow_app
from kiln.api.notebook_proxy import NotebookProxy
from kiln.api.nul import NulGuard
from kiln.api.prometheus import RequestMetricsMiddleware
from kiln.api.prometheus import router as prometheus_router
from kiln.api.routers import (
    admin,
    blobs,
    datasets,
    jobs,
    metrics,
    models,
    nodes,
    notebooks,
    notifications,
    pipelines,
    runs,
    runtimes,
    scheduling,
    services,
    studies,
    system,
    tenancy,
    usage,
)
from kiln.platform import Platform
from kiln.settings import Settings

log = logging.getLogger("kiln.server")
API_PREFIX = "/api/v1"


def start_platform(settings: Settings) -> Platform:
    """Build every part of a server and start its background work; on the first start, the admin's credentials
    are written to ``$KILN_HOME/admin.env``."""
    platform = Platform(settings)
    try:
        creds = platform.start()
    except BaseException:
        platform.close()
        raise
    if creds is not None:
        log.warning(
            "first start: admin credentials written to %s (source it: `set -a; . %s; set +a`)",
            settings.home / "admin.env",
            settings.home / "admin.env",
        )
    return platform


def create_app(settings: Settings | None = None, platform: Platform | None = None) -> FastAPI:
    """The application. ``kiln server`` starts the ``platform`` before it serves (so that a failure is said
    before uvicorn runs); without one, the application's lifespan starts it. Either way the lifespan's end closes
    it."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        running = platform or start_platform(settings)
        app.state.platform = running
        # Request work in threads is short (a query, a nonce insert): a few threads do it with less contention
        # and far better tail latency than many. Nothing waits in a thread (log following is async).
        to_thread.current_default_thread_limiter().total_tokens = settings.worker_threads
        # What start-up made lives as long as the server: out of the collector's sight, so that the full
        # collections that request work triggers (thousands of points per metrics batch) do not walk it again.
        gc.freeze()
        try:
            yield
        finally:
            running.close()

    app = FastAPI(
        title="Kiln",
        version=__version__,
        description="Self-hosted deep-learning platform. Every /api/v1 request is signed (docs/signing.md); "
        "the page at /api/v1/docs signs its requests with an access key you enter there.",
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url=None,  # kiln.api.docs serves the page, from the package and able to sign requests
        redoc_url=None,
        lifespan=lifespan,
        # Operation ids are the route functions' names (get_job, open_upload): the links between operations in the
        # OpenAPI schema (kiln.api.responses.links) refer to them.
        generate_unique_id_function=_operation_id,
    )
    install_error_handlers(app)
    app.add_middleware(NulGuard)  # inside the signature check: a NUL is refused once the caller is known
    app.add_middleware(SignatureMiddleware)
    app.add_middleware(RequestMetricsMiddleware)  # outermost: times refused requests too
    mounted: list[tuple[str, APIRouter]] = [("", system.health), ("", prometheus_router), ("", docs.router)]
    modules = (
        system,
        session,
        blobs,
        datasets,
        models,
        jobs,
        studies,
        services,
        notebooks,
        notifications,
        pipelines,
        scheduling,
        nodes,
        runtimes,
        metrics,
        runs,
        usage,
        admin,
    )
    api_routers = [module.router for module in modules] + [studies.job_router] + list(tenancy.routers)
    mounted += [(API_PREFIX, router) for router in api_routers]
    for prefix, router in mounted:
        app.include_router(router, prefix=prefix)
    app.state.route_methods = _route_methods(app, mounted)
    app.webhooks.include_router(notifications.webhooks)  # what Kiln POSTs to subscribers (OpenAPI's webhooks)
    # JupyterLab of each notebook, HTTP and WebSocket, behind Kiln's authentication (kiln.api.notebook_proxy); and
    # MLflow's tracking protocol, for MLflow's client (kiln.api.mlflow), authenticated by kiln.api.auth. First in
    # the routing table: their prefixes are their own, and a log-batch then does not try every API route first
    # (a tenth of a small request's time).
    # The web console answers what no route does (kiln.api.console): a route added later still wins. It answers
    # MLflow's own UI address too (``/mlflow/#/experiments/E/runs/R``, which MLflow's client prints for every run:
    # the fragment never reaches a server), and the console takes the reader to the page of that run.
    console = ConsoleFallback(console_dir(settings), app.router.not_found)
    app.router.routes[0:0] = [
        Mount("/notebooks", NotebookProxy(), name="notebook-proxy"),
        *(Route(path, console.page, methods=["GET", "HEAD"], name=f"mlflow-ui{path}") for path in MLFLOW_UI_PATHS),
        Mount("/mlflow", create_mlflow_app(lambda: app.state.platform), name="mlflow"),
    ]
    app.router.default = console
    return app


def _route_methods(app: FastAPI, mounted: list[tuple[str, APIRouter]]) -> RouteMethods:
    """(path regex, methods) of every route, for the Allow header of a 405; and a check that no two route
    functions share a name (their OpenAPI operation id)."""
    own = [route for route in app.router.routes if isinstance(route, Route)]  # the OpenAPI document and the docs
    table: RouteMethods = [(route.path_regex, frozenset(route.methods or ())) for route in own]
    names: list[str] = []
    for prefix, router in mounted:
        for route in router.routes:
            if isinstance(route, APIRoute):
                table.append((compile_path(prefix + route.path)[0], frozenset(route.methods or ())))
                names.append(route.name)
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise RuntimeError(f"route functions share a name (their OpenAPI operation id): {duplicates}")
    return table


def _operation_id(route: APIRoute) -> str:
    return route.name

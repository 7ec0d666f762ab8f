"""The FastAPI application."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from anyio import to_thread
from fastapi import FastAPI

from kiln import __version__
from kiln.api.auth import SignatureMiddleware
from kiln.api.errors import install_error_handlers
from kiln.api.prometheus import RequestMetricsMiddleware
from kiln.api.prometheus import router as prometheus_router
from kiln.api.routers import blobs, datasets, jobs, metrics, runtimes, scheduling, system, tenancy
from kiln.platform import Platform
from kiln.settings import Settings

log = logging.getLogger("kiln.server")
API_PREFIX = "/api/v1"


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        platform = Platform(settings)
        app.state.platform = platform
        creds = platform.start()
        if creds is not None:
            log.warning(
                "first start: admin credentials written to %s (source it: `set -a; . %s; set +a`)",
                settings.home / "admin.env",
                settings.home / "admin.env",
            )
        # Everything loaded so far lives as long as the server: take it out of the collector's sight, so that
        # the garbage collections that requests trigger scan only what requests allocate.
        gc.collect()
        gc.freeze()
        # Request work in threads is short (a query, a nonce insert): a few threads do it with less contention
        # and far better tail latency than many. Nothing waits in a thread (log following is async).
        to_thread.current_default_thread_limiter().total_tokens = settings.worker_threads
        log.info("Kiln %s ready on %s (home %s)", __version__, settings.endpoint, settings.home)
        try:
            yield
        finally:
            platform.close()

    app = FastAPI(
        title="Kiln",
        version=__version__,
        description="Self-hosted deep-learning platform. Every /api/v1 request is signed (docs/signing.md).",
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url=f"{API_PREFIX}/docs",
        redoc_url=None,
        lifespan=lifespan,
    )
    install_error_handlers(app)
    app.add_middleware(SignatureMiddleware)
    app.add_middleware(RequestMetricsMiddleware)  # outermost: times refused requests too
    app.include_router(system.health)
    app.include_router(prometheus_router)
    for module in (system, blobs, datasets, jobs, scheduling, runtimes, metrics):
        app.include_router(module.router, prefix=API_PREFIX)
    for router in tenancy.routers:
        app.include_router(router, prefix=API_PREFIX)
    return app

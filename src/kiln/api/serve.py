"""Run the API server (what ``kiln server`` and ``python -m kiln.api.serve`` do)."""

from __future__ import annotations

import logging

import uvicorn

from kiln.api.app import create_app
from kiln.settings import Settings


def configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("alembic", "httpx", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def serve(settings: Settings | None = None, log_level: str = "INFO") -> None:
    settings = settings or Settings()
    configure_logging(log_level)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=5,
    )


if __name__ == "__main__":
    serve()

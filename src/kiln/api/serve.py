"""Run the API server (what ``kiln server`` and ``python -m kiln.api.serve`` do).

The order matters to someone whose start fails: first the listening socket (a port in use is said before
anything is written into ``$KILN_HOME``), then the platform (home, lock, database, backend, admin key), and only
then uvicorn, which says "ready" once it accepts connections. A failure is one line (``StartupError``); with
``debug`` its traceback comes first.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import socket
import sys
import traceback
from typing import Any

import uvicorn
from pydantic import ValidationError

from kiln.api.app import create_app, start_platform
from kiln.api.console import NOT_BUILT, console_built, console_dir
from kiln.api.startup import EXIT_INTERRUPTED, EXIT_USAGE, StartupError, explain, listen_socket, settings_problems
from kiln.domain import limits
from kiln.platform import Platform
from kiln.settings import Settings
from kiln.version import full_version

log = logging.getLogger("kiln.server")


def configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("alembic", "httpx", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class _Server(uvicorn.Server):
    """uvicorn, saying "ready" once its listener accepts connections (not when the application has started)."""

    def __init__(self, config: uvicorn.Config, settings: Settings) -> None:
        super().__init__(config)
        self.settings = settings

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            log.info("Kiln %s ready on %s (home %s)", full_version(), self.settings.endpoint, self.settings.home)
            if not console_built(console_dir(self.settings)):
                log.warning("%s: serving the API only (no web console at %s/)", NOT_BUILT, self.settings.endpoint)


def proxy_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's handling of X-Forwarded-For and X-Forwarded-Proto: only from KILN_TRUSTED_PROXIES. uvicorn's own
    default trusts any peer on loopback, so that a job on this machine could set the client address the audit log
    records."""
    if not settings.trusted_proxies:
        return {"proxy_headers": False}
    return {"proxy_headers": True, "forwarded_allow_ips": list(settings.trusted_proxies)}


def serve(settings: Settings, log_level: str = "INFO", debug: bool = False) -> None:
    """Start and serve until stopped. Raises ``StartupError`` (one line; the traceback is printed first when
    ``debug``) when the server cannot start."""
    configure_logging(log_level)
    # kill -USR1 <pid>: every thread's stack into the log (stderr), for a server that seems stuck (what its
    # reconciler waits for, say); it goes on running.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # The first line of every server's log: which release and commit wrote what follows (migrations included).
    log.info("Kiln %s starting (home %s, pid %d)", full_version(), settings.home, os.getpid())
    platform: Platform | None = None
    try:
        sock = listen_socket(settings.host, settings.port)
        try:
            platform = start_platform(settings)
        except BaseException:
            sock.close()
            raise
    except KeyboardInterrupt:
        if platform is not None:
            platform.close()
        raise StartupError("interrupted while starting", EXIT_INTERRUPTED) from None
    except Exception as exc:
        if debug:
            traceback.print_exception(exc)
        raise explain(exc, settings) from exc
    config = uvicorn.Config(
        create_app(settings, platform),
        host=settings.host,
        port=settings.port,
        log_level=log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=5,
        h11_max_incomplete_event_size=limits.MAX_REQUEST_HEAD_BYTES,
        **proxy_options(settings),
    )
    server = _Server(config, settings)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        if not server.started:  # the application's lifespan, which closes the platform, never ran
            platform.close()
    if not server.started:
        raise StartupError("the server could not start (see the log above)")


def main() -> None:
    """``python -m kiln.api.serve``: the server with its settings from the environment only."""
    try:
        try:
            settings = Settings()
        except ValidationError as exc:
            raise StartupError(f"invalid settings: {settings_problems(exc)}", EXIT_USAGE) from None
        serve(settings)
    except StartupError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:  # stopped with Ctrl-C: uvicorn has shut down cleanly and passed the signal on
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()
